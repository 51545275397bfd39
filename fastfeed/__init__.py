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
import sys
import types
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "BadFileError": "fastfeed.errors",
    "BalanceReport": "fastfeed.balance",
    "ConfigError": "fastfeed.errors",
    "CostModel": "fastfeed.costmodel",
    "DatasetIndex": "fastfeed.index",
    "DestinationError": "fastfeed.errors",
    "DistributedLengthBucketSampler": "fastfeed.samplers",
    "DistributedTokenBudgetSampler": "fastfeed.samplers",
    "DoctorReport": "fastfeed.doctor_report",
    "DuplicateKeyError": "fastfeed.errors",
    "EmptySourceError": "fastfeed.errors",
    "FastfeedError": "fastfeed.errors",
    "FitReport": "fastfeed.costmodel",
    "IndexMismatchError": "fastfeed.errors",
    "IndexVersionError": "fastfeed.errors",
    "Loader": "fastfeed.loader",
    "LoaderStats": "fastfeed.stats",
    "MissingDependencyError": "fastfeed.errors",
    "PackPlan": "fastfeed.packplan",
    "PoorFitWarning": "fastfeed.costmodel",
    "ShapeSetupWarning": "fastfeed.calibration",
    "RemoteError": "fastfeed.errors",
    "SampleError": "fastfeed.errors",
    "ShardError": "fastfeed.errors",
    "ShardPlan": "fastfeed.packplan",
    "ShardResult": "fastfeed.packwrite",
    "SourceError": "fastfeed.errors",
    "StateError": "fastfeed.errors",
    "TuneResult": "fastfeed.tune",
    "UnsafePathError": "fastfeed.errors",
    "VerifyReport": "fastfeed.verify",
    "balance_report": "fastfeed.balance",
    "calibrate": "fastfeed.calibration",
    "doctor": "fastfeed.doctor",
    "finalize": "fastfeed.pack",
    "fit_cost_model": "fastfeed.costmodel",
    "info": "fastfeed.verify",
    "loader": "fastfeed.loader",
    "open_dataset": "fastfeed.dataset",
    "pack": "fastfeed.pack",
    "plan_pack": "fastfeed.packplan",
    "resolve_lengths": "fastfeed.samplers",
    "resolve_world": "fastfeed.dist",
    "tune": "fastfeed.tune",
    "verify": "fastfeed.verify",
    "write_shard": "fastfeed.packwrite",
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


class _Package(types.ModuleType):
    """Keeps public functions ahead of same-named submodules.

    ``fastfeed.pack`` is the function even after ``fastfeed/pack.py`` was imported
    (the import system sets the submodule as a package attribute). Import the module
    itself with ``importlib.import_module("fastfeed.pack")`` or ``from fastfeed.pack import ...``.
    """

    def __getattribute__(self, name: str) -> Any:
        if name in _SHADOWED:
            return __getattr__(name)
        return super().__getattribute__(name)


# public functions whose name is also a submodule's
_SHADOWED = frozenset(n for n, m in _EXPORTS.items() if m == f"fastfeed.{n}")
sys.modules[__name__].__class__ = _Package
