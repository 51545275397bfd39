"""sources/table.py (with parquet.py, hf.py, columns.py, rows.py): fields, keys, units, bad rows, bad files, memory."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from fastfeed.decode.fields import decode_field
from fastfeed.errors import (
    BadFileError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
    SourceError,
    UnsafePathError,
)
from fastfeed.packing.plan import group_units
from fastfeed.packing.sources.columns import parse_columns
from fastfeed.packing.sources.detect import is_table
from fastfeed.packing.sources.table import iter_samples, iter_unit, scan_table
from tools.synth import make_jpeg


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def _table(n: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    jpegs = [make_jpeg(rng, (24 + i, 16)) for i in range(n)]
    return pa.table({
        "id": [f"doc{i:03d}" for i in range(n)],
        "caption": [f"caption number {i}" if i != 3 else None for i in range(n)],
        "image": pa.array([{"bytes": jpegs[i], "path": f"img{i}.jpg"} for i in range(n)],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "thumb": [_png() if i % 2 else jpegs[i] for i in range(n)],
        "emb": pa.array([[float(i), i + 0.5, -1.0] for i in range(n)], pa.list_(pa.float32())),
        "ids": pa.array([list(range(i)) for i in range(n)], pa.list_(pa.int32())),
        "label": list(range(n)),
        "tags": [["a", "b"][: i % 3] for i in range(n)],
    }), jpegs


@pytest.fixture()
def parquet_file(tmp_path: Path):
    table, jpegs = _table()
    path = tmp_path / "data" / "train.parquet"
    path.parent.mkdir()
    pq.write_table(table, path, row_group_size=3)  # row groups of 3, 3, 3, 1
    return path, table, jpegs


def test_columns_become_fields(parquet_file) -> None:
    path, _, jpegs = parquet_file
    src = scan_table(path)
    assert src.kind == "parquet" and src.num_rows == 10 and src.files == ("train.parquet",)
    assert [(u.row_group, u.first_row, u.num_rows) for u in src.units] == [(0, 0, 3), (1, 3, 3), (2, 6, 3), (3, 9, 1)]
    samples = list(iter_samples(src))
    assert [s.key for s in samples] == [f"{i:09d}" for i in range(10)]
    s0, s1, s3 = samples[0], samples[1], samples[3]
    assert sorted(s1.fields) == ["caption.txt", "emb.npy", "id.txt", "ids.npy", "image.jpg", "label.json",
                                 "tags.json", "thumb.png"]
    assert "thumb.jpg" in s0.fields and "caption.txt" not in s3.fields  # sniffed per value; null left out
    assert s0.fields["image.jpg"] == jpegs[0] and s1.fields["thumb.png"] == _png()
    assert decode_field("caption.txt", s1.fields["caption.txt"]) == "caption number 1"
    emb = decode_field("emb.npy", s1.fields["emb.npy"])
    assert emb.dtype == np.float32 and emb.tolist() == [1.0, 1.5, -1.0]
    assert decode_field("ids.npy", samples[4].fields["ids.npy"]).tolist() == [0, 1, 2, 3]
    assert decode_field("tags.json", samples[2].fields["tags.json"]) == ["a", "b"]
    assert decode_field("id.txt", s1.fields["id.txt"]) == "doc001"  # a text column named id: not an int field
    assert [s.label for s in samples] == list(range(10))


def test_columns_mapping_selects_and_renames(parquet_file) -> None:
    path, _, jpegs = parquet_file
    src = scan_table(path, columns="image=jpg,caption=txt,label=cls", key="id")
    samples = list(iter_samples(src))
    assert samples[2].key == "doc002"
    assert samples[2].fields == {"jpg": jpegs[2], "txt": b"caption number 2", "cls": b"2"}
    assert samples[2].label == 2
    with pytest.raises(ConfigError, match=r"no column 'picture'; the columns are: id, caption, image"):
        scan_table(path, columns="picture=jpg")
    with pytest.raises(ConfigError, match="no column 'name'"):
        scan_table(path, key="name")
    with pytest.raises(ConfigError, match="both map to field 'txt'"):
        scan_table(path, columns="caption=txt,id=txt")
    assert parse_columns({"image": "JPEG"}) == {"image": "jpg"}
    with pytest.raises(ConfigError, match="named twice"):
        parse_columns("a=txt,a=json")


def test_bad_rows_raise_or_skip(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"name": ["a", "b/../c", "d", "e"],
                             "pic": [make_jpeg(np.random.default_rng(1), (8, 8)), b"not an image", b"\xff\xd8\xff..", b""],
                             "vec": pa.array([[1, 2], [3], [5, 6], [4]], pa.list_(pa.int64()))}),
                   path, row_group_size=2)
    src = scan_table(path, columns="pic=jpg", key="name")
    with pytest.raises(UnsafePathError, match=r"bad.parquet: row group 0, row 1 \(key 'b/../c'\), column 'name': "
                                              r"unusable key \(name contains '..'\); fix the 'name' column"):
        list(iter_samples(src))
    src = scan_table(path, columns="pic=jpg")
    with pytest.raises(BadFileError, match=r"row group 0, row 1 \(key '000000001'\), column 'pic': cannot be "
                                           r"stored as jpg \(not an image"):
        list(iter_samples(src))
    skipped: list[dict[str, str]] = []
    kept = list(iter_samples(src, on_error="skip", skipped=skipped))
    assert [s.key for s in kept] == ["000000000", "000000002"]
    assert [(d["key"], d["path"].endswith("row group 1, row 3")) for d in skipped] == [
        ("000000001", False), ("000000003", True)]
    ragged = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"m": pa.array([[[1, 2], [3, 4]], [[1], [2, 3]]], pa.list_(pa.list_(pa.int64())))}), ragged)
    with pytest.raises(BadFileError, match=r"column 'm': cannot be stored as m.npy \(a ragged"):
        list(iter_samples(scan_table(ragged)))
    assert list(iter_samples(scan_table(ragged, columns="m=m.json")))[1].fields == {"m.json": b"[[1],[2,3]]"}


def test_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"k": ["x", "y", "x"], "t": ["1", "2", "3"]}), path, row_group_size=2)
    with pytest.raises(DuplicateKeyError, match=r"row group 1, row 2: duplicate key 'x' in column 'k' "
                                                r"\(also .*row group 0, row 0\)"):
        scan_table(path, key="k")
    src = scan_table(path, key="k", on_error="skip")
    assert [d["key"] for d in src.skipped] == ["x"]


def test_truncated_and_corrupt_files(tmp_path: Path, parquet_file) -> None:
    path, _, _ = parquet_file
    data = path.read_bytes()
    bad = tmp_path / "data" / "zz-truncated.parquet"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadFileError, match=r"zz-truncated.parquet: not a readable parquet file .*truncated or corrupt"):
        scan_table(path.parent)
    src = scan_table(path.parent, on_error="skip")
    assert src.files == ("train.parquet",) and src.num_rows == 10
    assert src.skipped[0]["path"] == "zz-truncated.parquet"
    # a footer that reads but a damaged data page: the row group is named
    meta = pq.ParquetFile(path).metadata
    col = meta.row_group(1).column(1)
    broken = bytearray(data)
    start = col.data_page_offset
    broken[start:start + col.total_compressed_size] = b"\x00" * col.total_compressed_size
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(bytes(broken))
    src = scan_table(damaged, columns="caption")
    assert len(list(iter_unit(src, src.units[0]))) == 3
    with pytest.raises(BadFileError, match=r"damaged.parquet: row group 1, row 3: cannot read the row group"):
        list(iter_unit(src, src.units[1]))
    skipped: list[dict[str, str]] = []
    assert list(iter_unit(src, src.units[1], on_error="skip", skipped=skipped)) == []
    assert "row group 1" in skipped[0]["path"]


def test_folders_globs_and_schemas(tmp_path: Path) -> None:
    (tmp_path / "c" / "sub").mkdir(parents=True)
    for i, name in enumerate(["b.parquet", "a.parquet", "sub/c.parquet"]):
        pq.write_table(pa.table({"t": [f"{name}-{j}" for j in range(i + 1)]}), tmp_path / "c" / name)
    src = scan_table(tmp_path / "c")
    assert src.files == ("a.parquet", "b.parquet", "sub/c.parquet")
    assert [s.fields["t.txt"].decode() for s in iter_samples(src)] == [
        "a.parquet-0", "a.parquet-1", "b.parquet-0", "sub/c.parquet-0", "sub/c.parquet-1", "sub/c.parquet-2"]
    glob_src = scan_table(str(tmp_path / "c" / "*.parquet"))
    assert glob_src.files == ("a.parquet", "b.parquet") and glob_src.root.rstrip("/") == str(tmp_path / "c")
    assert is_table(tmp_path / "c", None) and is_table(str(tmp_path / "c" / "*.parquet"), None)
    (tmp_path / "notes.txt").write_text("x")
    assert not is_table(tmp_path, None)  # a file that is not parquet
    pq.write_table(pa.table({"t": [1, 2]}), tmp_path / "c" / "d.parquet")
    with pytest.raises(SourceError, match=r"d.parquet: column 't' is int64, but string in a.parquet"):
        scan_table(tmp_path / "c")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptySourceError, match="no parquet files"):
        scan_table(tmp_path / "empty")
    with pytest.raises(SourceError, match="no such file or folder"):
        scan_table(tmp_path / "missing.parquet")


def test_units_are_deterministic_and_group_into_shards(parquet_file) -> None:
    path, _, _ = parquet_file
    a, b = scan_table(path), scan_table(path)
    assert a.units == b.units and a.fingerprint == b.fingerprint
    assert scan_table(path, columns="caption").fingerprint != a.fingerprint
    per_unit = max(u.nbytes for u in a.units)
    sizes, rows = [u.nbytes for u in a.units], [u.num_rows for u in a.units]
    groups = group_units(sizes, rows, shard_bytes=2 * per_unit)
    assert [i for start, stop in groups for i in range(start, stop)] == list(range(len(a.units)))
    assert all(sum(sizes[start:stop]) <= 2 * per_unit for start, stop in groups)
    assert group_units(sizes, rows, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert group_units(sizes, rows, 10**9, shard_rows=6) == [(0, 2), (2, 4)]
    # a unit read alone (a pack worker after a crash) gives the same samples as the full pass
    alone = [s for u in reversed(a.units) for s in iter_unit(a, u)][::-1]
    full = list(iter_samples(a))
    assert sorted(s.key for s in alone) == [s.key for s in full]


def test_bounded_memory(tmp_path: Path) -> None:
    """Reading holds one record batch, never the table: arrow's allocations stay far below its size."""
    path = tmp_path / "big.parquet"
    rng = np.random.default_rng(0)
    rows = [rng.bytes(64 * 1024) for _ in range(256)]  # 16 MiB of incompressible bytes
    pq.write_table(pa.table({"blob": pa.array(rows, pa.binary())}), path, row_group_size=32,
                   compression="none")
    del rows
    src = scan_table(path, columns="blob=bin")
    base = pa.total_allocated_bytes()
    peak = 0
    n = 0
    for unit in src.units:
        for s in iter_unit(src, unit, batch_rows=8):
            peak = max(peak, pa.total_allocated_bytes() - base)
            n += len(s.fields["bin"])
    assert n == 256 * 64 * 1024
    assert peak < 6 * 1024 * 1024, f"arrow held {peak} bytes while streaming a 16 MiB table"


def test_hf_dataset_object_and_save_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(2)
    jpegs = [make_jpeg(rng, (16, 16)) for _ in range(5)]
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["cat", "dog"])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in jpegs],
                                     "text": [f"t{i}" for i in range(5)], "label": [0, 1, 0, 1, 1]},
                                    features=features)
    src = scan_table(ds, columns="image=jpg,text=txt,label=cls")
    assert src.kind == "hf" and src.num_rows == 5
    samples = list(iter_samples(src))
    assert [s.fields["jpg"] for s in samples] == jpegs and [s.label for s in samples] == [0, 1, 0, 1, 1]
    assert samples[4].fields["txt"] == b"t4" and samples[4].key == "000000004"
    picked = ds.select([4, 0, 2])  # an indices mapping: the dataset's order, not the arrow order
    assert [s.fields["txt"] for s in iter_samples(scan_table(picked, columns="text=txt"))] == [b"t4", b"t0", b"t2"]
    ds.save_to_disk(str(tmp_path / "saved"))
    assert is_table(tmp_path / "saved", None)
    disk = scan_table(tmp_path / "saved")
    assert disk.dataset is None and disk.root == str(tmp_path / "saved")
    got = list(iter_samples(disk))
    assert [s.fields["image.jpg"] for s in got] == jpegs and got[1].fields["text"] == b"t1"
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"a DatasetDict \(splits: test, train\); pass one split"):
        scan_table(tmp_path / "dd")
    with pytest.raises(ConfigError, match="no column 'caption'; the columns are: image, text, label"):
        scan_table(ds, columns="caption=txt")


def test_image_struct_with_path_only(tmp_path: Path) -> None:
    jpeg = make_jpeg(np.random.default_rng(3), (8, 8))
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.jpg").write_bytes(jpeg)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(pa.table({"image": pa.array([{"bytes": None, "path": "pics/a.jpg"}], struct)}),
                   tmp_path / "p.parquet")
    (s,) = iter_samples(scan_table(tmp_path / "p.parquet"))
    assert s.fields == {"image.jpg": jpeg}
    assert os.path.basename(scan_table(tmp_path / "p.parquet").units[0].file) == "p.parquet"


def test_missing_pyarrow_names_the_extra(parquet_file, monkeypatch) -> None:
    import sys

    from fastfeed.errors import MissingDependencyError

    path, _, _ = parquet_file
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MissingDependencyError, match=r"parquet sources: the 'pyarrow' module is missing; "
                                                     r"pip install 'fastfeed\[text\]'"):
        scan_table(path)


def test_nested_values_as_json(tmp_path: Path) -> None:
    import datetime
    import decimal

    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({
        "meta": pa.array([{"a": 1, "b": "x"}], pa.struct([("a", pa.int64()), ("b", pa.string())])),
        "when": pa.array([datetime.date(2024, 5, 1)]),
        "price": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
        "blobs": pa.array([{"raw": b"\x00\x01"}], pa.struct([("raw", pa.binary())])),
    }), path)
    src = scan_table(path, columns="meta,when,price")
    (s,) = iter_samples(src)
    assert s.fields == {"meta.json": b'{"a":1,"b":"x"}', "when.json": b'"2024-05-01"', "price.json": b'"1.50"'}
    with pytest.raises(BadFileError, match=r"column 'blobs': cannot be stored as blobs.json \(binary data"):
        list(iter_samples(scan_table(path, columns="blobs")))
