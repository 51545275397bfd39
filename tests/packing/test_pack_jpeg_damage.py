"""JPEG damage libjpeg only warns about (issue 27, part 1): damage at pack time and in verify.

Pillow decodes a JPEG cut short that still ends in an end-of-image marker, or one whose
entropy-coded data is corrupt, without a word (the rest grey); libjpeg warns ("Corrupt JPEG
data: ...", "Premature end of JPEG file"). Those warnings are damage: ``pack`` refuses (or with
``--on-error skip`` leaves out) such a file, with or without restart markers, and ``verify``
names every damaged sample, also of a WebDataset tar that fastfeed did not write.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastfeed
from fastfeed.decode import roi
from fastfeed.errors import BadFileError
from fastfeed.formats.images import decode_error, jpeg_damage
from tools.synth import make_jpeg


def _jpeg(i: int = 0) -> bytes:
    return make_jpeg(np.random.default_rng(i), (96, 72), quality=90)


def _cut_with_eoi(jpg: bytes) -> bytes:
    """Cut short in its entropy-coded data, and an end-of-image marker appended (the issue's case)."""
    return jpg[: len(jpg) * 2 // 3] + b"\xff\xd9"


def _flipped(jpg: bytes) -> bytes:
    data = bytearray(jpg)
    for k in range(6):
        data[len(jpg) // 2 + 29 * k] ^= 0x55
    return bytes(data)


def test_pillow_is_silent_and_libjpeg_warns() -> None:
    for bad in (_cut_with_eoi(_jpeg()), _flipped(_jpeg())):
        Image.open(io.BytesIO(bad)).load()  # Pillow: no error (the rest of the image grey)
        why = jpeg_damage(bad)
        assert why is not None and why.startswith("damaged JPEG data (libjpeg: ") and "JPEG" in why
        assert decode_error(bad) == why  # what verify says
    assert jpeg_damage(_jpeg()) is None and decode_error(_jpeg()) is None
    assert jpeg_damage(b"not a jpeg") is None


def _folder(root: Path, bad: dict[str, bytes]) -> Path:
    for i in range(6):
        p = root / f"c{i % 2}" / f"img{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_jpeg(i))
    for name, data in bad.items():
        (root / name).write_bytes(data)
    return root


RESTARTS = [False] + ([True] if roi.built() else [])


@pytest.mark.parametrize("restarts", RESTARTS)
def test_pack_refuses_or_skips_a_damaged_jpeg(tmp_path: Path, restarts: bool) -> None:
    src = _folder(tmp_path / "src", {"c0/cut.jpg": _cut_with_eoi(_jpeg(7)), "c1/flip.jpg": _flipped(_jpeg(8))})
    with pytest.raises(BadFileError, match=r"c[01]/(cut|flip).jpg: damaged JPEG data \(libjpeg: .*\); copy or download the "
                                           "file again, remove it, or pass --on-error skip"):
        fastfeed.pack(src, tmp_path / "o", jpeg_restarts=restarts, samples_per_shard=3)
    fastfeed.pack(src, tmp_path / "o2", jpeg_restarts=restarts, on_error="skip", samples_per_shard=3)
    idx = fastfeed.DatasetIndex.load(tmp_path / "o2")
    assert idx.num_samples == 6 and {s["path"] for s in idx.skipped} == {"c0/cut.jpg", "c1/flip.jpg"}
    assert all("damaged JPEG data" in s["reason"] for s in idx.skipped)
    assert fastfeed.verify(tmp_path / "o2").ok


def test_pack_with_max_side_checks_the_source_before_reencoding(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src", {"c1/cut.jpg": _cut_with_eoi(_jpeg(9))})
    with pytest.raises(BadFileError, match=r"c1/cut.jpg: damaged JPEG data"):
        fastfeed.pack(src, tmp_path / "o", max_side=48)


def _wds_tar(path: Path, samples: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for key, jpg in samples:
            for ext, data in (("jpg", jpg), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def test_verify_names_every_damaged_jpeg_of_a_webdataset_tar(tmp_path: Path) -> None:
    samples = [(f"s{i:03d}", _jpeg(i)) for i in range(8)]
    samples[2] = ("s002", _cut_with_eoi(samples[2][1]))
    samples[6] = ("s006", _flipped(samples[6][1]))
    _wds_tar(tmp_path / "wds" / "part-000.tar", samples)
    report = fastfeed.verify(tmp_path / "wds")
    damaged = [p for p in report.problems if "damaged JPEG data" in p]
    assert len(damaged) == 2 and "'s002'" in damaged[0] and "'s006'" in damaged[1], report.problems
    assert all("part-000.tar" in p and "re-create the tar" in p for p in damaged)
    assert report.samples == 8
