"""Test inputs for ``fastfeed pack``: real-world-messy images made with Pillow, and helpers."""

from __future__ import annotations

import functools
import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image


def _photo(size: tuple[int, int], seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    w, h = size
    base = rng.integers(0, 256, size=(max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.BICUBIC)
    return img if mode == "RGB" else img.convert(mode)


@functools.lru_cache(maxsize=1)
def messy_images() -> dict[str, tuple[bytes, tuple[int, int]]]:
    """Real-world kinds of image files: name -> (bytes, displayed (width, height)).

    Progressive, grayscale, CMYK (Adobe), EXIF-rotated, a PNG named .jpg, palette PNG
    with transparency, RGBA PNG, 16-bit grayscale PNG, and a tiny 1x1 JPEG.
    """
    out: dict[str, tuple[bytes, tuple[int, int]]] = {}

    def save(img: Image.Image, fmt: str, **kw: object) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    out["progressive.jpg"] = (save(_photo((160, 120), 1), "JPEG", quality=85, progressive=True), (160, 120))
    out["gray.jpg"] = (save(_photo((150, 100), 2, "L"), "JPEG"), (150, 100))
    out["cmyk.jpg"] = (save(_photo((140, 90), 3, "CMYK"), "JPEG"), (140, 90))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, displayed rotated 90 degrees
    out["rotated.jpg"] = (save(_photo((180, 100), 4), "JPEG", exif=exif), (100, 180))
    out["png_named.jpg"] = (save(_photo((130, 130), 5), "PNG"), (130, 130))
    pal = _photo((120, 80), 6).convert("P", palette=Image.ADAPTIVE, colors=16)
    pal.info["transparency"] = 0
    out["palette_alpha.png"] = (save(pal, "PNG", transparency=0), (120, 80))
    rgba = _photo((110, 70), 7).convert("RGBA")
    alpha = np.zeros((70, 110), np.uint8)
    alpha[:, 55:] = 255
    rgba.putalpha(Image.fromarray(alpha))
    out["rgba.png"] = (save(rgba, "PNG"), (110, 70))
    deep = Image.fromarray(np.arange(100 * 60, dtype=np.uint16).reshape(60, 100) * 10)
    out["gray16.png"] = (save(deep, "PNG"), (100, 60))
    out["tiny.jpg"] = (save(Image.new("RGB", (1, 1), (200, 10, 10)), "JPEG"), (1, 1))
    return out


def write_messy_folder(root: Path, classes: int = 2) -> dict[str, tuple[int, int]]:
    """An ImageFolder of :func:`messy_images`, spread over ``classes`` class folders.

    Returns relative path -> displayed size.
    """
    sizes = {}
    for i, (name, (data, size)) in enumerate(sorted(messy_images().items())):
        rel = f"c{i % classes}/{name}"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        sizes[rel] = size
    return sizes


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def shard_samples(dst: Path) -> list[dict]:
    """Every sample of a packed dataset, read by the index's offsets (random access)."""
    from fastfeed.formats import FORMATS
    from fastfeed.packed.index import DatasetIndex

    idx = DatasetIndex.load(dst)
    reader_cls = FORMATS[idx.format][1]
    out = []
    starts = idx.shard_starts
    for s in range(len(idx.shards)):
        reader = reader_cls(dst / idx.shards[s].name)
        for i in range(int(starts[s]), int(starts[s + 1])):
            off, size = idx.offsets[i]
            out.append(reader.read(int(off), int(size)))
        reader.close()
    return out
