"""Sources for the raw-pixel tests (``pack --store raw|mixed:P``): real JPEG/PNG files of several sizes.

The photos carry a position code (red grows left to right, green top to bottom), so a crop taken
from the wrong box shows in the pixels, plus coarse random blocks in blue; the messy kinds of
:func:`_pack_data.messy_images` (grayscale, CMYK, EXIF-rotated, PNG named .jpg, alpha, 16-bit,
1x1) come along.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from _pack_data import messy_images

#: (width, height) of the coded photos, one per file, several sizes and aspect ratios
SIZES = [(96, 72), (64, 64), (120, 50), (40, 90), (150, 110), (33, 47), (80, 60), (200, 130)]


def coded_photo(size: tuple[int, int], seed: int, quality: int = 95) -> bytes:
    """A JPEG whose red/green channels code the position and whose blue is coarse noise."""
    w, h = size
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    coarse = rng.integers(0, 256, size=(max(2, h // 12), max(2, w // 12)), dtype=np.uint8)
    blue = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), np.float32)
    arr = np.stack([x, y, blue], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def write_raw_source(root: Path, *, copies: int = 2, messy: bool = True) -> dict[str, tuple[int, int]]:
    """An ImageFolder (2 classes) of coded photos (``copies`` of each size) and the messy images.

    Returns relative path -> displayed (width, height).
    """
    out: dict[str, tuple[int, int]] = {}
    n = 0
    for c in range(copies):
        for size in SIZES:
            rel = f"c{n % 2}/photo{n:03d}.jpg"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(coded_photo(size, n))
            out[rel] = size
            n += 1
    if messy:
        for i, (name, (data, size)) in enumerate(sorted(messy_images().items())):
            rel = f"c{i % 2}/{name}"
            (root / rel).write_bytes(data)
            out[rel] = size
    return out
