"""Shard formats: writers and readers round-trip; tar output is a standard tar."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from fastfeed.errors import SampleError
from fastfeed.formats import FORMATS, split_key
from fastfeed.formats.wds import scan_tar


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_roundtrip(tmp_path: Path, fmt: str) -> None:
    writer_cls, reader_cls, suffix = FORMATS[fmt]
    path = tmp_path / f"s{suffix}"
    w = writer_cls(path)
    samples = [(f"dir/k{i:03d}", {"jpg": bytes([i]) * (i * 300 + 1), "cls": str(i).encode()}) for i in range(20)]
    locs = [w.add(k, f) for k, f in samples]
    size, sha = w.close()
    assert size == path.stat().st_size and len(sha) == 64
    r = reader_cls(path)
    for (key, fields), (off, sz) in zip(samples, locs):
        got = r.read(off, sz)
        assert got == {"__key__": key, **fields}
    assert [s["__key__"] for s in r] == [k for k, _ in samples]


def test_tar_is_standard_and_deterministic(tmp_path: Path) -> None:
    writer_cls, _, _ = FORMATS["tar"]
    outs = []
    for n in range(2):
        p = tmp_path / f"{n}.tar"
        w = writer_cls(p)
        w.add("a/" + "x" * 150, {"txt": b"long name"})
        w.add("b", {"json": b"{}", "txt": b"t"})
        w.close()
        outs.append(p.read_bytes())
        with tarfile.open(p) as tf:
            names = tf.getnames()
            assert names == ["a/" + "x" * 150 + ".txt", "b.json", "b.txt"]
            assert all(m.mtime == 0 and m.uid == 0 for m in tf.getmembers())
        assert scan_tar(p).keys == ["a/" + "x" * 150, "b"]
    assert outs[0] == outs[1]


def test_tar_truncated_read_names_shard(tmp_path: Path) -> None:
    writer_cls, reader_cls, _ = FORMATS["tar"]
    p = tmp_path / "s.tar"
    w = writer_cls(p)
    off, size = w.add("k", {"bin": b"z" * 5000})
    w.close()
    p.write_bytes(p.read_bytes()[:1500])
    with pytest.raises(SampleError, match="s.tar: truncated at offset 0"):
        reader_cls(p).read(off, size)


def test_missing_lmdb_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lmdb is a core dependency: the message names ``pip install lmdb``, not an extra."""
    import sys

    from fastfeed.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(MissingDependencyError, match="pip install lmdb") as e:
        FORMATS["lmdb"][0](tmp_path / "s.lmdb")
    assert "fastfeed[" not in str(e.value)


def test_split_key() -> None:
    assert split_key("a/b/0001.seg.PNG") == ("a/b/0001", "seg.png")
    assert split_key("noext") is None
