"""The stages ``fastfeed doctor`` measures on their own, each through :func:`fastfeed.timing.measure.measure`.

- :func:`storage_probe`: sequential shard reads, cold: local shards are dropped from the
  page cache first (``fsync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)``) and read in 4 MB
  chunks; remote shards are downloaded the way the loader downloads them (waves of
  parallel 8 MB ranged reads, :mod:`fastfeed.storage.remote`), plus the latency of one small
  request. Bytes/s become samples/s through the mean packed bytes per sample.
- :func:`source_probe`: the raw files before packing, a random sample of them read whole
  in random order, cold: what the training loop would pay per sample without ``pack``.
- :func:`decode_probe`: decode + augmentation (the loader's own decoder, same image size,
  crops and transform) of samples already in memory, in 1 process (the per-core
  ceiling) or in one process per core (the host's ceiling), no I/O and no hand-off.
- :func:`image_stats`: pixel sizes from the image headers of those samples.

Example:
    >>> stage = storage_probe(DatasetIndex.load("/data/ff"), seconds=5)    # doctest: +SKIP
    >>> stage.samples_per_s, stage.figures["mb_per_s"]                     # doctest: +SKIP
"""

from __future__ import annotations

import io
import itertools
import logging
import multiprocessing as mp
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from fastfeed.decode.cpu import pick_image_field
from fastfeed.diagnosis.report import Stage
from fastfeed.errors import ConfigError
from fastfeed.formats.naming import RAW_FIELD
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import ShardSource
from fastfeed.storage.remote import _remote_chunks as chunks
from fastfeed.storage.remote import filesystem, is_url, local_path
from fastfeed.timing.measure import Measurement, measure

__all__ = ["ImageStats", "decode_probe", "evict", "image_stats", "read_samples", "source_probe",
           "storage_probe"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
#: Shards a storage probe cycles over, and raw files a source probe samples at most.
MAX_SHARDS, MAX_FILES, MAX_LISTED = 64, 4000, 200_000


def evict(path: str, *, flush: bool = True) -> bool:
    """Drop a local file from the page cache (``flush``: written back first, only clean pages drop).

    Returns False where the OS offers no ``posix_fadvise`` or the file cannot be opened.

    Example:
        >>> evict(__file__) in (True, False)
        True
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if flush:
            try:
                os.fsync(fd)
            except OSError:
                pass  # some filesystems refuse fsync on a read-only handle; clean pages still drop
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _rate(m: Measurement) -> float:
    return m.samples_per_s


# ---------------------------------------------------------------------- storage
def _pick_shards(index: DatasetIndex) -> list[int]:
    """Up to MAX_SHARDS shards spread evenly over the dataset."""
    n = len(index.shards)
    return sorted({int(k) for k in np.linspace(0, n - 1, min(n, MAX_SHARDS))}) if n else []


def _local_chunks(paths: list[str]) -> Iterator[int]:
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    for path in itertools.cycle(paths):
        evict(path, flush=False)  # cold every time it comes round again (flushed before timing)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                yield n


def _remote_chunks(shards: list[tuple[str, int]], storage_options: Mapping[str, Any] | None) -> Iterator[int]:
    # the loader's own download path (waves of parallel ranged reads, retried), so the
    # probe sees what a worker sees

    for url, size in itertools.cycle(shards):
        for part in chunks(url, size, storage_options, None):
            yield len(part)


def _latency(url: str, storage_options: Mapping[str, Any] | None, tries: int = 3) -> float:
    """Median seconds for a one-byte ranged read (per-request latency)."""
    fs, path = filesystem(url, storage_options)
    times = []
    for _ in range(tries):
        t0 = time.perf_counter()
        fs.cat_file(path, start=0, end=1)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def storage_probe(index: DatasetIndex, *, seconds: float, local_ranks: int = 1,
                  storage_options: Mapping[str, Any] | None = None) -> Stage:
    """Sequential read throughput of the shards, cold (see the module docstring).

    Example:
        >>> storage_probe(DatasetIndex.load("/data/ff"), seconds=5).detail    # doctest: +SKIP
        '312.0 MB/s cold, 1 stream, 110.2 KB/sample'
    """
    picked = _pick_shards(index)
    total = sum(s.bytes for s in index.shards)
    per_sample = total / max(1, index.num_samples)
    if not picked or total == 0:
        return Stage("storage", "storage (sequential)", None, "", {}, skipped="no shards")
    first = index.shard_path(picked[0])
    figures: dict[str, Any] = {"bytes_per_sample": per_sample, "dataset_bytes": total,
                               "shard_bytes": total / len(index.shards), "remote": is_url(first)}
    if is_url(first):
        figures["latency_ms"] = _latency(first, storage_options) * 1e3
        source: Iterator[int] = _remote_chunks([(index.shard_path(s), index.shards[s].bytes) for s in picked],
                                               storage_options)
        cold, how = True, "remote, the loader's download path"
    else:
        paths = [local_path(index.shard_path(s)) or index.shard_path(s) for s in picked]
        cold = all([evict(p) for p in paths])  # flush and drop now, so the timed loop only re-drops
        source = _local_chunks(paths)
        how = "cold" if cold else "page cache could not be dropped: may be warm"
    m = measure(source, samples_of=int, num_workers=0, warmup_batches=1, settle=0.0, min_batches=8,
                min_time=0.5 * seconds, max_time=seconds)
    bytes_s = m.samples_per_s
    figures.update(mb_per_s=bytes_s / 1e6, cold=cold, streams=1, local_ranks=local_ranks,
                   measurement=m.to_json())
    detail = f"{bytes_s / 1e6:,.1f} MB/s ({how}, 1 stream), {per_sample / 1e3:,.1f} KB/sample"
    if "latency_ms" in figures:
        detail += f", {figures['latency_ms']:,.0f} ms per request"
    if local_ranks > 1:
        detail += f", shared by {local_ranks} local ranks"
    return Stage("storage", "storage (sequential read)", bytes_s / per_sample / local_ranks, detail,
                 figures, measurement=m)


# ---------------------------------------------------------------------- raw files
def _list_files(root: str) -> tuple[list[str], bool]:
    """Regular files under ``root`` (hidden ones skipped), at most MAX_LISTED; True if complete."""
    found: list[str] = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file():
                    found.append(e.path)
                    if len(found) >= MAX_LISTED:
                        return found, False
    return found, True


def _read_files(paths: Sequence[str], counter: list[int]) -> Iterator[int]:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            counter[0] += len(f.read())
        yield 1


def source_probe(folder: str | os.PathLike[str], *, seconds: float, num_samples: int,
                 local_ranks: int = 1, seed: int = 0) -> Stage:
    """Random reads of the raw files, whole and cold: what packing saves.

    Example:
        >>> source_probe("/data/imagenet/train", seconds=5, num_samples=1281167).detail  # doctest: +SKIP
    """
    root = str(folder)
    if is_url(root):
        raise ConfigError(f"--source {root}: give the local folder the dataset was packed from")
    if not os.path.isdir(root):
        raise ConfigError(f"--source {root}: not a folder; give the folder the dataset was packed from")
    files, complete = _list_files(root)
    if not files:
        return Stage("source", "raw files (random read)", None, "", {}, skipped=f"no files under {root}")
    rng = random.Random(seed)
    picked = rng.sample(files, min(len(files), MAX_FILES))
    cold = all([evict(p) for p in picked])
    counter = [0]
    m = measure(_read_files(picked, counter), samples_of=int, num_workers=0, warmup_batches=1, settle=0.0,
                min_batches=32, min_time=0.5 * seconds, max_time=seconds)
    files_s = m.samples_per_s
    read_files = m.samples + m.warmup_batches
    mean_bytes = counter[0] / max(1, read_files)
    ratio = len(files) / num_samples if complete and num_samples else 1.0
    per_sample = ratio if 1.0 <= ratio <= 16 else 1.0  # files per sample (an image and its label file...)
    figures = {"files_per_s": files_s, "mb_per_s": files_s * mean_bytes / 1e6, "mean_file_bytes": mean_bytes,
               "files": len(files), "listing_complete": complete, "files_per_sample": per_sample, "cold": cold,
               "measurement": m.to_json()}
    detail = (f"{files_s:,.0f} files/s, {files_s * mean_bytes / 1e6:,.1f} MB/s "
              f"({'cold' if cold else 'may be warm'}, random order, {mean_bytes / 1e3:,.1f} KB/file)")
    return Stage("source", "raw files (random read)", files_s / per_sample / local_ranks, detail, figures,
                 measurement=m)


# ---------------------------------------------------------------------- samples in memory
def read_samples(index: DatasetIndex, *, max_samples: int = 256, max_bytes: int = 128 << 20,
                 max_shards: int = 4, cache_dir: str | os.PathLike[str] | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The first samples of the dataset (raw bytes per field) and their global ids.

    Reads the first ``max_shards`` shards at most, in index order (packed shards are
    shuffled), so a remote dataset costs a few shard downloads.
    """

    src = ShardSource(index, cache_dir=cache_dir, storage_options=storage_options, max_open=2)
    samples: list[dict[str, Any]] = []
    size = 0
    try:
        last = int(index.shard_starts[min(max_shards, len(index.shards))])
        for i in range(min(max_samples, last)):
            s = src.read(i)
            samples.append(s)
            size += sum(len(v) for k, v in s.items() if isinstance(v, (bytes, bytearray)))
            if size >= max_bytes and len(samples) >= 8:
                break
    finally:
        src.close()
    return samples, np.arange(len(samples), dtype=np.int64)


@dataclass(frozen=True)
class ImageStats:
    """Pixel sizes of some images (from their headers), or none found."""

    count: int
    mean_width: float
    mean_height: float
    mean_bytes: float
    #: share of the images that are JPEGs without restart markers (``pack --jpeg-restarts`` helps those)
    plain_jpeg_share: float = 0.0

    @property
    def megapixels(self) -> float:
        return self.mean_width * self.mean_height / 1e6

    @property
    def longer_side(self) -> float:
        return max(self.mean_width, self.mean_height)


def image_stats(samples: Sequence[dict[str, Any]], field: str | None = None) -> ImageStats | None:
    """Mean image size of ``samples`` from headers only (no decode); None without images.

    Example:
        >>> from tools.synth import make_jpeg
        >>> image_stats([{"jpg": make_jpeg(np.random.default_rng(0), (64, 48))}]).mean_width
        64.0
    """
    from PIL import Image, UnidentifiedImageError


    sizes, nbytes, plain = [], [], 0
    for s in samples[:64]:
        f = field if field in s else pick_image_field([k for k in s if not k.startswith("__")])
        if f is None:
            continue
        if f == RAW_FIELD:  # stored pixels (pack --store raw): the shape from the index
            shape = s.get("__shape__")
            if shape:
                sizes.append((shape[1], shape[0]))
                nbytes.append(len(s[f]))
            continue
        try:
            with Image.open(io.BytesIO(s[f])) as im:
                sizes.append(im.size)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError):
            continue
        nbytes.append(len(s[f]))
        plain += bool(s[f][:3] == b"\xff\xd8\xff" and not _has_restarts(s[f]))
    if not sizes:
        return None
    arr = np.asarray(sizes, dtype=np.float64)
    return ImageStats(len(sizes), float(arr[:, 0].mean()), float(arr[:, 1].mean()), float(np.mean(nbytes)),
                      plain / len(sizes))


def _has_restarts(data: bytes) -> bool:
    """A restart interval (DRI marker) among the JPEG's header segments, before its scan."""
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xDD:
            return True
        if marker == 0xDA:
            return False
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return False


# ---------------------------------------------------------------------- decode
_JOB: dict[str, Any] = {}


def _init_decoder(decoder: Any, samples: list[dict[str, Any]], labels: np.ndarray | None, batch: int) -> None:
    try:
        import cv2

        cv2.setNumThreads(1)  # one decode per process, as in a DataLoader worker
    except ImportError:
        pass
    import torch

    torch.set_num_threads(1)
    _JOB.update(decoder=decoder, samples=samples, labels=labels, batch=batch)


def _warm_up(_: int) -> int:
    """Imports (OpenCV, simplejpeg) and first-use costs, before anything is timed.

    A task, not part of the initializer: a batch that cannot be decoded (e.g. images of
    different sizes with no image size) then raises in the caller, where an exception in
    a Pool initializer would only kill the worker and have it restarted forever.
    """
    return _decode_batch(0)[0]


def _decode_batch(k: int) -> tuple[int, float]:
    """Decode batch ``k`` of the samples in memory (ids run on, so crops differ): (size, CPU seconds)."""
    cpu0 = time.process_time()
    samples, batch = _JOB["samples"], _JOB["batch"]
    n = len(samples)
    ids = np.arange(k * batch, (k + 1) * batch, dtype=np.int64)
    pick = [samples[i % n] for i in ids]
    labels = _JOB["labels"]
    labs = None if labels is None else labels[ids % n]
    out = _JOB["decoder"].decode_batch(pick, ids, 0, labs, None)
    return (len(out["__key__"]) if "__key__" in out else batch), time.process_time() - cpu0


def _pool_batches(pool: Any, processes: int, cpu: list[float], pending: deque[Any]) -> Iterator[int]:
    # one batch in flight per process: results arrive as they are made, not in bursts
    pending.extend(pool.apply_async(_decode_batch, (k,)) for k in range(processes))
    k = len(pending)
    while True:
        n, seconds = pending.popleft().get()
        pending.append(pool.apply_async(_decode_batch, (k,)))
        k += 1
        cpu[0] += n
        cpu[1] += seconds
        yield n


def decode_probe(decoder: Any, samples: list[dict[str, Any]], labels: np.ndarray | None, *,
                 processes: int, batch: int, seconds: float) -> tuple[Measurement, float]:
    """Decode + augmentation throughput of ``processes`` processes over samples in memory.

    Each process decodes whole batches with the loader's decoder (one thread each, as in
    a DataLoader worker) and returns only the count, so the figure is the decode ceiling
    without reading or handing batches over.

    Returns:
        The measurement (wall-clock rates), and samples per CPU-second of the decoding
        processes: what one dedicated core does, whatever else shares the cores.

    Example:
        >>> m, per_cpu_second = decode_probe(CpuDecoder(image_size=224), samples, None, processes=1,
        ...                                  batch=16, seconds=3)                # doctest: +SKIP
    """
    if not samples:
        raise ConfigError("decode_probe: no samples to decode")
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    pool = ctx.Pool(processes, initializer=_init_decoder, initargs=(decoder, samples, labels, batch))
    pending: deque[Any] = deque()  # the batches in flight
    try:
        pool.map(_warm_up, range(processes), chunksize=1)  # returns once the processes are started and warm
        cpu = [0.0, 0.0]  # samples, CPU seconds
        # five windows at most: results of several processes can arrive together, and a short
        # window over such a pair would time nothing
        m = measure(_pool_batches(pool, processes, cpu, pending), samples_of=int, num_workers=processes,
                    prefetch_factor=1, settle=0.1, min_batches=8, min_time=0.5 * seconds, max_time=seconds,
                    windows=5)
        return m, (cpu[0] / cpu[1] if cpu[1] > 0 else 0.0)
    finally:
        _stop_pool(pool, pending)


def _stop_pool(pool: Any, pending: deque[Any], wait: float = 30.0) -> None:
    """Let the batches in flight finish (one per process, milliseconds), then close the pool.

    ``Pool.terminate()`` with tasks in flight can hang for good in CPython: it kills workers
    that may hold the task queue's lock and then waits for its task thread, which waits on
    that lock (seen in ``test_doctor.py`` on the 2-core machine). A pool whose tasks are done
    closes cleanly; terminate stays the fallback for a batch that does not finish in ``wait`` s.
    """
    deadline = time.monotonic() + wait
    done = True
    for r in pending:
        r.wait(max(0.0, deadline - time.monotonic()))
        done = done and r.ready()
    if done:
        pool.close()
    else:
        pool.terminate()
    pool.join()
