"""Datasets and settings shared by the DALI tests and the backend harness (tests/loading/test_backends.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastfeed
from fastfeed.formats.tar import TarShardWriter
from fastfeed.packed.index import DatasetIndex, ShardInfo
from tools.synth import make_jpeg

#: decode="dali" in its CPU-only mode, small and explicit (no tune lookup, no GPU).
DALI_CPU = dict(decode="dali", dali=fastfeed.Dali(device_id=None, num_threads=1, hw_decoder_load=0.65,
                                                  prefetch_queue_depth=2, num_pipelines=1))
_DALI_FIELDS = {f.name for f in dataclasses.fields(fastfeed.Dali)}


def dali_cpu(**kw: Any) -> dict[str, Any]:
    """``DALI_CPU`` with ``kw``: its fields of :class:`fastfeed.Dali` (``num_threads=``, ``output=``, ...)
    change the ``dali`` group, the others are ``loader()`` keywords."""
    knobs = {k: kw.pop(k) for k in list(kw) if k in _DALI_FIELDS}
    return {**DALI_CPU, **kw, "dali": dataclasses.replace(DALI_CPU["dali"], **knobs)}


def require_dali() -> Any:
    """nvidia.dali, or skip the test (CI installs the ``dali`` extra)."""
    return pytest.importorskip("nvidia.dali")


def write_image_folder(root: Path, sizes: list[tuple[int, int]], *, classes: int = 3,
                       texture: float = 3.0) -> Path:
    """An ImageFolder of smooth photo-like JPEGs (smooth, so resamplers agree closely)."""
    rng = np.random.default_rng(7)
    for i, size in enumerate(sizes):
        d = root / f"c{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:04d}.jpg").write_bytes(make_jpeg(rng, size, texture=texture))
    return root


def tar_dataset(root: Path, samples: list[tuple[str, dict[str, bytes]]], per_shard: int,
                *, labels: list[int] | None = None) -> Path:
    """A tar dataset with DALI index files, written with the format writers (for samples
    ``pack`` would refuse)."""
    root.mkdir(parents=True, exist_ok=True)
    shards, offsets = [], []
    for s in range(0, len(samples), per_shard):
        name = f"shard-{s // per_shard:06d}.tar"
        w = TarShardWriter(root / name)
        chunk = samples[s : s + per_shard]
        for key, fields in chunk:
            offsets.append(w.add(key, fields))
        (root / name.replace(".tar", ".idx")).write_text(w.dali_index())
        size, sha = w.close()
        shards.append(ShardInfo(name, len(chunk), size, sha, name.replace(".tar", ".idx")))
    fields = tuple(sorted({f for _, fs in samples for f in fs}))
    idx = DatasetIndex(format="tar", num_samples=len(samples), shards=tuple(shards), fields=fields)
    lab = None if labels is None else np.array(labels)
    idx.with_arrays(offsets=np.array(offsets), labels=lab).save(root)
    return root


def corrupt_samples() -> list[tuple[str, dict[str, bytes]]]:
    """14 samples; k005's JPEG is garbage and k009 has no image."""
    rng = np.random.default_rng(3)
    samples = [(f"k{i:03d}", {"jpg": make_jpeg(rng, (24, 20)), "cls": b"%d" % (i % 2)}) for i in range(14)]
    samples[5] = ("k005", {"jpg": b"\xff\xd8\xff not really a jpeg " * 20, "cls": b"1"})
    samples[9] = ("k009", {"txt": b"no image here", "cls": b"1"})
    return samples
