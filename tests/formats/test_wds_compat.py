"""Existing WebDataset tars (no fastfeed index) read with webdataset's keys and decoders.

Every comparison runs webdataset itself on the same files in the same test.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastfeed.decode.fields import decode_field, decode_fields, is_image
from fastfeed.errors import ConfigError, SampleError, ShardError
from fastfeed.formats.tar import TarShardReader
from fastfeed.formats.naming import split_key
from fastfeed.packed.foreign import open_index, scan_index
from fastfeed.storage.shardlist import expand_braces, expand_shards
from fastfeed.packed.index import DatasetIndex
from fastfeed.storage.remote import open_shard

wds = pytest.importorskip("webdataset")

TESTDATA_FILES = ["compressed.tar", "mpdata.tar", "sample.tgz", "tendata.tar", "testgz.tar"]


def fastfeed_samples(idx: DatasetIndex, **open_kw: Any) -> list[dict]:
    """Every sample of the index, read by (offset, size) the way the loader reads them."""
    out = []
    starts = idx.shard_starts
    for s, info in enumerate(idx.shards):
        src = open_shard(idx.shard_path(s), size=info.bytes, **open_kw)
        reader = TarShardReader(src, name=idx.shard_path(s))
        for i in range(starts[s], starts[s + 1]):
            off, span = idx.offsets[i]
            out.append(reader.read(int(off), int(span)))
        reader.close()
        if not isinstance(src, str):
            src.close()
    return out


def webdataset_samples(urls: list[str], decode: bool = False) -> list[dict]:
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if decode:
        ds = ds.decode()
    return [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in ds]


@pytest.fixture(scope="module")
def testdata(shared_data: Path) -> Path:
    d = shared_data / "webdataset-testdata"
    if not d.is_dir():
        pytest.skip(f"{d} not present")
    return d


# --------------------------------------------------------------------- the shared test data
@pytest.mark.parametrize("name", TESTDATA_FILES)
def test_every_testdata_file_matches_webdataset(testdata: Path, name: str) -> None:
    path = str(testdata / name)
    idx = scan_index(path)
    ours = fastfeed_samples(idx)
    theirs = webdataset_samples([path])
    assert idx.num_samples == len(theirs) > 0
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
    assert ours == theirs  # same fields, same bytes
    assert idx.format == "tar" and idx.options["source"] == "webdataset"
    # decoded non-image fields equal webdataset's default decoding
    for mine, ref in zip(ours, webdataset_samples([path], decode=True)):
        for ext, value in decode_fields(mine).items():
            if ext.startswith("__") or is_image(ext):
                continue
            if isinstance(value, list):  # .ten: a list of arrays
                assert all(np.array_equal(a, b) for a, b in zip(value, ref[ext]))
            else:
                assert value == ref[ext], (mine["__key__"], ext)


def test_known_values(testdata: Path) -> None:
    first = fastfeed_samples(scan_index(str(testdata / "compressed.tar")))[0]
    assert first["__key__"] == "compressed/0001"
    assert decode_field("txt.gz", first["txt.gz"]) == "hello\n"

    testgz = scan_index(str(testdata / "testgz.tar"))
    assert testgz.num_samples == 1000
    assert decode_fields(fastfeed_samples(testgz)[0])["txt.gz"] == ", or more info on the item."

    three = scan_index([str(testdata / n) for n in ("mpdata.tar", "tendata.tar", "compressed.tar")])
    assert three.num_samples == 203 and len(three.shards) == 3

    from PIL import Image

    digits = fastfeed_samples(scan_index(str(testdata / "sample.tgz")))
    assert len(digits) == 90
    for s in digits:
        assert Image.open(io.BytesIO(s["png"])).size == (28, 28)
        assert 0 <= decode_field("cls", s["cls"]) <= 9


def test_folder_and_cache_dir(testdata: Path, tmp_path: Path) -> None:
    idx = open_index(str(testdata), cache_dir=tmp_path / "cache")
    assert [s.name for s in idx.shards] == sorted(TESTDATA_FILES)
    assert idx.root == str(testdata)
    assert idx.num_samples == 3 + 100 + 90 + 100 + 1000
    ours = fastfeed_samples(idx, cache_dir=tmp_path / "cache")
    assert [s["__key__"] for s in ours] == [
        s["__key__"] for s in webdataset_samples([str(testdata / n) for n in sorted(TESTDATA_FILES)])
    ]
    # the .tgz was decompressed once into the cache, and reused
    assert len(list((tmp_path / "cache").glob("*-sample.tar"))) == 1


# --------------------------------------------------------------------- key rules
def _add(tf: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


EDGE_NAMES = [
    ("dir", None, tarfile.DIRTYPE),
    ("dir/0001.jpg", b"jpeg-1", tarfile.REGTYPE),
    ("dir/0001.seg.PNG", b"png-1", tarfile.REGTYPE),
    ("dir/0001.json", b'{"a": 1}', tarfile.REGTYPE),
    ("dir/README", b"no extension", tarfile.REGTYPE),
    ("dir.v2/0002.tar.gz.txt", b"multiple dots", tarfile.REGTYPE),
    ("dir.v2/0002.cls", b"4", tarfile.REGTYPE),
    ("link.jpg", None, tarfile.SYMTYPE),
    ("__meta__/info.json", b"{}", tarfile.REGTYPE),
    ("__index__", b"x", tarfile.REGTYPE),
    ("a/b/.hidden.txt", b"hidden", tarfile.REGTYPE),
    ("x" * 120 + "/long.name.txt", b"pax or gnu long name", tarfile.REGTYPE),
    ("0003.txt", b"three", tarfile.REGTYPE),
    ("0003.cls", b"3", tarfile.REGTYPE),
]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_key_rules_match_webdataset(tmp_path: Path, fmt: int) -> None:
    path = tmp_path / "edge.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data, kind in EDGE_NAMES:
            _add(tf, name, data or b"", kind)
    idx = scan_index(str(path))
    theirs = webdataset_samples([str(path)])
    # the one deliberate difference: webdataset makes the hidden file a sample keyed "a/b/"
    assert [s["__key__"] for s in theirs if s["__key__"].endswith("/")] == ["a/b/"]
    theirs = [s for s in theirs if s["__key__"] != "a/b/"]
    assert idx.num_samples == len(theirs)
    assert idx.skipped == ({"path": f"{path}:a/b/.hidden.txt", "reason": "hidden file (its base name starts with a dot)"},)
    ours = fastfeed_samples(idx)
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
    assert ours == theirs


def test_split_key_matches_webdataset() -> None:
    from webdataset.tariterators import base_plus_ext

    names = [n for n, _, _ in EDGE_NAMES] + [
        "a.b/c", "a//.x", "./x.jpg", ".x.jpg", "a/.b/c.d", "k.", "a/b.c/.d.e", "A/B.JPG", "x/y.z/w.q",
    ]
    for name in names:
        ref = base_plus_ext(name)
        want = None if ref == (None, None) else (ref[0], ref[1].lower())
        if name.startswith("__") and name.split("/", 1)[0].endswith("__"):
            want = None  # skipped by webdataset's meta rule before keys are made
        assert split_key(name) == want, name


def test_shards_with_brace_pattern_and_gzip(tmp_path: Path) -> None:
    for i in range(4):
        suffix = ".tar.gz" if i % 2 else ".tar"
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tf:
            for j in range(5):
                _add(tf, f"s{i}/{j:03d}.txt", f"{i}-{j}".encode())
                _add(tf, f"s{i}/{j:03d}.cls", str(j).encode())
        data = raw.getvalue()
        (tmp_path / f"shard-{i:06d}{suffix}").write_bytes(gzip.compress(data) if i % 2 else data)
    pattern = str(tmp_path / "shard-{000000..000003}.tar") + "::" + str(tmp_path / "nothing-{0..0}.tgz")
    with pytest.raises(ShardError, match="shard is missing"):
        scan_index(pattern)  # odd shards are .tar.gz, so the .tar names of 1 and 3 do not exist
    files = [str(tmp_path / f"shard-{i:06d}{'.tar.gz' if i % 2 else '.tar'}") for i in range(4)]
    idx = scan_index(files)
    assert idx.num_samples == 20 and idx.fields == ("cls", "txt")
    assert [s.bytes for s in idx.shards] == [Path(f).stat().st_size for f in files]
    ours = fastfeed_samples(idx)
    assert ours == webdataset_samples(files)
    cached = fastfeed_samples(idx, cache_dir=tmp_path / "c")
    assert cached == ours


def test_expand_braces_and_shards(tmp_path: Path) -> None:
    assert expand_braces("a-{1..3}") == ["a-1", "a-2", "a-3"]
    assert expand_braces("{09..11}") == ["09", "10", "11"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("x{a..c}y") == ["xay", "xby", "xcy"]
    assert expand_braces("{a,b}{1,2}") == ["a1", "a2", "b1", "b2"]
    assert expand_braces("lit{x}eral{") == ["lit{x}eral{"]
    assert expand_braces("{0..4..2}") == ["0", "2", "4"]
    for n in ("b.tar", "a.tgz", "c.tar.gz", "notes.txt"):
        (tmp_path / n).write_bytes(b"")
    assert expand_shards(str(tmp_path)) == [str(tmp_path / n) for n in ("a.tgz", "b.tar", "c.tar.gz")]
    assert expand_shards(str(tmp_path / "*.tar")) == [str(tmp_path / "b.tar")]
    with pytest.raises(ConfigError, match="pipe: URLs run shell commands"):
        expand_shards("pipe:curl -s http://x/a.tar")
    with pytest.raises(ConfigError, match="no shards found"):
        scan_index(str(tmp_path / "empty-*.tar"))


# --------------------------------------------------------------------- damaged shards
def _tar_bytes(n: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for j in range(n):
            _add(tf, f"{j:03d}.txt", b"x" * 700)
    return raw.getvalue()


def test_damaged_tars_are_never_silently_short(tmp_path: Path) -> None:
    data = _tar_bytes(10)
    truncated = tmp_path / "trunc.tar"
    truncated.write_bytes(data[: 5 * 1536 + 900])  # inside the 6th member's data
    with pytest.raises(ShardError, match="runs past the end of the file"):
        scan_index(str(truncated))
    idx = scan_index(str(truncated), on_error="skip")
    assert idx.num_samples == 5 and "truncated" in idx.skipped[0]["reason"]
    assert [s["__key__"] for s in fastfeed_samples(idx)] == [f"{j:03d}" for j in range(5)]

    corrupt = bytearray(data)
    corrupt[4 * 1536 + 100: 4 * 1536 + 140] = b"\xff" * 40  # break the 5th header (checksum)
    (tmp_path / "corrupt.tar").write_bytes(bytes(corrupt))
    with pytest.raises(ShardError, match="invalid tar header at offset 6144"):
        scan_index(str(tmp_path / "corrupt.tar"))

    dup = io.BytesIO()
    with tarfile.open(fileobj=dup, mode="w") as tf:
        _add(tf, "k.txt", b"1")
        _add(tf, "k.TXT", b"2")
    (tmp_path / "dup.tar").write_bytes(dup.getvalue())
    with pytest.raises(ShardError, match="repeats field 'txt' of sample 'k'"):
        scan_index(str(tmp_path / "dup.tar"))
    (tmp_path / "text.tar").write_bytes(b"this is not a tar file at all" * 40)
    with pytest.raises(ShardError, match="not a tar archive|invalid tar header"):
        scan_index(str(tmp_path / "text.tar"))


# --------------------------------------------------------------------- S3
@pytest.mark.s3
def test_remote_index_less_shards(testdata: Path, tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    client = s3_server.client()
    for name in TESTDATA_FILES:
        client.upload_file(str(testdata / name), s3_bucket, f"wds/{name}")
    so = s3_server.storage_options
    local = scan_index(str(testdata))
    for cache in (None, tmp_path / "cache"):
        idx = open_index(f"s3://{s3_bucket}/wds/", storage_options=so, cache_dir=cache)
        assert idx.root == f"s3://{s3_bucket}/wds"
        assert [s.name for s in idx.shards] == [s.name for s in local.shards]
        assert [s.bytes for s in idx.shards] == [s.bytes for s in local.shards]
        assert np.array_equal(idx.offsets, local.offsets)
        assert fastfeed_samples(idx, storage_options=so, cache_dir=cache) == fastfeed_samples(local)
    pattern = f"s3://{s3_bucket}/wds/{{mpdata,tendata,compressed}}.tar"
    assert scan_index(pattern, storage_options=so).num_samples == 203


# --------------------------------------------------------------------- field decoding
def test_field_decoders() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = io.BytesIO()
    np.save(buf, arr)
    npz = io.BytesIO()
    np.savez(npz, a=arr, b=np.ones(2))
    assert np.array_equal(decode_field("npy", buf.getvalue()), arr)
    assert np.array_equal(decode_field("npy.gz", gzip.compress(buf.getvalue())), arr)
    assert set(decode_field("npz", npz.getvalue())) == {"a", "b"}
    assert decode_field("json", json.dumps({"a": [1, 2]}).encode()) == {"a": [1, 2]}
    assert decode_field("TXT", "héllo".encode()) == "héllo"
    assert decode_field("cls", b"12\n") == 12 and decode_field("index", b"7") == 7
    assert decode_field("cls2", b"-3") == -3
    assert decode_field("json.gz", gzip.compress(b"[1]")) == [1]
    assert decode_field("gz", gzip.compress(b"raw")) == b"raw"
    assert decode_field("jpg.gz", gzip.compress(b"\xff\xd8")) == b"\xff\xd8"
    assert decode_field("flac", b"fLaC") == b"fLaC"
    msgpack = pytest.importorskip("msgpack")
    assert decode_field("msgpack", msgpack.packb({"k": [1, "v"]})) == {"k": [1, "v"]}


def test_pickles_are_never_unpickled() -> None:
    class Boom:
        def __reduce__(self) -> tuple:
            return (exec, ("raise SystemExit('unpickled!')",))

    evil = pickle.dumps(Boom())
    for ext in ("pyd", "pickle", "pkl", "pth", "pyd.gz"):
        data = gzip.compress(evil) if ext.endswith(".gz") else evil
        assert decode_field(ext, data) == evil
    objects = io.BytesIO()
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SampleError, match="field 'npy' does not decode"):
        decode_field("npy", objects.getvalue())


@pytest.mark.parametrize(
    "ext,data",
    [("cls", b"cat"), ("txt", b"\xff\xfe\xfa"), ("json", b"{nope"), ("txt.gz", b"not gzip"),
     ("txt.gz", gzip.compress(b"hello")[:-6]), ("ten", b"~TenBin~\x00"), ("npy", b"\x93NUMPY junk")],
)
def test_bad_fields_raise_sample_error_naming_the_field(ext: str, data: bytes) -> None:
    with pytest.raises(SampleError, match=f"field '{ext}'"):
        decode_field(ext, data)


# --------------------------------------------------------------------- end to end: fastfeed.loader
@pytest.mark.parametrize("drop_last", [False, True])
def test_loader_over_index_less_tars_is_exactly_once(testdata: Path, drop_last: bool) -> None:
    import fastfeed

    files = [str(testdata / n) for n in ("sample.tgz", "compressed.tar", "mpdata.tar")]
    all_keys = [s["__key__"] for s in webdataset_samples(files)]
    per_rank = []
    for rank in range(3):
        dl = fastfeed.loader(files, batch_size=8, rank=rank, world_size=3, num_workers=rank % 2, seed=5,
                             drop_last=drop_last, decode=None)
        dl.set_epoch(1)
        per_rank.append([list(b["__key__"]) for b in dl])
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps on every rank
    got = [k for batches in per_rank for b in batches for k in b]
    if drop_last:
        assert len(set(got)) == len(got) and set(got) <= set(all_keys)
        assert len(got) == (len(all_keys) // 3 // 8) * 8 * 3
    else:
        assert set(got) == set(all_keys) and len(got) - len(all_keys) <= 2  # at most world_size - 1 repeats


def test_loader_decodes_webdataset_fields(testdata: Path, tmp_path: Path) -> None:
    import fastfeed

    dl = fastfeed.loader(str(testdata / "sample.tgz"), batch_size=30, num_workers=1, rank=0, world_size=1,
                         cache_dir=tmp_path / "cache")
    batches = list(dl)
    assert [tuple(b["image"].shape) for b in batches] == [(30, 3, 28, 28)] * 3
    labels = {k: int(v) for b in batches for k, v in zip(b["__key__"], b["label"])}
    ref = {s["__key__"]: s["cls"] for s in webdataset_samples([str(testdata / "sample.tgz")], decode=True)}
    assert labels == ref
    text = fastfeed.loader(str(testdata / "compressed.tar"), batch_size=3, shuffle=False, num_workers=0,
                           rank=0, world_size=1)
    assert next(iter(text))["txt.gz"][0] == "hello\n"


def test_paths_that_do_not_exist_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file or folder"):
        open_index(str(tmp_path / "imagenet-ff"))
    with pytest.raises(ShardError, match="shard is missing"):
        scan_index(str(tmp_path / "shard-000.tar"))


@pytest.mark.s3
def test_remote_prefix_that_does_not_exist(s3_server: Any, s3_bucket: str) -> None:
    with pytest.raises(ConfigError, match="nothing there"):
        open_index(f"s3://{s3_bucket}/nope", storage_options=s3_server.storage_options)


def test_unfinished_pack_is_not_mistaken_for_webdataset(tmp_path: Path) -> None:
    from fastfeed.errors import IndexMismatchError
    from fastfeed.packed.layout import RESUME_DIR

    (tmp_path / "shard-000000.tar").write_bytes(_tar_bytes(3))
    (tmp_path / RESUME_DIR).mkdir()
    with pytest.raises(IndexMismatchError, match="did not finish"):
        open_index(str(tmp_path))
