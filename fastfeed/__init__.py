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
    "BalanceReport": "fastfeed.sampling.balance",
    "ConfigError": "fastfeed.errors",
    "CostModel": "fastfeed.sampling.costmodel",
    "Crop": "fastfeed.loading.groups",
    "Dali": "fastfeed.loading.groups",
    "DatasetIndex": "fastfeed.packed.index",
    "DestinationError": "fastfeed.errors",
    "DistributedAspectRatioSampler": "fastfeed.sampling.aspect",
    "DistributedLengthBucketSampler": "fastfeed.sampling.samplers",
    "DistributedTokenBudgetSampler": "fastfeed.sampling.samplers",
    "DoctorReport": "fastfeed.diagnosis.report",
    "DuplicateKeyError": "fastfeed.errors",
    "EmptySourceError": "fastfeed.errors",
    "FastfeedError": "fastfeed.errors",
    "FitReport": "fastfeed.sampling.costmodel",
    "IndexMismatchError": "fastfeed.errors",
    "IndexVersionError": "fastfeed.errors",
    "InfoReport": "fastfeed.packed.checks",
    "LightningStepMonitor": "fastfeed.diagnosis.callbacks",
    "Loader": "fastfeed.loading.cpu.loader",
    "LoaderStats": "fastfeed.loading.stats",
    "MissingDependencyError": "fastfeed.errors",
    "MonitorReport": "fastfeed.diagnosis.monitor_report",
    "Order": "fastfeed.loading.groups",
    "PackPlan": "fastfeed.packing.plan",
    "PoorFitWarning": "fastfeed.sampling.costmodel",
    "RemoteError": "fastfeed.errors",
    "SampleError": "fastfeed.errors",
    "ShapeSetupWarning": "fastfeed.sampling.calibration",
    "ShardError": "fastfeed.errors",
    "ShardPlan": "fastfeed.packing.plan",
    "ShardResult": "fastfeed.packing.write",
    "Source": "fastfeed.loading.sources",
    "SourceError": "fastfeed.errors",
    "StallError": "fastfeed.errors",
    "StateError": "fastfeed.errors",
    "StepMonitor": "fastfeed.diagnosis.monitor",
    "Storage": "fastfeed.loading.groups",
    "Tokens": "fastfeed.loading.groups",
    "TrainerStepMonitor": "fastfeed.diagnosis.callbacks",
    "TuneResult": "fastfeed.tuning.report",
    "UnsafePathError": "fastfeed.errors",
    "VerifyReport": "fastfeed.packed.checks",
    "Workers": "fastfeed.loading.groups",
    "balance_report": "fastfeed.sampling.balance",
    "calibrate": "fastfeed.sampling.calibration",
    "doctor": "fastfeed.diagnosis.api",
    "finalize": "fastfeed.packing.api",
    "fit_cost_model": "fastfeed.sampling.costmodel",
    "info": "fastfeed.packed.checks",
    "loader": "fastfeed.loading.api",
    "open_dataset": "fastfeed.loading.cpu.dataset",
    "pack": "fastfeed.packing.api",
    "plan_pack": "fastfeed.packing.plan",
    "resolve_lengths": "fastfeed.sampling.samplers",
    "resolve_world": "fastfeed.dist",
    "tune": "fastfeed.tuning.api",
    "verify": "fastfeed.packed.checks",
    "write_shard": "fastfeed.packing.write",
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
