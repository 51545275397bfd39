"""The Ray engine of ``fastfeed pack`` (``--engine ray``): one Ray task per shard.

The driver plans once (:func:`~fastfeed.packing.plan.plan_pack`: list, group by key, order,
cut into shards), then :func:`run_ray` submits one task per shard to the cluster; each
task runs the local packer's :func:`~fastfeed.packing.write.write_shard` for its shard, so
shards, DALI index files and the index are byte-identical to ``--engine local``. The
driver writes the index last (:func:`~fastfeed.packing.finish.finalize`).

Where the bytes go:

- DST a folder: it must be on a file system that every node mounts at the same path
  (NFS, Lustre, a FUSE-mounted bucket); a task that cannot see DST (or SRC) fails with
  an error saying so instead of writing elsewhere;
- DST an fsspec URL (``s3://bucket/prefix``): nodes need no common disk; each task
  writes its shard to local temporary space and uploads it, published only when
  complete (:mod:`fastfeed.packing.engines.objstore`).

Faults: a task whose worker or node dies is retried (``max_retries``) on another node;
tasks are idempotent (temporary name + rename, or a whole-object upload) so a retry, or
a straggler of a lost node, can only write the same bytes. Errors in the data (a bad
file with ``on_error="raise"``) are not retried: the first one stops the job, with the
same message as the local packer. Re-running the same command resumes: complete
shards are reused after their checksums are checked.

JPEG restart markers (``jpeg_restarts``, on by default where ``fastfeed._jpegroi`` is built)
need the extension in the process that writes a shard, and a shard without them has other
bytes. So the driver decides once for every shard, before planning
(:func:`cluster_restarts`): it asks one worker of every node; when some node lacks the
extension, the default packs every shard without markers (one warning naming the nodes)
and ``jpeg_restarts=True`` stops with an error naming them. A task on a node that joins
later without it fails with a message saying so, rather than writing other bytes.

Progress: the driver reports each finished shard to ``progress`` (the local engine's
``(files_done, files_total, bytes_done, bytes_total)`` callback; if the callback also
has a ``shards_done(done, total)`` method, that is called too) and logs shards done,
files/s, MB/s and the ETA on the ``fastfeed.pack.ray`` logger every 30 seconds.

Example:
    >>> import fastfeed
    >>> fastfeed.pack("/nfs/laion", "s3://bucket/laion-ff", engine="ray",
    ...               ray_address="auto")                                 # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

from fastfeed import __version__
from fastfeed.decode import roi
from fastfeed.errors import (
    ConfigError,
    DestinationError,
    FastfeedError,
    SourceError,
    missing_dependency,
)
from fastfeed.packed.layout import JOB_RECORD, RESUME_DIR
from fastfeed.packing.options import RESTARTS_FIX
from fastfeed.packing.plan import PackPlan
from fastfeed.packing.write import ShardResult, write_shard
from fastfeed.storage.remote import is_url

__all__ = ["Writer", "cluster_restarts", "connection", "require_ray", "run_ray", "shard_plan"]

log = logging.getLogger("fastfeed.pack.ray")

#: ``progress(files_done, files_total, bytes_done, bytes_total)``, as for the local engine.
Progress = Callable[[int, int, int, int], None]
#: Writes shard ``number`` of a plan somewhere other than ``plan.dst`` (``writer(plan, number)``), e.g.
#: ``functools.partial(write_shard_remote, dest=...)`` (:mod:`fastfeed.packing.engines.objstore`).
Writer = Callable[[PackPlan, int], ShardResult]
_LOG_EVERY = 30.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise missing_dependency("ray", "ray", "Packing with engine='ray'") from None
    return ray


def require_ray() -> None:
    """Raise MissingDependencyError (with the pip line) now, not after planning, when Ray is absent."""
    _ray()


def shard_plan(plan: PackPlan, number: int) -> PackPlan:
    """``plan`` reduced to shard ``number``: what its task needs, and nothing more.

    The whole plan of a 100-million-file source is gigabytes; a task gets one shard's
    samples. ``write_shard(shard_plan(plan, n), 0)`` writes exactly what
    ``write_shard(plan, n)`` writes (same shard number, name and fingerprint).

    Example:
        >>> sub = shard_plan(plan, 7); sub.shards[0].number                  # doctest: +SKIP
        7
    """
    return replace(plan, shards=(plan.shards[number],), skipped=())


# ---------------------------------------------------------------- on a node
def _node() -> str:
    try:
        import ray
    except ImportError:  # pragma: no cover - tasks only run where Ray is installed
        return socket.gethostname()
    return str(ray.util.get_node_ip_address())


def _jpegroi_here() -> tuple[str, str]:
    """On a node: (its address, why ``fastfeed._jpegroi`` does not load there, or ``""``)."""
    return _node(), roi.why_not_built()


def _check_visible(sub: PackPlan, local_dst: bool) -> None:
    """Fail clearly when this node cannot see SRC (or a folder DST) at the planned path."""
    node = _node()
    where = sub.source.root  # "" for a datasets.Dataset, which travels in the plan
    if where and not is_url(where) and not os.path.exists(where):
        raise SourceError(
            f"{where}: not found on Ray node {node}; every node must see SRC at the same path "
            "(a shared file system), or pass SRC as a URL (s3://...)"
        )
    if local_dst and not os.path.isfile(os.path.join(sub.dst, JOB_RECORD)):
        raise DestinationError(
            f"{sub.dst}: not found on Ray node {node} (no {RESUME_DIR}/job.json there); with "
            "--engine ray, DST must be on a file system every node mounts at the same path, or an "
            "object-store URL (s3://bucket/prefix)"
        )


def _write_task(sub: PackPlan, writer: Writer | None, version: str) -> tuple[ShardResult, str]:
    """One Ray task: write (or reuse) the single shard of ``sub`` (``writer``, or
    :func:`~fastfeed.packing.write.write_shard` into the shared DST); returns (result, node)."""
    if version != __version__:
        raise ConfigError(
            f"Ray node {_node()} runs fastfeed {__version__}, the driver {version}; install the same "
            "fastfeed on every node (or pass it in the job's runtime_env)"
        )
    _check_visible(sub, local_dst=writer is None)
    result = write_shard(sub, 0) if writer is None else writer(sub, 0)
    return result, _node()


# ---------------------------------------------------------------- on the driver
class _Meter:
    """Shards, files and bytes done; rates and ETA for the callback and the log."""

    def __init__(self, plan: PackPlan, progress: Progress | None) -> None:
        self.shards_total = len(plan.shards)
        self.files_total = plan.total_files
        self.bytes_total = plan.total_bytes
        self.progress = progress
        self.shards = self.files = self.bytes = self.reused = 0
        self.written_bytes = self.written_files = 0
        self.nodes: Counter[str] = Counter()
        self.start = time.monotonic()
        self.last_log = self.start
        self._report()

    def _report(self) -> None:
        if self.progress is None:
            return
        self.progress(self.files, self.files_total, self.bytes, self.bytes_total)
        shards_done = getattr(self.progress, "shards_done", None)
        if callable(shards_done):
            shards_done(self.shards, self.shards_total)

    def done(self, r: ShardResult, node: str) -> None:
        self.shards += 1
        self.files += r.files_read
        self.bytes += r.bytes_read
        if r.reused:
            self.reused += 1
        else:
            self.written_files += r.files_read
            self.written_bytes += r.bytes_read
        self.nodes[node] += 1
        self._report()
        if time.monotonic() - self.last_log >= _LOG_EVERY:
            log.info("%s", self.line())
            self.last_log = time.monotonic()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.written_bytes / elapsed
        left = self.bytes_total - self.bytes
        eta = "?" if rate <= 0 else _duration(left / rate)
        return (f"{self.shards}/{self.shards_total} shards, {self.written_files / elapsed:,.0f} files/s, "
                f"{rate / 1e6:.1f} MB/s, ETA {eta}")


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _connect(ray: Any, address: str | None) -> bool:
    """Connect to the cluster (or reuse the driver's connection); True when we own it."""
    if ray.is_initialized():
        if address is not None:
            log.info("Ray is already initialised in this process; using that connection, not %s", address)
        return False
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as e:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address or 'RAY_ADDRESS / a new local instance'} ({e}); "
            "pass --ray-address HOST:PORT of the head node (as printed by `ray start --head`), or 'auto' "
            "on a node of the cluster"
        ) from None
    return True


@contextmanager
def connection(address: str | None) -> Iterator[None]:
    """Connected to the cluster for a whole pack (the nodes' check, then the tasks); a
    connection this opens is closed at the end, one the caller had is kept.

    Example:
        >>> with connection("auto"):                                         # doctest: +SKIP
        ...     run_ray(plan_pack("train", "/nfs/train-ff", jpeg_restarts=cluster_restarts(None)))
    """
    ray = _ray()
    owned = _connect(ray, address)
    try:
        yield
    finally:
        if owned:
            ray.shutdown()


def _nodes_lacking_jpegroi(ray: Any) -> list[str]:
    """``"address (why)"`` of every live node with CPUs whose worker cannot load ``fastfeed._jpegroi``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_jpegroi_here)
    refs = [probe.options(name="fastfeed-pack jpegroi check",
                          scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    lacking = []
    for ref in refs:
        try:
            node, why = ray.get(ref)
        except ray.exceptions.RayError as e:  # a node that left meanwhile writes no shard
            log.info("a Ray node did not answer the fastfeed._jpegroi check (%s); going on without it", e)
            continue
        if why:
            lacking.append(f"{node} ({why})")
    return sorted(lacking)


def cluster_restarts(asked: bool | None) -> bool | None:
    """``jpeg_restarts`` for a pack on the connected cluster, decided once for every shard.

    Restart markers need ``fastfeed._jpegroi`` where a shard is written, and there is no
    fallback that writes the same bytes, so every node must have it or no shard gets them.
    Returns ``asked`` when the driver lacks the extension too (planning then decides as
    for the local engine) or every node has it; ``False``, with a warning naming the
    nodes, for the default (``None``) when some node lacks it.

    Raises:
        ConfigError: ``asked`` is True and some node lacks the extension.

    Example:
        >>> with connection("auto"):                                         # doctest: +SKIP
        ...     cluster_restarts(None)
        True
    """
    if asked is False or not roi.built():
        return asked
    lacking = _nodes_lacking_jpegroi(_ray())
    if not lacking:
        return asked
    where = ", ".join(lacking)
    if asked:
        raise ConfigError(f"jpeg_restarts=True needs fastfeed's C extension fastfeed._jpegroi on every Ray node, "
                          f"and it does not load on {where}: {RESTARTS_FIX} on those nodes; or pass "
                          "jpeg_restarts=False (--no-jpeg-restarts)")
    log.warning("pack: JPEGs stored as they are, without restart markers, in every shard: fastfeed._jpegroi "
                "does not load on Ray node(s) %s (it does on the driver), and a shard must not depend on the node "
                "that writes it; random crops of these shards then decode the whole JPEG. For markers: %s on "
                "those nodes, or pack with --engine local", where, RESTARTS_FIX)
    return False


def _window(ray: Any) -> int:
    """Tasks kept in flight: twice the cluster's CPUs (it may grow or shrink while we run)."""
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
    except Exception:  # the GCS is briefly unreachable (a node being replaced): keep going
        cpus = 1
    return max(4, 2 * cpus)


def _failure(ray: Any, e: BaseException, shard: str, max_retries: int) -> BaseException:
    """The error to raise for a failed task: what the task raised (as the local engine
    raises it: a SourceError naming the file, an OSError, ...), or, when its worker or node
    kept dying, what to do next."""
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        return cause if isinstance(cause, BaseException) else e
    return FastfeedError(
        f"{shard}: its Ray task failed {max_retries + 1} time(s), last with {type(e).__name__}: {e}. "
        "Shards already complete are kept: re-run the same command to resume (raise max_retries "
        "if nodes come and go, e.g. spot instances)"
    )


def run_ray(
    plan: PackPlan,
    *,
    writer: Writer | None = None,
    ray_address: str | None = None,
    max_retries: int = 3,
    progress: Progress | None = None,
) -> list[ShardResult]:
    """Run :func:`~fastfeed.packing.write.write_shard` for every shard of ``plan`` as Ray tasks.

    Args:
        plan: from :func:`~fastfeed.packing.plan.plan_pack`, made on this (driver) machine.
        writer: writes a shard elsewhere, e.g. publishes it to an object-store prefix
            (``functools.partial(write_shard_remote, dest=dest)``; ``plan.dst`` is then a local
            staging folder); None: :func:`~fastfeed.packing.write.write_shard` into ``plan.dst``,
            a folder every node sees.
        ray_address: the cluster (``HOST:PORT`` of the head, ``"auto"``, ``ray://...``);
            None: the current connection, else ``RAY_ADDRESS``, else a new local Ray.
        max_retries: retries of a task whose worker or node died.
        progress: called as each shard finishes (see the module doc).

    Returns:
        One :class:`~fastfeed.packing.write.ShardResult` per shard, in shard order.

    Raises:
        SourceError: a bad input (``on_error="raise"``), exactly as the local engine.
        FastfeedError: a task kept failing; complete shards stay for a re-run.

    Example:
        >>> results = run_ray(plan, ray_address="auto")                     # doctest: +SKIP
    """
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigError(f"max_retries={max_retries!r}: must be an integer >= 0")
    ray = _ray()
    owned = _connect(ray, ray_address)
    try:
        return _run(ray, plan, writer, max_retries, _Meter(plan, progress))
    finally:
        if owned:
            ray.shutdown()


def _run(ray: Any, plan: PackPlan, writer: Writer | None, max_retries: int, meter: _Meter) -> list[ShardResult]:
    # SPREAD: shards are I/O-heavy and independent, so use every node's disks and network
    task = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False,
                      scheduling_strategy="SPREAD")(_write_task)
    todo = deque(range(len(plan.shards)))
    pending: dict[Any, int] = {}
    results: dict[int, ShardResult] = {}
    log.info("%d shard(s) on a Ray cluster of %s CPU(s)", len(plan.shards),
             ray.cluster_resources().get("CPU", "?"))
    try:
        while todo or pending:
            window = _window(ray)
            while todo and len(pending) < window:
                n = todo.popleft()
                name = plan.shards[n].name
                ref = task.options(name=f"fastfeed-pack {name}").remote(shard_plan(plan, n), writer, __version__)
                pending[ref] = n
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if ready:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in ready:
                n = pending.pop(ref)
                try:
                    result, node = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise _failure(ray, e, plan.shards[n].name, max_retries) from None
                results[n] = result
                meter.done(result, node)
    except BaseException:
        for ref in pending:
            ray.cancel(ref)
        raise
    log.info("%s; %d reused from an earlier run; shards per node: %s", meter.line(), meter.reused,
             ", ".join(f"{node} {count}" for node, count in sorted(meter.nodes.items())))
    ordered = [results[n] for n in range(len(plan.shards))]
    if writer is None:
        _check_shards_here(plan, ordered)
    return ordered


def _check_shards_here(plan: PackPlan, results: list[ShardResult]) -> None:
    """Every shard a node wrote must be in DST as the driver sees it (else DST is not shared)."""
    for r in results:
        path = os.path.join(plan.dst, r.name)
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        if size != r.bytes:
            raise DestinationError(
                f"{path}: written by a Ray node but {'missing' if size < 0 else 'of another size'} here "
                "on the driver, so DST is not one shared file system; pack into a folder every node "
                "and the driver mount at the same path, or into an object-store URL (s3://bucket/prefix)"
            )
