"""Per-sample checksums and size guards of the shard formats (issue 27, parts 1 and 4).

The writers record the checksum of exactly the bytes the readers read; a reader given the
shard's checksums checks every sample; LMDB files are checked against their header before
they are mapped, and mapped reads check the file's size first.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from fastfeed.errors import SampleError, ShardError
from fastfeed.formats import checksum
from fastfeed.formats.checksum import ALGORITHMS, ShardSums, digest, hasher, pack_algorithm
from fastfeed.formats.lmdb import LmdbShardReader, LmdbShardWriter, needed_size, open_shared_env
from fastfeed.formats.tar import TarShardWriter
from fastfeed.formats.tar_reader import FastTarReader


def _samples(n: int = 6) -> list[tuple[str, dict[str, bytes]]]:
    rng = np.random.default_rng(0)
    return [(f"k{i:03d}", {"jpg": rng.bytes(700 + 300 * i), "cls": b"%d" % (i % 3)}) for i in range(n)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_running_and_one_shot_checksums_agree(algorithm: str) -> None:
    h = hasher(algorithm)
    for piece in (b"ab", b"", b"cdef"):
        h.update(piece)
    assert h.intdigest() == digest(algorithm)(b"abcdef") == digest(algorithm)(memoryview(b"abcdef"))
    assert digest("crc32")(b"abcdef") == zlib.crc32(b"abcdef")


def test_unknown_algorithm_names_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown checksum algorithm 'md4'.*re-pack"):
        digest("md4")


def test_without_xxhash_pack_uses_crc32_and_reading_xxh3_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksum, "_xxhash", lambda: None)
    assert pack_algorithm() == "crc32"
    with pytest.raises(ImportError, match="pip install xxhash.*verify=False"):
        digest("xxh3_64")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tar_writer_checksums_cover_each_sample_span(tmp_path: Path, algorithm: str) -> None:
    p = tmp_path / "s.tar"
    w = TarShardWriter(p, checksum=algorithm)
    spans = [w.add(k, f) for k, f in _samples()]
    w.close()
    data = p.read_bytes()
    assert w.checksums == [digest(algorithm)(data[o:o + n]) for o, n in spans]


def test_lmdb_writer_checksums_cover_each_record(tmp_path: Path) -> None:
    p = str(tmp_path / "s.lmdb")
    w = LmdbShardWriter(p, checksum="crc32")
    for k, f in _samples():
        w.add(k, f)
    w.close()
    r = LmdbShardReader(p)
    assert [digest("crc32")(v) for _, v in r.records()] == w.checksums
    r.close()


def test_shard_sums_find_samples_by_offset_or_record() -> None:
    sums = ShardSums("crc32", np.array([11, 22, 33], np.uint64), np.array([0, 1024, 4096]),
                     skip=np.array([False, True, False]))
    assert [sums.expected(o) for o in (0, 1024, 4096, 512, 9999)] == [11, None, 33, None, None]
    by_record = ShardSums("crc32", np.array([11, 22], np.uint64))
    assert [by_record.expected(r) for r in (0, 1, 2, -1)] == [11, 22, None, None]


def _tar(tmp_path: Path) -> tuple[Path, list[tuple[int, int]], list[int]]:
    p = tmp_path / "s.tar"
    w = TarShardWriter(p, checksum="crc32")
    spans = [w.add(k, f) for k, f in _samples()]
    w.close()
    return p, spans, w.checksums


@pytest.mark.parametrize("use_mmap", [False, True])
def test_tar_reader_checks_every_sample_it_reads(tmp_path: Path, use_mmap: bool) -> None:
    p, spans, sums = _tar(tmp_path)
    table = ShardSums("crc32", np.array(sums, np.uint64), np.array([o for o, _ in spans]))
    raw = bytearray(p.read_bytes())
    off, size = spans[3]
    raw[off + 512 + 100] ^= 0x01  # one bit of k003's JPEG data
    p.write_bytes(bytes(raw))
    r = FastTarReader(p, sums=table, size=len(raw), use_mmap=use_mmap)
    assert r.read(*spans[2])["__key__"] == "k002"
    with pytest.raises(SampleError, match=r"s.tar: sample 'k003' at offset \d+: its bytes' crc32 checksum is "
                                          r"[0-9a-f]{16}, the index recorded [0-9a-f]{16}.*re-run `fastfeed pack`") as e:
        r.read(off, size)
    assert e.value.key == "k003" and e.value.offset == off
    assert FastTarReader(p).read(off, size)["__key__"] == "k003"  # without sums: read unchecked
    r.close()


@pytest.mark.parametrize("use_mmap", [False, True])
def test_tar_shard_that_shrinks_under_the_reader_is_a_shard_error(tmp_path: Path, use_mmap: bool) -> None:
    p, spans, _ = _tar(tmp_path)
    size = p.stat().st_size
    r = FastTarReader(p, size=size, use_mmap=use_mmap, name="shard-7.tar")
    assert r.read(*spans[-1])["__key__"] == "k005"
    os.truncate(p, spans[2][0])
    with pytest.raises(ShardError, match=rf"shard-7.tar: the shard is {spans[2][0]} bytes now, {size} when it was "
                                         "checked: it was truncated"):
        r.read(*spans[-1])
    r.close()


def _lmdb(tmp_path: Path, n: int = 40) -> str:
    p = str(tmp_path / "s.lmdb")
    w = LmdbShardWriter(p)
    rng = np.random.default_rng(1)
    for i in range(n):
        w.add(f"k{i:03d}", {"jpg": rng.bytes(3000)})
    w.close()
    return p


def test_lmdb_header_gives_the_size_a_shard_needs(tmp_path: Path) -> None:
    p = _lmdb(tmp_path)
    need = needed_size(p)
    assert need == os.path.getsize(p)
    os.truncate(p, need - 4096)
    with pytest.raises(ShardError, match=rf"s.lmdb: {need - 4096} bytes, but its LMDB header counts {need}.*truncated"):
        needed_size(p)
    with pytest.raises(ShardError, match="truncated"):
        open_shared_env(p)  # refused before the file is mapped: no SIGBUS on a page past its end
    os.truncate(p, 5000)
    with pytest.raises(ShardError, match="less than LMDB's two meta pages"):
        LmdbShardReader(p).read(0)
    Path(p).write_bytes(b"not an lmdb file" * 300)
    with pytest.raises(ShardError, match="not an LMDB file"):
        needed_size(p)


def test_lmdb_shard_that_shrinks_under_the_reader_is_a_shard_error(tmp_path: Path) -> None:
    p = _lmdb(tmp_path)
    r = LmdbShardReader(p, name="shard-3.lmdb")
    assert r.read(39)["__key__"] == "k039"
    os.truncate(p, os.path.getsize(p) // 2)
    with pytest.raises(ShardError, match="shard-3.lmdb: the shard is .* bytes now, .* when it was checked"):
        r.read(39)
    r.close()


def test_lmdb_reader_checks_every_record_it_reads(tmp_path: Path) -> None:
    p = str(tmp_path / "s.lmdb")
    w = LmdbShardWriter(p, checksum="crc32")
    for k, f in _samples():
        w.add(k, f)
    w.close()
    sums = list(w.checksums)
    sums[4] ^= 1  # what a damaged record looks like to its reader
    r = LmdbShardReader(p, sums=ShardSums("crc32", np.array(sums, np.uint64)))
    assert r.read(3)["__key__"] == "k003"
    with pytest.raises(SampleError, match=r"s.lmdb: sample 'k004' at record 4: its bytes' crc32 checksum"):
        r.read(4)
    r.close()
