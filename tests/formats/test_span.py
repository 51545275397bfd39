"""FileSpan and OpenFile (fastfeed.formats.span): bytes of a real file read by place, the descriptor's lifetime."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from fastfeed.errors import SampleError, ShardError
from fastfeed.formats.span import FileSpan, OpenFile

DATA = bytes((i * 7 + 3) % 256 for i in range(10_000))


def _file(tmp_path: Path, data: bytes = DATA, name: str = "shard-000.tar") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("offset,size", [(0, 1), (0, len(DATA)), (513, 4000), (9_999, 1), (4096, 0)])
def test_tobytes_and_readinto_give_the_bytes_at_the_offset(tmp_path: Path, offset: int, size: int) -> None:
    path = _file(tmp_path)
    span = FileSpan(OpenFile.open(str(path)), offset, size, name=str(path))
    assert len(span) == size
    assert span.tobytes() == DATA[offset: offset + size]
    for start, count in ((0, size), (size // 3, size - size // 3), (size // 2, size // 4), (size, 0)):
        buf = bytearray(b"\xee" * (count + 2))  # the bytes either side stay as they were
        span.readinto(memoryview(buf)[1: 1 + count], start)
        assert bytes(buf[1: 1 + count]) == DATA[offset + start: offset + start + count]
        assert buf[:1] == buf[-1:] == b"\xee"


def test_readinto_reuses_one_buffer_for_spans_of_one_file(tmp_path: Path) -> None:
    path = _file(tmp_path)
    f = OpenFile.open(str(path))
    buf = bytearray(100)
    for off in (0, 100, 5000, 9900):
        FileSpan(f, off, 100).readinto(memoryview(buf))
        assert bytes(buf) == DATA[off: off + 100]


@pytest.mark.parametrize("start,count", [(-1, 4), (0, 101), (97, 4), (100, 1), (200, 0)])
def test_readinto_outside_the_span_is_a_value_error(tmp_path: Path, start: int, count: int) -> None:
    path = _file(tmp_path)
    span = FileSpan(OpenFile.open(str(path)), 1000, 100, name=str(path))
    buf = bytearray(b"\xee" * count)
    with pytest.raises(ValueError, match="outside the span of 100"):
        span.readinto(memoryview(buf), start)
    assert bytes(buf) == b"\xee" * count  # nothing was read


def test_a_file_truncated_after_the_span_was_made_is_a_sample_error_naming_it(tmp_path: Path) -> None:
    path = _file(tmp_path)
    span = FileSpan(OpenFile.open(str(path)), 8000, 1500, name=str(path))
    assert span.tobytes() == DATA[8000:9500]
    os.truncate(path, 8600)  # the span now runs 900 bytes past the end
    with pytest.raises(SampleError, match=rf"{path.name}: truncated at offset 8000 \(wanted 1500 bytes, got 600\)") as e:
        span.tobytes()
    assert e.value.shard == str(path) and e.value.offset == 8000
    buf = bytearray(200)
    span.readinto(memoryview(buf), 0)  # what is still there reads
    assert bytes(buf) == DATA[8000:8200]
    with pytest.raises(SampleError, match=rf"{path.name}: truncated at offset 8500 \(wanted 200 bytes, got 100\)"):
        span.readinto(memoryview(buf), 500)
    os.truncate(path, 100)
    with pytest.raises(SampleError, match=rf"{path.name}.*got 0"):
        span.readinto(memoryview(buf), 0)


def test_open_of_a_missing_file_is_a_shard_error(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="shard is missing"):
        OpenFile.open(str(tmp_path / "gone.tar"))


def test_the_descriptor_lives_while_a_span_does_and_closes_with_the_last(tmp_path: Path) -> None:
    path = _file(tmp_path)
    owner = OpenFile.open(str(path))
    fd = owner.fd
    a, b = FileSpan(owner, 10, 20), FileSpan(owner, 30, 40)
    del owner  # the reader that opened it let go
    gc.collect()
    assert _is_open(fd) and a.tobytes() == DATA[10:30]
    del a
    gc.collect()
    assert _is_open(fd) and b.tobytes() == DATA[30:70]
    del b
    gc.collect()
    assert not _is_open(fd)


def test_a_forked_child_dropping_the_inherited_file_leaves_the_descriptor_open(tmp_path: Path) -> None:
    path = _file(tmp_path)
    owner = OpenFile.open(str(path))
    fd = owner.fd
    span = FileSpan(owner, 100, 50)
    pid = os.fork()
    if pid == 0:  # the child: drop every reference it inherited, then check the descriptor
        code = 1
        try:
            del owner, span
            gc.collect()
            code = 0 if _is_open(fd) and os.pread(fd, 50, 100) == DATA[100:150] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child closed the descriptor it inherited"
    assert _is_open(fd) and span.tobytes() == DATA[100:150]
    del owner, span
    gc.collect()
    assert not _is_open(fd)  # in its own process the last reference still closes it


def test_a_file_opened_in_the_child_is_closed_there(tmp_path: Path) -> None:
    path = _file(tmp_path)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            f = OpenFile.open(str(path))
            fd = f.fd
            del f
            gc.collect()
            code = 0 if not _is_open(fd) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "a file the child opened stayed open after its last reference"
