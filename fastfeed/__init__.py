"""fastfeed: remove the input-pipeline bottlenecks of multi-GPU PyTorch training.

- :func:`pack` turns folders of small files into tar (WebDataset) or LMDB shards plus a
  versioned index;
- :func:`loader` is a rank- and worker-aware, deterministic, resumable DataLoader over them;
- :func:`tune` measures the loader and picks ``num_workers`` / ``prefetch_factor``;
- the length-bucketed distributed samplers give every rank equal steps and near-equal work;
- :func:`doctor` says where the input bottleneck is.

Example:
    >>> import fastfeed
    >>> fastfeed.pack("imagenet/train", "/data/imagenet-ff")          # doctest: +SKIP
    >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224)  # doctest: +SKIP

Public names are imported lazily, so ``import fastfeed`` stays cheap and optional
dependencies are only needed by the features that use them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "BadFileError": "fastfeed.errors",
    "ConfigError": "fastfeed.errors",
    "DatasetIndex": "fastfeed.index",
    "DestinationError": "fastfeed.errors",
    "DuplicateKeyError": "fastfeed.errors",
    "EmptySourceError": "fastfeed.errors",
    "FastfeedError": "fastfeed.errors",
    "IndexMismatchError": "fastfeed.errors",
    "IndexVersionError": "fastfeed.errors",
    "MissingDependencyError": "fastfeed.errors",
    "RemoteError": "fastfeed.errors",
    "SampleError": "fastfeed.errors",
    "ShardError": "fastfeed.errors",
    "SourceError": "fastfeed.errors",
    "StateError": "fastfeed.errors",
    "UnsafePathError": "fastfeed.errors",
    "resolve_world": "fastfeed.dist",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastfeed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
