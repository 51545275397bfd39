"""Small real datasets for the loader tests: tar or LMDB shards plus a fastfeed index.

Written with the shard writers and :meth:`DatasetIndex.save` directly (the same files
``fastfeed pack`` writes), so the loader tests do not depend on pack's options.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fastfeed.formats import FORMATS
from fastfeed.packed.index import DatasetIndex, ShardInfo
from tools.synth import make_jpeg

Fields = Callable[[int, np.random.Generator], dict[str, bytes]]


def tiny_jpeg(i: int, size: tuple[int, int] = (40, 30)) -> bytes:
    """A small photo-like JPEG whose size varies a little with ``i``."""
    rng = np.random.default_rng(i)
    return make_jpeg(rng, (size[0] + i % 5, size[1] + i % 3), quality=80)


def image_fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
    """jpg + cls + json: an image-classification sample."""
    return {"jpg": tiny_jpeg(i), "cls": str(i % 3).encode(), "json": json.dumps({"i": i}).encode()}


def text_fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
    """txt + cls: cheap samples for order and resume tests."""
    return {"txt": f"sample {i}".encode(), "cls": str(i % 5).encode()}


def write_dataset(
    root: str | Path,
    *,
    fmt: str = "tar",
    shard_counts: Sequence[int] = (7, 7, 7, 4),
    fields: Fields = text_fields,
    labels: bool = True,
) -> DatasetIndex:
    """Write shards of ``shard_counts`` samples (keys ``s00000``...) and the index; return it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    writer_cls, _, suffix = FORMATS[fmt]
    shards, offsets, labs, seen = [], [], [], set()
    i = 0
    rng = np.random.default_rng(0)
    for s, count in enumerate(shard_counts):
        name = f"shard-{s:06d}{suffix}"
        w = writer_cls(root / name)
        for _ in range(count):
            f = fields(i, rng)
            seen.update(f)
            offsets.append(w.add(f"s{i:05d}", f))
            labs.append(int(f["cls"]) if "cls" in f else -1)
            i += 1
        size, sha = w.close()
        shards.append(ShardInfo(name=name, samples=count, bytes=size, sha256=sha))
    index = DatasetIndex(
        format=fmt, num_samples=i, shards=tuple(shards), fields=tuple(sorted(seen)),
        classes=tuple(str(c) for c in range(5)) if labels else None, input="tests",
    ).with_arrays(offsets=np.array(offsets, dtype=np.int64), labels=np.array(labs) if labels else None)
    index.save(root)
    return DatasetIndex.load(root)


def keys_of(batches: Sequence[dict]) -> list[str]:
    """All sample keys of a stream of batches, in order."""
    return [k for b in batches for k in b["__key__"]]


def jpeg_bytes(arr: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
