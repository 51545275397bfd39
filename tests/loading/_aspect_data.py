"""Images of every shape for the aspect-ratio loader tests (both backends): made with Pillow, packed."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import fastfeed
from fastfeed.packed.index import DatasetIndex
from fastfeed.sampling.aspect import DistributedAspectRatioSampler

#: (width, height) of the stored images: landscape, portrait, square and wide ones
SHAPES = [(128, 96), (96, 128), (160, 64), (100, 100), (120, 90), (90, 120), (150, 60), (110, 110)]


def photo(size: tuple[int, int], seed: int) -> Image.Image:
    """A smooth photo-like RGB image (smooth, so resamplers agree closely)."""
    rng = np.random.default_rng(seed)
    w, h = size
    base = rng.integers(0, 256, size=(max(2, h // 12), max(2, w // 12), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BICUBIC)


def save(img: Image.Image, fmt: str = "JPEG", **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 95} if fmt == "JPEG" else {}) | kw)
    return buf.getvalue()


def write_images(root: Path, n: int = 24, extra: dict[str, bytes] | None = None) -> Path:
    """An ImageFolder of ``n`` JPEGs of the :data:`SHAPES` (two classes), and ``extra`` files by name."""
    for i in range(n):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:03d}.jpg").write_bytes(save(photo(SHAPES[i % len(SHAPES)], i)))
    for name, data in (extra or {}).items():
        (root / "c0" / name).write_bytes(data)
    return root


def pack(tmp_path: Path, **kw: Any) -> Path:
    src = write_images(tmp_path / "src", **kw)
    dst = tmp_path / "ff"
    fastfeed.pack(src, dst, samples_per_shard=7, shuffle=False)
    return dst


def sampler(dst: Path | DatasetIndex, **kw: Any) -> DistributedAspectRatioSampler:
    args: dict[str, Any] = {"resolution": 64, "step": 16, "batch_size": 3, "num_replicas": 1, "rank": 0, "seed": 3}
    return DistributedAspectRatioSampler(dst, **{**args, **kw})


def odd_images() -> dict[str, tuple[bytes, tuple[int, int]]]:
    """name -> (bytes, displayed (height, width)): grayscale, CMYK, alpha, palette and EXIF-rotated."""
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 128 wide x 80 high, displayed rotated: 80 wide x 128 high
    rgba = photo((120, 80), 11).convert("RGBA")
    rgba.putalpha(Image.fromarray(np.full((80, 120), 128, np.uint8)))
    pal = photo((96, 96), 12).convert("P", palette=Image.ADAPTIVE, colors=16)
    return {
        "gray.jpg": (save(photo((128, 96), 8).convert("L")), (96, 128)),
        "cmyk.jpg": (save(photo((96, 128), 9).convert("CMYK")), (128, 96)),
        "rotated.jpg": (save(photo((128, 80), 10), exif=exif), (128, 80)),
        "alpha.png": (save(rgba, "PNG"), (80, 120)),
        "palette.png": (save(pal, "PNG", transparency=0), (96, 96)),
    }
