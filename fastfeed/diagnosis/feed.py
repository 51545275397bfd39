"""What the step monitor reads from the loop's input: the loader's kind, settings and stage times.

:class:`LoaderProbe` looks at the iterable ``mon(dl)`` wraps (or the loader a callback attaches):
a fastfeed loader reports its workers' read and decode seconds and its own waits
(:class:`~fastfeed.loading.stats.LoaderStats`), a torch DataLoader its ``num_workers`` and
``prefetch_factor``, any other iterable nothing. :func:`to_device` is the host-to-device copy
``mon(dl, device=...)`` does inside the data wait.

Example:
    >>> LoaderProbe(range(3)).facts()["kind"]
    'iterable'
    >>> 0 < memory_available() <= 1 or memory_available() != memory_available()   # NaN where unknown
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastfeed.loading.stats import LoaderStats

__all__ = ["LoaderProbe", "memory_available", "to_device"]


def memory_available() -> float:
    """The share of host memory available now (``/proc/meminfo``), NaN where unknown."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return int(fields["MemAvailable"].split()[0]) / int(fields["MemTotal"].split()[0])
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return float("nan")


def to_device(batch: Any, device: Any) -> Any:
    """The batch with every tensor moved to ``device`` (``non_blocking``); other values as they are."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


class LoaderProbe:
    """What the monitor reads from the loader it iterates: its kind, settings and (fastfeed) stage times."""

    def __init__(self, loader: Any) -> None:
        from torch.utils.data import DataLoader

        self.loader = loader
        inner = getattr(loader, "iterables", loader)  # Lightning's CombinedLoader around one loader
        loader = inner if not isinstance(inner, (dict, list, tuple)) else loader
        stats = getattr(loader, "stats", None)
        self.stats: LoaderStats | None = stats if isinstance(stats, LoaderStats) else None
        self.kind = "fastfeed" if self.stats is not None else (
            "dataloader" if isinstance(loader, DataLoader) else "iterable")
        workers, prefetch = getattr(loader, "num_workers", None), getattr(loader, "prefetch_factor", None)
        self.num_workers = workers if isinstance(workers, int) else None
        self.prefetch_factor = prefetch if isinstance(prefetch, int) else None
        root = getattr(getattr(loader, "index", None), "root", None)
        self.path = str(root) if root else None
        self._summary = self.stats.summary() if self.stats is not None else None
        self._seen = (-1, -1, 0.0)  # stats.passes, window start step, window wait_s

    def facts(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "path": self.path}

    def delta(self) -> dict[str, float]:
        """The workers' seconds since the last call (fastfeed loaders; else empty)."""
        if self.stats is None:
            return {}
        now = self.stats.summary()
        before, self._summary = self._summary or {}, now
        keys = {"read_s": "read_s", "decode_s": "decode_s", "cpu_s": "load_cpu_s", "load_batches": "load_batches",
                "load_step_s": "step_s"}
        return {k: float(now.get(v, 0.0)) - float(before.get(v, 0.0)) for k, v in keys.items()}

    def wait_since(self) -> float | None:
        """Seconds the loader's ``next()`` waited since the last call (fastfeed stats), or None."""
        s = self.stats
        if s is None:
            return None
        w = s.window()  # cheap; its start moves only when the loader logs its own line
        start = w["last_step"] - w["steps"]
        passes, seen_start, seen_wait = self._seen
        wait = w["wait_s"] - seen_wait if start == seen_start else w["wait_s"]
        if passes != s.passes and passes >= 0:
            wait += s.first_batch_s  # the first batch of a pass is kept apart from the steady waits
        self._seen = (s.passes, start, w["wait_s"])
        return max(0.0, wait)
