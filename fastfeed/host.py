"""Facts about this host that tuning depends on, and memory use of a process tree.

- :func:`cpu_count` is the number of cores this process may actually use: the CPU
  affinity mask (``taskset``, Slurm, Kubernetes cpusets) and, when set, the cgroup CPU
  quota (Docker ``--cpus``), not the machine's total that ``os.cpu_count()`` reports.
- :func:`memory_total` is physical memory, or the cgroup memory limit when lower.
- :func:`worker_cores` is what a rank's loader workers may use: the rank's share of the
  cores less what its training process keeps busy (:func:`trainer_cores`) and the host's
  own share; :func:`shm_free` is the room left in ``/dev/shm``, where workers put batches.
- :func:`process_memory` measures the main process and its children (DataLoader
  workers) by proportional set size (PSS) where Linux offers it, so the pages that
  forked workers share copy-on-write are not counted once per worker; file-backed pages
  (libraries' code, memory-mapped shards: page cache the kernel can drop) are left out
  where the kernel says which they are (``Pss_File``, Linux >= 5.14), so a raw-pixel
  dataset read through its memory map does not count as the workers' memory.

Example:
    >>> cpu_count() >= 1 and memory_total() > 0
    True
    >>> worker_cores(16, 1, gpu=True), worker_cores(2, 1), worker_cores(64, 8, gpu=True)
    (12, 1, 5)
    >>> snap = process_memory()
    >>> snap.main_bytes is None or snap.main_bytes > 0
    True
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostInfo", "MemorySnapshot", "cpu_count", "host_info", "memory_total", "process_memory", "shm_free",
           "trainer_cores", "worker_cores"]

_CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_cpu_quota() -> float | None:
    """CPUs allowed by the cgroup quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), or None."""
    text = _read(_CGROUP / "cpu.max")
    if text:
        quota, _, period = text.strip().partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_s = _read(_CGROUP / "cpu" / "cpu.cfs_quota_us")
    period_s = _read(_CGROUP / "cpu" / "cpu.cfs_period_us")
    if quota_s and period_s and int(quota_s) > 0 and int(period_s) > 0:
        return int(quota_s) / int(period_s)
    return None


def cpu_count() -> int:
    """Cores this process may use (affinity mask and cgroup quota), at least 1.

    Example:
        >>> cpu_count() <= (os.cpu_count() or 1)
        True
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    try:
        quota = _cgroup_cpu_quota()
    except ValueError:  # unreadable cgroup file: ignore the quota, keep the mask
        quota = None
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def memory_total() -> int:
    """Bytes of memory this process may use: physical memory, or the cgroup limit if lower."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX
        total = 0
    for path in (_CGROUP / "memory.max", _CGROUP / "memory" / "memory.limit_in_bytes"):
        text = (_read(path) or "").strip()
        if text.isdigit() and 0 < int(text) < (total or int(text) + 1):
            total = int(text)
            break
    return total


def trainer_cores(gpu: bool) -> int:
    """Cores one training process keeps busy besides its loader's workers.

    One for its Python thread (the step loop: forward, backward and optimizer on the CPU,
    or the kernel launches of a GPU step); with a GPU one more for the pin-memory thread,
    which receives every batch, and CUDA's own threads (the driver's, NCCL's proxies).

    Example:
        >>> trainer_cores(False), trainer_cores(True)
        (1, 2)
    """
    return 2 if gpu else 1


def worker_cores(cores: int | None = None, local_ranks: int = 1, *, gpu: bool = False) -> int:
    """Cores one rank's loader workers may use, at least 0: its share of the host (``cores //
    local_ranks``) less :func:`trainer_cores` and one core in eight of that share for the
    rest of the host (interrupts, the page cache's readers, logging, the ranks' siblings).

    ``cores`` defaults to :func:`cpu_count`. On 16 cores with one GPU rank: 12.

    Example:
        >>> worker_cores(16, 1, gpu=True), worker_cores(32, 4), worker_cores(1, 1)
        (12, 6, 0)
    """
    share = (cpu_count() if cores is None else cores) // max(1, local_ranks)
    return max(0, share - trainer_cores(gpu) - share // 8)


def shm_free() -> int | None:
    """Bytes free in ``/dev/shm`` (where workers' batches live until the main process lets go), or None.

    Example:
        >>> shm_free() is None or shm_free() >= 0
        True
    """
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):  # no /dev/shm (not Linux)
        return None
    return st.f_bavail * st.f_frsize


def _cpu_model() -> str:
    text = _read(Path("/proc/cpuinfo")) or ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class HostInfo:
    """What a tune result depends on about the machine.

    Attributes:
        cores: usable cores (:func:`cpu_count`).
        memory_gib: usable memory in GiB, rounded to one decimal.
        cpu_model: the CPU's model name (``/proc/cpuinfo``), or the machine type.
    """

    cores: int
    memory_gib: float
    cpu_model: str

    def matches(self, other: "HostInfo") -> bool:
        """Same cores and CPU model, memory within 10% (kernels reserve varying amounts)."""
        if self.cores != other.cores or self.cpu_model != other.cpu_model:
            return False
        big = max(self.memory_gib, other.memory_gib, 1e-9)
        return abs(self.memory_gib - other.memory_gib) / big <= 0.10

    def to_json(self) -> dict[str, object]:
        return {"cores": self.cores, "memory_gib": self.memory_gib, "cpu_model": self.cpu_model}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> "HostInfo":
        return cls(int(d["cores"]), float(d["memory_gib"]), str(d.get("cpu_model", "")))


def host_info() -> HostInfo:
    """This host's :class:`HostInfo`, read now (not cached: affinity can change)."""
    return HostInfo(cpu_count(), round(memory_total() / 2**30, 1), _cpu_model())


# ---------------------------------------------------------------------- process memory
@dataclass(frozen=True)
class MemorySnapshot:
    """Memory of this process and its live children at one moment.

    Attributes:
        main_bytes: this process (PSS without file-backed pages, else RSS), or None where
            it cannot be read.
        workers_bytes: the sum over child processes (DataLoader workers), or None.
        workers: how many children were counted.
    """

    main_bytes: int | None
    workers_bytes: int | None
    workers: int

    @property
    def total_bytes(self) -> int | None:
        """Main process plus workers, or None when unknown."""
        if self.main_bytes is None:
            return None
        return self.main_bytes + (self.workers_bytes or 0)


def _kib_fields(text: str) -> dict[str, int]:
    """``Name:   123 kB`` lines (``/proc/PID/smaps_rollup``, ``status``) as {name: bytes}."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


def _pid_memory(pid: int | str) -> int | None:
    """Memory of ``pid`` in bytes: its PSS without file-backed pages (``smaps_rollup``: ``Pss``
    minus ``Pss_File`` where the kernel gives it), else its RSS (``status``), else None.

    Example:
        >>> m = _pid_memory(os.getpid())
        >>> m is None or m > 0
        True
    """
    rollup = _kib_fields(_read(Path(f"/proc/{pid}/smaps_rollup")) or "")
    if "Pss" in rollup:
        return rollup["Pss"] - rollup.get("Pss_File", 0)
    return _kib_fields(_read(Path(f"/proc/{pid}/status")) or "").get("VmRSS")


def _children(pid: int) -> list[str]:
    """Direct children of ``pid`` (``/proc/<pid>/task/*/children``, else a /proc scan)."""
    tasks = Path(f"/proc/{pid}/task")
    found: list[str] = []
    try:
        for task in tasks.iterdir():
            found += (_read(task / "children") or "").split()
        return found
    except OSError:
        pass
    for stat in Path("/proc").glob("[0-9]*/stat"):  # kernels without CONFIG_PROC_CHILDREN
        text = _read(stat) or ""
        fields = text.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(stat.parent.name)
    return found


def process_memory(pid: int | None = None) -> MemorySnapshot:
    """Memory of process ``pid`` (default: this one) and of its direct children.

    Example:
        >>> process_memory().workers >= 0
        True
    """
    pid = os.getpid() if pid is None else pid
    main = _pid_memory(pid)
    if main is None:
        return MemorySnapshot(None, None, 0)
    sizes = [m for m in (_pid_memory(c) for c in _children(pid)) if m is not None]
    return MemorySnapshot(main, sum(sizes), len(sizes))
