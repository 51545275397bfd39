"""How an epoch of aspect-ratio buckets crops and balances: fastfeed's sampler next to naive per-rank bucketing.

:func:`aspect_balance_report` reads only the image sizes the index records (``sizes.npy``) and
plans one epoch twice, in pure numpy:

- with :class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler` (``batch_size`` or the
  pixel budget ``max_pixels``);
- the way hand-written trainers do it (:func:`naive_rank_batches`): a ``DistributedSampler``
  shard per rank, each rank bucketing its own images independently, batches of a fixed size
  (each bucket's last one smaller), in an order of its own.

It reports the buckets and the images in each; the share of pixels the crop cuts away (each
image resized to cover its bucket, then cropped to it: :func:`~fastfeed.sampling.buckets.fit`);
and, for both plans, the straggler ratio of pixels per step (per step: the rank with the most
pixels over the mean of the ranks; mean, p95 and max over the steps every rank runs), with the
steps each rank runs (the naive ranks differ: DDP waits at the end of the epoch for ranks that
have stopped).

Example:
    >>> sizes = np.array([[480, 640]] * 300 + [[640, 480]] * 200 + [[512, 512]] * 100 + [[300, 900]] * 53)
    >>> r = aspect_balance_report(sizes, resolution=256, world_size=4, batch_size=8)
    >>> r.rows[0].steps_per_rank, r.rows[1].steps_per_rank
    ((21, 21), (21, 23))
    >>> r.rows[0].straggler_mean < 1.05 < r.rows[1].straggler_mean
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fastfeed._options import MAX_COUNT, check_int
from fastfeed._state import check_epoch
from fastfeed.dist import MAX_WORLD_SIZE
from fastfeed.errors import ConfigError
from fastfeed.sampling.aspect import DistributedAspectRatioSampler, SizesLike
from fastfeed.sampling.buckets import REASONS, fit

__all__ = ["AspectBalanceReport", "CropStats", "StepBalance", "aspect_balance_report", "naive_rank_batches",
           "step_balance"]

_NAIVE_STREAM = 0x4A1E  # the naive baseline's random stream (its own, apart from the sampler's)


@dataclass(frozen=True)
class StepBalance:
    """Pixels per step across ranks for one plan of one epoch.

    Attributes:
        name: which plan.
        steps_per_rank: (fewest, most) steps a rank runs; equal for fastfeed.
        mean_batch_size: images per batch.
        images: images drawn over all ranks (repeats included).
        pixels_per_step: pixels of one step, all ranks together (mean over the common steps).
        straggler_mean, straggler_p95, straggler_max: over the steps every rank runs, the rank
            with the most pixels over the ranks' mean (1.0: balanced).
        wait_share: share of rank time spent waiting for the rank with the most pixels, with
            time proportional to pixels.
    """

    name: str
    steps_per_rank: tuple[int, int]
    mean_batch_size: float
    images: int
    pixels_per_step: float
    straggler_mean: float
    straggler_p95: float
    straggler_max: float
    wait_share: float

    @property
    def steps_equal(self) -> bool:
        """True when every rank runs the same number of steps."""
        return self.steps_per_rank[0] == self.steps_per_rank[1]


def step_balance(name: str, pixels: list[np.ndarray], counts: list[np.ndarray]) -> StepBalance:
    """:class:`StepBalance` from each rank's batches in the order it runs them (pixels, images per batch).

    Example:
        >>> s = step_balance("x", [np.array([4., 4.]), np.array([4., 2., 1.])], [np.array([1, 1]), np.array([1, 1, 1])])
        >>> s.steps_per_rank, round(s.straggler_mean, 3), s.straggler_max
        ((2, 3), 1.167, 1.333...)
    """
    steps = [int(p.shape[0]) for p in pixels]
    common = min(steps) if steps else 0
    grid = np.stack([p[:common] for p in pixels], axis=1).astype(np.float64) if common else np.zeros((0, 1))
    slow, mean = grid.max(axis=1), grid.mean(axis=1)
    ratio = np.divide(slow, mean, out=np.ones_like(slow), where=mean > 0)
    total = float(slow.sum()) * grid.shape[1]
    n = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    return StepBalance(
        name=name, steps_per_rank=(common, max(steps) if steps else 0),
        mean_batch_size=float(n.mean()) if n.size else 0.0, images=int(n.sum()),
        pixels_per_step=float(grid.sum(axis=1).mean()) if common else 0.0,
        straggler_mean=float(ratio.mean()) if ratio.size else 1.0,
        straggler_p95=float(np.percentile(ratio, 95)) if ratio.size else 1.0,
        straggler_max=float(ratio.max()) if ratio.size else 1.0,
        wait_share=float((slow[:, None] - grid).sum() / total) if total else 0.0)


def naive_rank_batches(bucket_of: np.ndarray, areas: np.ndarray, *, world_size: int, batch_size: int,
                       seed: int = 0, epoch: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-rank bucketing as hand-written trainers do it: each rank's batches (pixels, images) in its order.

    The images with a bucket are shuffled (``seed``, ``epoch``) and dealt as ``DistributedSampler``
    does (padded to a multiple of ``world_size`` by repeating the first, rank ``r`` takes every
    ``world_size``-th from ``r``); each rank then groups its own shard by bucket, cuts each
    bucket into batches of ``batch_size`` (its last one smaller) and shuffles its batches with
    a generator of its own.

    Args:
        bucket_of: int (N,) each image's bucket, -1 for an image left out.
        areas: int (K,) pixels of each bucket.
        world_size, batch_size, seed, epoch: the baseline's world and batch.

    Returns:
        ``(pixels, counts)``: per rank, float64 and int64 arrays of its batches.

    Example:
        >>> px, n = naive_rank_batches(np.array([0, 0, 0, 1, 1]), np.array([100, 120]), world_size=2, batch_size=2)
        >>> [p.shape[0] for p in px], sorted(int(c) for c in np.concatenate(n))
        ([2, 2], [1, 1, 2, 2])
    """
    ids = np.flatnonzero(bucket_of >= 0)
    W, B = int(world_size), int(batch_size)
    rng = np.random.default_rng([int(seed) % 2**63, int(epoch) % 2**63, _NAIVE_STREAM])
    perm = ids[rng.permutation(ids.shape[0])]
    if perm.shape[0] % W and perm.shape[0]:
        perm = np.concatenate([perm, np.resize(perm, (-perm.shape[0]) % W)])
    K = int(areas.shape[0])
    pixels, counts = [], []
    for r in range(W):
        n = np.bincount(bucket_of[perm[r::W]], minlength=K)
        full, rem = n // B, n % B
        k = np.concatenate([np.repeat(np.arange(K), full), np.flatnonzero(rem)])
        c = np.concatenate([np.full(int(full.sum()), B, dtype=np.int64), rem[rem > 0]])
        order = np.random.default_rng([int(seed) % 2**63, int(epoch) % 2**63, _NAIVE_STREAM, r]).permutation(k.size)
        pixels.append((c * areas[k]).astype(np.float64)[order])
        counts.append(c[order])
    return pixels, counts


@dataclass(frozen=True)
class CropStats:
    """The share of each image the cover-resize-then-crop cuts away (the same in original or resized pixels).

    Attributes:
        pixels: of all the images' pixels together.
        mean, p95, max: per image.
        upscaled: images enlarged to cover their bucket.
    """

    pixels: float
    mean: float
    p95: float
    max: float
    upscaled: int


def _crop_stats(sizes: np.ndarray, sampler: DistributedAspectRatioSampler) -> CropStats:
    used = sampler.bucket_of >= 0
    if not used.any():
        return CropStats(0.0, 0.0, 0.0, 0.0, 0)
    f = fit(sizes[used], sampler.buckets, sampler.bucket_of[used])
    area = sizes[used, 0].astype(np.float64) * sizes[used, 1]
    return CropStats(pixels=float((f.crop * area).sum() / area.sum()), mean=float(f.crop.mean()),
                     p95=float(np.percentile(f.crop, 95)), max=float(f.crop.max()),
                     upscaled=int((f.scale > 1 + 1e-9).sum()))


@dataclass(frozen=True)
class AspectBalanceReport:
    """The buckets, the crop and the pixel balance of one epoch (what ``fastfeed balance --resolution`` prints).

    Attributes:
        num_images: images in the dataset.
        world_size, resolution: the world and the buckets' resolution.
        buckets: (height, width) of every bucket.
        counts: images in each bucket (those the epoch draws).
        batch_sizes: images per batch of each bucket (fastfeed's sampler).
        skipped: images left out per reason (``no size``, ``upscale``, ``crop``) and by ``subset``.
        crop: :class:`CropStats`.
        rows: fastfeed's sampler, then naive per-rank bucketing.
        settings: the arguments the plans used.
    """

    num_images: int
    world_size: int
    resolution: int
    buckets: tuple[tuple[int, int], ...]
    counts: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    skipped: dict[str, int]
    crop: CropStats
    rows: tuple[StepBalance, ...]
    settings: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``fastfeed balance --resolution R --json`` prints)."""
        return {"num_images": self.num_images, "world_size": self.world_size, "resolution": self.resolution,
                "buckets": [{"height": h, "width": w, "images": c, "batch_size": b}
                            for (h, w), c, b in zip(self.buckets, self.counts, self.batch_sizes)],
                "skipped": dict(self.skipped), "crop": asdict(self.crop), "settings": dict(self.settings),
                "samplers": [{**asdict(r), "steps_per_rank": list(r.steps_per_rank), "steps_equal": r.steps_equal}
                             for r in self.rows]}

    def text(self) -> str:
        """The headline, the buckets used, the crop, then one row per plan."""
        used = sum(self.counts)
        left = {k: v for k, v in self.skipped.items() if v}
        head = (f"{self.num_images:,} images, resolution {self.resolution} ({len(self.buckets)} buckets, "
                f"{sum(1 for c in self.counts if c)} used), world size {self.world_size}")
        if left:
            head += f"; {self.num_images - used:,} left out (" + ", ".join(f"{v:,} {k}" for k, v in left.items()) + ")"
        lines = [head, "bucket (h x w)   images   batch"]
        for (h, w), c, b in zip(self.buckets, self.counts, self.batch_sizes):
            if c:
                lines.append(f"{f'{h}x{w}':>14}  {c:>7,}  {b:>6}")
        c = self.crop
        lines.append(f"cropping cuts away {c.pixels:.1%} of the pixels (per image: mean {c.mean:.1%}, p95 {c.p95:.1%}, "
                     f"max {c.max:.1%}); {c.upscaled:,} image(s) enlarged to cover their bucket")
        lines.append("pixels per step across ranks (the rank with the most / the mean):")
        width = max(len(r.name) for r in self.rows) + 2
        cols = ["steps/rank", "batch", "mean", "p95", "max", "wait share"]
        lines.append(" " * width + "  ".join(f"{x:>10}" for x in cols))
        for r in self.rows:
            lo, hi = r.steps_per_rank
            vals = [f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}!", f"{r.mean_batch_size:.1f}",
                    f"{r.straggler_mean:.3f}", f"{r.straggler_p95:.3f}", f"{r.straggler_max:.3f}",
                    f"{r.wait_share:.1%}"]
            lines.append(f"{r.name:<{width}}" + "  ".join(f"{v:>10}" for v in vals))
        if any(not r.steps_equal for r in self.rows):
            lines.append("! ranks run different numbers of steps: DDP hangs (or drops them) at the epoch's end; "
                         "the ratios are over the steps every rank runs")
        return "\n".join(lines)


def aspect_balance_report(path: SizesLike, *, resolution: int = 1024, world_size: int = 8,
                          batch_size: int | None = None, max_pixels: int | None = None, buckets: Any = None,
                          max_upscale: float | None = 2.0, seed: int = 0, epoch: int = 0,
                          baseline_batch_size: int | None = None) -> AspectBalanceReport:
    """Plan one epoch of aspect-ratio buckets with fastfeed's sampler and with naive per-rank bucketing; compare.

    Args:
        path: a packed dataset whose index records image sizes (``fastfeed shapes DST`` adds
            them), a ``.npy`` of sizes or an (N, 2) array of (height, width).
        resolution: the generated buckets hold about ``resolution ** 2`` pixels.
        world_size: the ranks.
        batch_size: fixed batches of this many images, or
        max_pixels: a pixel budget per batch (default, when neither is given: a batch of 8).
        buckets: (height, width) shapes instead of the generated ones.
        max_upscale: images that must be enlarged more to cover their bucket are left out
            (counted); None: no limit.
        seed, epoch: the epoch to plan.
        baseline_batch_size: the naive ranks' batch; default ``batch_size``, or for a budget
            the batch of the same pixels at ``resolution ** 2`` per image.

    Raises:
        ConfigError: both a batch size and a budget, bad numbers, or a dataset without sizes
            (with the command that adds them).

    Example:
        >>> r = aspect_balance_report([[480, 640]] * 40, resolution=256, world_size=2, max_pixels=4 * 256 ** 2)
        >>> r.counts[r.buckets.index((192, 320))], r.settings["baseline_batch_size"]
        (40, 4)
    """
    if batch_size is not None and max_pixels is not None:
        raise ConfigError("give one of batch_size (images per batch) or max_pixels (a pixel budget per batch)")
    world_size = check_int("world_size", world_size, 1, most=MAX_WORLD_SIZE)
    seed = check_int("seed", seed, 0, most=(1 << 63) - 1)
    epoch = check_epoch(epoch, "aspect_balance_report(epoch=...)")
    if batch_size is None and max_pixels is None:
        batch_size = 8
    s = DistributedAspectRatioSampler(path, resolution=resolution, batch_size=batch_size, max_pixels=max_pixels,
                                      buckets=buckets, max_upscale=max_upscale, misfit="skip",
                                      num_replicas=world_size, rank=0, seed=seed)
    if baseline_batch_size is None:
        baseline_batch_size = batch_size if batch_size is not None else max(1, round(max_pixels / resolution ** 2))
    baseline_batch_size = check_int("baseline_batch_size", baseline_batch_size, 1, most=MAX_COUNT)
    plan = s.epoch_plan(epoch)
    n, _, px, _ = plan.features()
    at = plan.order
    ff = step_balance(f"fastfeed ({'batch ' + str(batch_size) if batch_size else f'max_pixels {max_pixels:,}'})",
                      [px[at, r].astype(np.float64) for r in range(world_size)], [n[at, r] for r in range(world_size)])
    npx, nc = naive_rank_batches(s.bucket_of, s.buckets.areas, world_size=world_size, batch_size=baseline_batch_size,
                                 seed=seed, epoch=epoch)
    naive = step_balance(f"naive per-rank buckets (batch {baseline_batch_size})", npx, nc)
    skipped = {k: int(s.skipped_reasons.get(k, 0)) for k in REASONS}
    skipped["subset"] = s.num_filtered
    return AspectBalanceReport(
        num_images=int(s.sizes.shape[0]), world_size=world_size, resolution=int(resolution),
        buckets=tuple(s.buckets.shapes()), counts=tuple(int(c) for c in s.bucket_counts()),
        batch_sizes=tuple(int(b) for b in s.batch_sizes), skipped=skipped, crop=_crop_stats(s.sizes, s),
        rows=(ff, naive),
        settings={"batch_size": batch_size, "max_pixels": max_pixels, "baseline_batch_size": baseline_batch_size,
                  "max_upscale": max_upscale, "seed": seed, "epoch": epoch, "repeats": plan.num_repeats,
                  "custom_buckets": buckets is not None})
