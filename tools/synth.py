"""Generate realistic synthetic datasets for demos, tests and benchmarks.

Images look like photos to a JPEG encoder (smooth structure plus texture), so file
sizes and decode costs resemble ImageNet's: ~500x375 at quality 90 gives ~100 KB.

Example:
    >>> import tempfile
    >>> root = make_image_folder(tempfile.mkdtemp(), num_images=4, num_classes=2, size=(64, 48))
    >>> sorted(p.parent.name for p in root.rglob("*.jpg"))
    ['n00000000', 'n00000000', 'n00000001', 'n00000001']
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

__all__ = ["make_image_folder", "make_jpeg", "make_text_jsonl"]


def make_jpeg(
    rng: np.random.Generator, size: tuple[int, int] = (500, 375), quality: int = 90,
    texture: float = 28.0,
) -> bytes:
    """One photo-like JPEG (width, height) as bytes."""
    from PIL import Image

    w, h = size
    gw, gh = max(2, w // 48), max(2, h // 48)
    coarse = rng.integers(0, 256, size=(gh, gw, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.float32)
    noise = rng.normal(0.0, texture, size=(h, w, 1)).astype(np.float32)
    img = np.clip(base + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _write_chunk(args: tuple[str, list[tuple[str, int]], tuple[int, int], int, int, bool]) -> int:
    root, items, size, quality, seed, vary = args
    total = 0
    for rel, i in items:
        rng = np.random.default_rng([seed, i])
        sz = size
        if vary:
            s = rng.uniform(0.8, 1.25)
            sz = (max(16, int(size[0] * s)), max(16, int(size[1] * rng.uniform(0.8, 1.25))))
        data = make_jpeg(rng, sz, quality)
        p = Path(root) / rel
        p.write_bytes(data)
        total += len(data)
    return total


def make_image_folder(
    root: str | os.PathLike[str],
    *,
    num_images: int = 1000,
    num_classes: int = 10,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    seed: int = 0,
    vary_size: bool = False,
    workers: int = 1,
) -> Path:
    """Write an ImageFolder tree ``root/<class>/<n>.jpg`` of photo-like JPEGs.

    Classes are named like ImageNet synsets (``n00000003``); images are assigned to
    classes round-robin. Returns ``root``. Existing files are overwritten.
    """
    root = Path(root)
    classes = [f"n{c:08d}" for c in range(num_classes)]
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
    items = [(f"{classes[i % num_classes]}/img_{i:08d}.jpg", i) for i in range(num_images)]
    chunks = [items[k::max(1, workers * 4)] for k in range(max(1, workers * 4))]
    jobs = [(str(root), ch, size, quality, seed, vary_size) for ch in chunks if ch]
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            list(ex.map(_write_chunk, jobs))
    else:
        for j in jobs:
            _write_chunk(j)
    return root


def make_text_jsonl(
    path: str | os.PathLike[str], *, num_samples: int = 1000, seed: int = 0,
    mean_log_len: float = 5.0, sigma: float = 1.0, min_len: int = 16, max_len: int = 1024,
) -> Path:
    """Write a JSONL manifest of texts whose word counts are lognormal, clamped."""
    import json

    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(mean_log_len, sigma, num_samples), min_len, max_len).astype(int)
    words = np.array(["alpha", "beta", "gamma", "delta", "data", "loader", "gpu", "token"])
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for i, n in enumerate(lens):
            text = " ".join(words[rng.integers(0, len(words), n)])
            f.write(json.dumps({"id": i, "text": text, "label": int(i % 7)}) + "\n")
    return path
