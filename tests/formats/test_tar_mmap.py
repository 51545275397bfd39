"""FastTarReader over a memory map (the loader's reader for raw-pixel shards)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

import fastfeed
from fastfeed.formats.span import FileSpan
from fastfeed.formats.tar import TarShardWriter
from fastfeed.formats.tar_reader import FastTarReader
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import resolve_index
from _raw_data import write_raw_source


def test_mmap_reads_the_same_samples_with_raw_pixels_as_views(tmp_path: Path) -> None:
    w = TarShardWriter(tmp_path / "s.tar")
    spans = [w.add(f"k{i}", {"cls": b"1", "rgb8": bytes([i]) * 300, "jpg": b"\xff\xd8" * 10}) for i in range(3)]
    w.close()
    plain, mapped = FastTarReader(tmp_path / "s.tar"), FastTarReader(tmp_path / "s.tar", use_mmap=True)
    for off, size in spans:
        a, b = plain.read(off, size), mapped.read(off, size)
        assert a.keys() == b.keys() and all(bytes(a[k]) == bytes(b[k]) for k in a if k != "__key__")
        assert isinstance(b["rgb8"], memoryview) and isinstance(b["jpg"], bytes) and isinstance(b["cls"], bytes)
    held = mapped.read(*spans[0])["rgb8"]  # a view outlives close(): unmapped when it goes
    mapped.close()
    plain.close()
    assert bytes(held) == bytes([0]) * 300


# ------------------------------------------------------------------ raw_rows: rgb8 as a FileSpan
@pytest.fixture(scope="module")
def raw_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real JPEG/PNG files (several sizes, the messy kinds) packed as raw pixels in tar shards."""
    base = tmp_path_factory.mktemp("rawtar")
    write_raw_source(base / "src", copies=1)
    fastfeed.pack(base / "src", base / "raw", format="tar", store="raw", samples_per_shard=6, seed=1)
    return base / "raw"


def _shard_spans(index: DatasetIndex, s: int) -> list[tuple[int, int]]:
    start, stop = (int(x) for x in index.shard_starts[s: s + 2])
    return [(int(o), int(n)) for o, n in index.offsets[start:stop]]


def test_raw_rows_hands_rgb8_over_as_a_span_of_the_same_bytes(raw_pack: Path) -> None:
    index = resolve_index(raw_pack)
    assert len(index.shards) >= 2
    checked = 0
    for s in range(len(index.shards)):
        path = index.shard_path(s)
        whole = Path(path).read_bytes()
        mapped = FastTarReader(path, use_mmap=True)
        rows = FastTarReader(path, use_mmap=True, raw_rows=True)
        for i, (off, size) in enumerate(_shard_spans(index, s)):
            a, b = mapped.read(off, size), rows.read(off, size)
            assert a.keys() == b.keys() and "rgb8" in b, (s, i, sorted(b))
            assert isinstance(a["rgb8"], memoryview) and type(b["rgb8"]) is FileSpan
            span = b["rgb8"]
            assert len(span) == len(a["rgb8"]) and span.name == path
            assert span.tobytes() == bytes(a["rgb8"])
            h, w = (int(x) for x in index.shapes[int(index.shard_starts[s]) + i])
            assert len(span) == 3 * h * w  # the shape the index gives fits the span
            assert whole[span.offset: span.offset + span.size] == span.tobytes()
            for k in a:
                if k != "rgb8":
                    assert a[k] == b[k] and type(a[k]) is type(b[k]), (k, s, i)
            checked += 1
        mapped.close()
        rows.close()
    assert checked == index.num_samples


def test_spans_read_after_their_reader_closed(raw_pack: Path) -> None:
    index = resolve_index(raw_pack)
    path = index.shard_path(0)
    rows = FastTarReader(path, use_mmap=True, raw_rows=True)
    spans = [rows.read(off, size)["rgb8"] for off, size in _shard_spans(index, 0)]
    fd = spans[0].file.fd
    assert all(sp.file is spans[0].file for sp in spans)  # one descriptor for the shard
    rows.close()
    gc.collect()
    mapped = FastTarReader(path, use_mmap=True)
    want = [bytes(mapped.read(off, size)["rgb8"]) for off, size in _shard_spans(index, 0)]
    mapped.close()
    assert [sp.tobytes() for sp in reversed(spans)] == want[::-1]
    os.fstat(fd)  # still open while spans hold it
    del spans
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # the last span closed it


def test_raw_rows_reopens_after_a_fork(raw_pack: Path) -> None:
    index = resolve_index(raw_pack)
    path = index.shard_path(0)
    off, size = _shard_spans(index, 0)[1]
    rows = FastTarReader(path, use_mmap=True, raw_rows=True)
    parent = rows.read(off, size)["rgb8"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = rows.read(off, size)["rgb8"]
            code = 0 if child.file is not parent.file and child.tobytes() == parent.tobytes() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    mapped = FastTarReader(path, use_mmap=True)
    assert parent.tobytes() == bytes(mapped.read(off, size)["rgb8"])
    mapped.close()
    rows.close()


def test_raw_rows_without_a_map_keeps_plain_bytes(tmp_path: Path) -> None:
    w = TarShardWriter(tmp_path / "s.tar")
    off, size = w.add("k0", {"cls": b"1", "rgb8": b"\x01\x02\x03" * 4})
    w.close()
    got = FastTarReader(tmp_path / "s.tar", raw_rows=True).read(off, size)  # raw_rows needs use_mmap
    assert got["rgb8"] == b"\x01\x02\x03" * 4 and type(got["rgb8"]) is bytes
    with open(tmp_path / "s.tar", "rb") as f:  # a stream: nothing to map, nothing to span
        got = FastTarReader(f, use_mmap=True, raw_rows=True).read(off, size)
    assert bytes(got["rgb8"]) == b"\x01\x02\x03" * 4 and type(got["rgb8"]) is not FileSpan


def test_an_empty_raw_member_stays_an_empty_buffer(tmp_path: Path) -> None:
    """An empty rgb8 member has no place worth reading: it stays the (empty) view, which
    ``pixels`` then refuses with its SampleError, as in map mode."""
    w = TarShardWriter(tmp_path / "s.tar")
    spans = [w.add("k0", {"cls": b"1", "rgb8": b""}), w.add("k1", {"cls": b"1", "rgb8": b"abc"})]
    w.close()
    rows = FastTarReader(tmp_path / "s.tar", use_mmap=True, raw_rows=True)
    got = [rows.read(off, size)["rgb8"] for off, size in spans]
    assert got[1].tobytes() == b"abc"
    assert not isinstance(got[0], FileSpan) and len(got[0]) == 0 and bytes(got[0]) == b""
