"""FastTarReader over a memory map (the loader's reader for raw-pixel shards)."""

from __future__ import annotations

from pathlib import Path

from fastfeed.formats.tar import TarShardWriter
from fastfeed.formats.tar_reader import FastTarReader


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
