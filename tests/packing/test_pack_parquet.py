"""``fastfeed pack`` of parquet files and HF datasets, end to end: fields, keys, loader, resume, errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import fastfeed
from _pack_data import tree_digest
from fastfeed.cli import main
from fastfeed.errors import BadFileError, ConfigError, DuplicateKeyError, SourceError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packing.plan import plan_pack
from fastfeed.packing.write import write_shard
from tools.synth import make_jpeg

_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _rows(n: int, start: int = 0) -> tuple[dict[str, list], list[bytes]]:
    rng = np.random.default_rng(start)
    jpegs = [make_jpeg(rng, (16 + (i % 5), 12)) for i in range(n)]
    return {
        "id": [f"doc{start + i:03d}" for i in range(n)],
        "caption": [f"a photo of thing {start + i}" for i in range(n)],
        "image": [{"bytes": j, "path": f"{start + i}.jpg"} for i, j in enumerate(jpegs)],
        "emb": [[float(start + i), 0.5] for i in range(n)],
        "label": [(start + i) % 3 for i in range(n)],
    }, jpegs


def _write(path: Path, n: int, start: int, row_group: int = 3) -> list[bytes]:
    cols, jpegs = _rows(n, start)
    table = pa.table({**cols, "image": pa.array(cols["image"], _IMAGE),
                      "emb": pa.array(cols["emb"], pa.list_(pa.float32()))})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group)
    return jpegs


@pytest.fixture()
def corpus(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """Two parquet files of 7 and 5 rows, row groups of 3 (units 3, 3, 1, 3, 2)."""
    src = tmp_path / "corpus"
    jpegs = _write(src / "part-0.parquet", 7, 0) + _write(src / "part-1.parquet", 5, 7)
    return src, jpegs


def _stored(dst: Path) -> list[dict]:
    """Every sample of a packed dataset as the loader yields it, in index (stored) order."""
    return [dict(zip(b, vals)) for b in fastfeed.loader(dst, batch_size=4, shuffle=False, decode=None, num_workers=0)
            for vals in zip(*b.values())]


def _all(dst: Path) -> list[dict]:
    """:func:`_stored`, sorted by key (row numbers and the ``id`` column sort in row order)."""
    return sorted(_stored(dst), key=lambda r: r["__key__"])


def test_folder_of_parquet_packs_every_row_once(corpus, tmp_path: Path) -> None:
    src, jpegs = corpus
    idx = fastfeed.pack(src, tmp_path / "ff", samples_per_shard=4, jpeg_restarts=False)  # source bytes kept
    assert idx.input == "parquet" and idx.num_samples == 12 and len(idx.shards) == 4
    assert set(idx.fields) == {"caption.txt", "emb.npy", "id.txt", "image.jpg", "label.json"}
    rows = _all(tmp_path / "ff")
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(12)]  # every row once, row-number keys
    assert [r["image.jpg"] for r in rows] == jpegs
    assert [r["caption.txt"] for r in rows] == [f"a photo of thing {i}".encode() for i in range(12)]
    emb = np.load(io.BytesIO(rows[9]["emb.npy"]), allow_pickle=False)
    assert emb.dtype == np.float32 and emb.tolist() == [9.0, 0.5]
    stored = [int(r["__key__"]) for r in _stored(tmp_path / "ff")]
    assert idx.labels is not None and idx.labels.tolist() == [i % 3 for i in stored]
    # shuffle orders whole row groups (units 0-2, 3-5, 6, 7-9, 10-11); rows inside one keep their order
    groups = [(0, 1, 2), (3, 4, 5), (6,), (7, 8, 9), (10, 11)]
    assert stored != list(range(12)) and sorted(tuple(r) for r in _runs(stored, groups)) == groups
    fastfeed.pack(src, tmp_path / "ordered", samples_per_shard=4, shuffle=False)
    assert [int(r["__key__"]) for r in _stored(tmp_path / "ordered")] == list(range(12))


def _runs(stored: list[int], groups: list[tuple[int, ...]]) -> list[list[int]]:
    """``stored`` cut where a row group starts."""
    starts = {g[0] for g in groups}
    out: list[list[int]] = []
    for k in stored:
        if k in starts or not out:
            out.append([])
        out[-1].append(k)
    return out


def test_columns_key_glob_and_cli(corpus, tmp_path: Path, capsys) -> None:
    src, jpegs = corpus
    rc = main(["pack", str(src / "part-*.parquet"), str(tmp_path / "ff"), "--no-jpeg-restarts", "--columns", "image=jpg,caption=txt",
               "--key", "id", "--samples-per-shard", "5"])
    out = capsys.readouterr().out
    assert rc == 0 and "packed 12 samples" in out and "(input: parquet)" in out
    idx = DatasetIndex.load(tmp_path / "ff")
    assert idx.fields == ("jpg", "txt") and idx.options["columns"] == "image=jpg,caption=txt"
    rows = _all(tmp_path / "ff")
    assert [r["__key__"] for r in rows] == [f"doc{i:03d}" for i in range(12)]
    assert [r["jpg"] for r in rows] == jpegs and rows[2]["txt"] == b"a photo of thing 2"


def test_single_file_input_flag_and_lmdb(corpus, tmp_path: Path) -> None:
    src, jpegs = corpus
    idx = fastfeed.pack(src / "part-1.parquet", tmp_path / "ff", input="parquet", format="lmdb", jpeg_restarts=False)
    assert idx.format == "lmdb" and idx.num_samples == 5
    assert [r["image.jpg"] for r in _all(tmp_path / "ff")] == jpegs[7:]


def test_hf_dataset_object_and_save_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    cols, jpegs = _rows(6)
    features = datasets.Features({"id": datasets.Value("string"), "caption": datasets.Value("string"),
                                  "image": datasets.Image(), "emb": datasets.Sequence(datasets.Value("float32")),
                                  "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(cols, features=features)
    idx = fastfeed.pack(ds, tmp_path / "a", samples_per_shard=4, jpeg_restarts=False)
    assert idx.input == "hf" and idx.num_samples == 6
    rows = _all(tmp_path / "a")
    assert [r["image.jpg"] for r in rows] == jpegs and rows[1]["caption.txt"] == b"a photo of thing 1"
    ds.save_to_disk(str(tmp_path / "saved"))
    assert main(["pack", str(tmp_path / "saved"), str(tmp_path / "b"), "--input", "hf", "--key", "id", "--no-jpeg-restarts"]) == 0
    rows = _all(tmp_path / "b")
    assert [r["__key__"] for r in rows] == [f"doc{i:03d}" for i in range(6)]
    assert [r["image.jpg"] for r in rows] == jpegs
    with pytest.raises(ConfigError, match="not a folder written by Dataset.save_to_disk"):
        fastfeed.pack(tmp_path / "a", tmp_path / "c", input="hf")


def test_deterministic_and_parallel(corpus, tmp_path: Path) -> None:
    src, _ = corpus
    fastfeed.pack(src, tmp_path / "a", samples_per_shard=4)
    fastfeed.pack(src, tmp_path / "b", samples_per_shard=4, workers=2)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")


def test_rerun_after_a_crash_reuses_written_shards(corpus, tmp_path: Path) -> None:
    src, _ = corpus
    dst = tmp_path / "ff"
    plan = plan_pack(src, dst, samples_per_shard=4)
    first = write_shard(plan, 0)  # the run dies after one shard: no index.json
    assert not (dst / "index.json").exists()
    mtime = (dst / first.name).stat().st_mtime_ns
    assert write_shard(plan_pack(src, dst, samples_per_shard=4), 0).reused
    idx = fastfeed.pack(src, dst, samples_per_shard=4)
    assert idx.num_samples == 12 and (dst / first.name).stat().st_mtime_ns == mtime
    fastfeed.pack(src, tmp_path / "clean", samples_per_shard=4)
    assert tree_digest(dst) == tree_digest(tmp_path / "clean")
    assert fastfeed.pack(src, dst, samples_per_shard=4).num_samples == 12  # complete: nothing to do


def test_bad_input_errors(corpus, tmp_path: Path) -> None:
    src, _ = corpus
    with pytest.raises(ConfigError, match=r"column.*'nope'.*the columns are"):
        fastfeed.pack(src, tmp_path / "a", columns="nope=txt")
    with pytest.raises(ConfigError, match="--columns, --key.*not input='files'"):
        fastfeed.pack(src, tmp_path / "a", input="files", key="id")
    bad = src / "part-2.parquet"
    bad.write_bytes((src / "part-0.parquet").read_bytes()[:200])
    with pytest.raises(BadFileError, match=r"part-2.parquet: not a readable parquet file.*truncated"):
        fastfeed.pack(src, tmp_path / "a")
    idx = fastfeed.pack(src, tmp_path / "b", on_error="skip")
    assert idx.num_samples == 12 and idx.skipped[0]["path"] == "part-2.parquet"
    assert "part-2.parquet" in (tmp_path / "b" / "skipped.txt").read_text()


def test_bad_rows_follow_on_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "src" / "rows.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"k": ["a", "b", "a", "c"],
                             "pic": [make_jpeg(rng, (8, 8)), b"not an image", make_jpeg(rng, (8, 8)),
                                     make_jpeg(rng, (9, 8))]}), path, row_group_size=2)
    with pytest.raises(BadFileError, match=r"rows.parquet: row group 0, row 1 \(key '000000001'\), column 'pic'"):
        fastfeed.pack(path, tmp_path / "a", columns={"pic": "jpg"})
    with pytest.raises(DuplicateKeyError, match="duplicate key 'a'"):
        fastfeed.pack(path, tmp_path / "b", key="k")
    idx = fastfeed.pack(path, tmp_path / "c", columns="pic=jpg", key="k", on_error="skip")
    assert [r["__key__"] for r in _all(tmp_path / "c")] == ["a", "c"]  # bad image and later duplicate left out
    assert sorted(s["key"] for s in idx.skipped) == ["a", "b"]
    assert json.loads((tmp_path / "c" / "index.json").read_text())["num_skipped"] == 2


def test_damaged_row_group_while_writing(corpus, tmp_path: Path) -> None:
    src, _ = corpus
    path = src / "part-0.parquet"
    data = bytearray(path.read_bytes())
    col = pq.ParquetFile(path).metadata.row_group(1).column(1)  # caption of rows 3-5: footer intact
    start = col.data_page_offset
    data[start:start + col.total_compressed_size] = b"\x00" * col.total_compressed_size
    path.write_bytes(bytes(data))
    with pytest.raises(BadFileError, match=r"part-0.parquet: row group 1, row 3: cannot read the row group"):
        fastfeed.pack(src, tmp_path / "a", shuffle=False)
    assert not (tmp_path / "a" / "index.json").exists()
    idx = fastfeed.pack(src, tmp_path / "b", on_error="skip", samples_per_shard=4)
    assert idx.num_samples == 9 and "row group 1" in idx.skipped[0]["path"]
    assert sorted(int(r["__key__"]) for r in _all(tmp_path / "b")) == [0, 1, 2, 6, 7, 8, 9, 10, 11]


def test_length_of_a_table_field(corpus, tmp_path: Path) -> None:
    src, _ = corpus
    idx = fastfeed.pack(src, tmp_path / "a", length="caption", shuffle=False)
    assert idx.lengths_field == "caption" and idx.lengths.tolist() == [5] * 12  # "a photo of thing N"
    idx = fastfeed.pack(src, tmp_path / "b", length="emb", shuffle=False)
    assert idx.lengths.tolist() == [2] * 12  # the size of the npy vector
    with pytest.raises(ConfigError, match=r"--length nope: .*corpus has no column 'nope'; the columns are: caption"):
        fastfeed.pack(src, tmp_path / "c", length="nope")
    with pytest.raises(SourceError, match=r"--length image: row '0000000\d\d' has no usable length "
                                          r"\(UnicodeDecodeError.*or pass --on-error skip"):
        fastfeed.pack(src, tmp_path / "d", length="image")  # JPEG bytes are no length


def test_max_side_resizes_table_images(corpus, tmp_path: Path) -> None:
    from PIL import Image

    src, _ = corpus
    fastfeed.pack(src, tmp_path / "ff", max_side=8, columns="image=jpg", shuffle=False)
    sizes = [Image.open(io.BytesIO(r["jpg"])).size for r in _all(tmp_path / "ff")]
    assert len(sizes) == 12 and all(max(s) == 8 for s in sizes)


def test_sigkill_mid_pack_then_rerun_is_byte_identical(tmp_path: Path) -> None:
    import os

    from test_pack_crash import _kill_mid_shard

    src = tmp_path / "src" / "big.parquet"  # 40 MB in rows of 1 MB: enough to use the process pool
    src.parent.mkdir()
    pq.write_table(pa.table({"blob": [os.urandom(1_000_000) for _ in range(40)], "n": list(range(40))}), src,
                   row_group_size=2)
    args = ["--samples-per-shard", "4", "--workers", "2"]
    assert main(["pack", str(src), str(tmp_path / "clean"), *args]) == 0
    dst = tmp_path / "out"
    complete, partial = _kill_mid_shard(src, dst, args, whole_group=True)
    assert partial and complete and not (dst / "index.json").exists()
    kept = {n: (dst / n).stat().st_mtime_ns for n in complete}
    assert main(["pack", str(src), str(dst), *args]) == 0  # the same command again
    assert tree_digest(dst) == tree_digest(tmp_path / "clean")
    assert [n for n, t in kept.items() if (dst / n).stat().st_mtime_ns == t], "complete shards not reused"


def test_samples_per_shard_and_shard_size_inside_one_unit(tmp_path: Path, caplog) -> None:
    """A HF dataset or parquet row group larger than a shard is cut into row ranges (every row once, in order)."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"caption": [f"row {i}" for i in range(100)]})
    idx = fastfeed.pack(ds, tmp_path / "hf", samples_per_shard=10, shuffle=False)
    assert [s.samples for s in idx.shards] == [10] * 10
    assert [r["caption.txt"] for r in _stored(tmp_path / "hf")] == [f"row {i}".encode() for i in range(100)]
    idx = fastfeed.pack(ds, tmp_path / "hf-bytes", shard_size=ds.data.nbytes // 4, shuffle=False)
    assert len(idx.shards) >= 4 and idx.num_samples == 100
    _write(tmp_path / "one.parquet", 25, 0, row_group=25)  # one row group of 25 rows
    with caplog.at_level("WARNING", logger="fastfeed.packing.sources.table"):
        idx = fastfeed.pack(tmp_path / "one.parquet", tmp_path / "pq", samples_per_shard=10, shuffle=False,
                            key="id")
    assert [s.samples for s in idx.shards] == [10, 10, 5]
    assert [r["__key__"] for r in _stored(tmp_path / "pq")] == [f"doc{i:03d}" for i in range(25)]
    said = [r.getMessage() for r in caplog.records if "row group 0 has 25 rows" in r.getMessage()]
    assert len(said) == 1 and "smaller row groups" in said[0]
