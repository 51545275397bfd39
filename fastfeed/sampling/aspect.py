"""Images of every shape: aspect-ratio buckets, balanced across ranks, resumable.

:class:`DistributedAspectRatioSampler` groups images by aspect ratio into buckets
(:mod:`fastfeed.sampling.buckets`: shapes of about ``resolution ** 2`` pixels), and yields for
its rank one list of dataset indices per step, each batch from one bucket, so the loader
(``fastfeed.loader(path, batch_sampler=sampler)``) resizes every image of a batch to cover
that bucket's (height, width) and crops it to exactly that. It reads only the image sizes the
index records (``sizes.npy``), never the images.

One epoch is planned by :func:`plan_buckets`, pure numpy, identically on every rank:

1. **Buckets.** Each image's bucket is fixed (the nearest aspect ratio in log space); images
   that fit no bucket well are left out or refused (:class:`~fastfeed.sampling.buckets.FitPolicy`).
2. **Batches.** Each bucket's images, shuffled afresh every epoch, are cut into batches of its
   size: ``batch_size``, or as many as fit in the pixel budget ``max_pixels`` (or the budget
   ``max_cost`` of a cost model), so a batch of a 512x2048 bucket and one of 1024x1024 cost
   alike. Each bucket leaves at most one smaller batch.
3. **Equal steps, each image once.** The batch count must be a multiple of the world size
   ``W``: with ``drop_last=False`` the largest batches are halved until it is (no image is
   repeated for it), and only when every batch holds one image are up to ``W - 1`` images
   repeated, flagged ``valid=False``; with ``drop_last=True`` the smaller batches and the
   ``count mod W`` full batches drawn at random sit the epoch out.
4. **Balanced steps.** Batches are sorted by cost (ties at random) and dealt ``W`` at a time
   into steps, so the batches of a step cost about the same; each rank of a step gets one
   of them at random, and the steps are shuffled.

Guarantees: every rank yields the same number of steps; every image (that fits) once per
epoch, plus at most ``W - 1`` repeats flagged in ``valid``; the plan is a function of (sizes,
buckets, seed, epoch, world size); ``state_dict`` resumes exactly, and at another world size
(elastic: the steps not run are re-planned at the new size, :mod:`fastfeed.sampling.elastic`).

Example:
    >>> sizes = np.array([[375, 500]] * 6 + [[500, 375]] * 5 + [[640, 640]] * 3)
    >>> s = DistributedAspectRatioSampler(sizes, resolution=256, batch_size=2, num_replicas=2, rank=0)
    >>> len(s), [s.buckets.shape(s.bucket_of[i]) for i in (0, 6, 13)]
    (4, [(192, 320), (320, 192), (256, 256)])
    >>> [s.batch_shape(b) for b in s]
    [(192, 320), (320, 192), (320, 192), (320, 192)]
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Callable, Sequence, Union

import numpy as np

from fastfeed._options import MAX_COUNT
from fastfeed.errors import ConfigError
from fastfeed.packed.index import DatasetIndex
from fastfeed.sampling.buckets import REASONS, Buckets, FitPolicy, as_buckets, assign, check_side, check_sizes, fit
from fastfeed.sampling.costmodel import CostModel
from fastfeed.sampling.samplers import _LengthSampler, _parse_budget
from fastfeed.sampling.splitting import CostFn, ranges
from fastfeed.sampling.steps import Plan

__all__ = ["DistributedAspectRatioSampler", "PIXELS", "plan_buckets", "resolve_sizes"]

log = logging.getLogger(__name__)

SizesLike = Union[np.ndarray, Sequence[Sequence[int]], str, "os.PathLike[str]", DatasetIndex]
#: ``cost="pixels"`` (the default): a batch costs its pixels, ``n * H * W``.
PIXELS = CostModel(padded=1.0, unit="pixels", name="pixels")
_STREAM = 0xA5EC7  # the planner's random stream, apart from the length samplers'


def resolve_sizes(path: SizesLike) -> tuple[np.ndarray, DatasetIndex | None, str]:
    """The images' displayed (height, width), int64 (N, 2), and the index they came from.

    Args:
        path: a packed dataset (folder, URL or :class:`~fastfeed.packed.index.DatasetIndex`)
            whose index records sizes (``pack`` does; ``fastfeed shapes DST`` adds them), a
            ``.npy`` file, or an (N, 2) array of (height, width) ((0, 0): unknown).

    Returns:
        ``(sizes, index or None, where)``: ``where`` names the source in messages.

    Raises:
        ConfigError: a dataset without recorded sizes (with the command that adds them), or
            sizes that are not (N, 2) non-negative integers.

    Example:
        >>> resolve_sizes([[480, 640]])[0].tolist()
        [[480, 640]]
    """
    index = None
    if isinstance(path, DatasetIndex):
        index, where = path, str(path.root or "the index")
    elif isinstance(path, (str, os.PathLike)) and not os.fspath(path).endswith(".npy"):
        index, where = DatasetIndex.load(path), os.fspath(path)
    elif isinstance(path, (str, os.PathLike)):
        where = os.fspath(path)
        try:
            return check_sizes(np.load(where, allow_pickle=False), where), None, where
        except FileNotFoundError:
            raise ConfigError(f"{where}: no such sizes file") from None
    else:
        return check_sizes(path, "sizes"), None, "sizes"
    sizes = index.image_sizes
    if sizes is None:
        raise ConfigError(f"{where}: the index records no image sizes (packed before pack recorded them); run "
                          f"`fastfeed shapes {where}` once to add them without re-packing")
    return check_sizes(np.asarray(sizes), f"{where} (sizes.npy)"), index, where


# ---------------------------------------------------------------------- planning
def _empty(W: int, dropped: int) -> Plan:
    z = np.zeros((0, W), dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    return Plan(samples=none, lengths=none.copy(), starts=z, counts=z.copy(), order=none.copy(),
                num_dropped=dropped, valid=np.zeros(0, dtype=bool))


def _split_largest(starts: np.ndarray, counts: np.ndarray, extra: int,
                   rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray, int]:
    """Halve the largest batches (ties at random) until there are ``extra`` more; returns the
    batches and how many could not be made (every batch down to one image)."""
    while extra > 0:
        can = np.flatnonzero(counts >= 2)
        if not can.size:
            break
        tie = rng.random(can.size) if rng is not None else np.arange(can.size)
        pick = can[np.lexsort((tie, -counts[can]))[:extra]]
        c = counts[pick]
        half = (c + 1) // 2
        counts = counts.copy()
        counts[pick] = half
        starts, counts = np.concatenate([starts, starts[pick] + half]), np.concatenate([counts, c - half])
        extra -= pick.size
    return starts, counts, extra


def plan_buckets(bucket_of: np.ndarray, capacity: np.ndarray, areas: np.ndarray, *, world_size: int, seed: int,
                 epoch: int, shuffle: bool, drop_last: bool, cost: CostFn, ids: np.ndarray | None = None) -> Plan:
    """Plan one epoch of single-bucket batches for ``world_size`` ranks (see the module docstring).

    Args:
        bucket_of: int (N,) each image's bucket, -1 for an image left out.
        capacity: int (K,) images per batch of each bucket.
        areas: int (K,) pixels of each bucket (the "length" the cost sees: a batch of ``n``
            images of bucket ``k`` has count ``n``, longest ``areas[k]``).
        world_size, seed, epoch, shuffle, drop_last: as for the sampler.
        cost: what a batch costs (steps are made of batches of about equal cost).
        ids: plan over these images (global indices, with multiplicity: the rest of an epoch),
            None: every image with a bucket.

    Returns:
        A :class:`~fastfeed.sampling.steps.Plan` in global indices, ``valid`` False on repeats,
        ``lengths`` the bucket area of each sample.

    Example:
        >>> p = plan_buckets(np.array([0, 0, 0, 1, 1]), np.array([2, 2]), np.array([100, 120]), world_size=2,
        ...                  seed=0, epoch=0, shuffle=True, drop_last=False, cost=CostFn(PIXELS))
        >>> p.num_steps, sorted(p.samples.tolist()), p.num_repeats
        (2, [0, 1, 2, 3, 4], 0)
    """
    W = int(world_size)
    rng = np.random.default_rng([int(seed) % 2**63, int(epoch) % 2**63, _STREAM]) if shuffle else None
    pool = np.flatnonzero(bucket_of >= 0) if ids is None else np.asarray(ids, dtype=np.int64)
    members = pool if ids is None else pool[bucket_of[pool] >= 0]
    dropped = (int(bucket_of.shape[0]) if ids is None else int(pool.shape[0])) - int(members.shape[0])
    M, K = int(members.shape[0]), int(capacity.shape[0])
    if M == 0:
        return _empty(W, dropped)
    b = bucket_of[members]
    order = np.lexsort((rng.random(M) if rng is not None else members, b))  # each bucket's images, shuffled
    srt = members[order]
    n = np.bincount(b, minlength=K)
    seg = np.concatenate([[0], np.cumsum(n)])
    full, rem = n // capacity, n % capacity
    kk = np.repeat(np.arange(K), full)
    j = np.arange(int(full.sum())) - np.repeat(np.cumsum(full) - full, full)
    starts, counts = seg[kk] + j * capacity[kk], capacity[kk].astype(np.int64)
    if drop_last:
        dropped += int(rem.sum())
        out = starts.shape[0] % W
        if out:
            gone = rng.choice(starts.shape[0], out, replace=False) if rng is not None else \
                np.arange(starts.shape[0] - out, starts.shape[0])
            keep = np.ones(starts.shape[0], dtype=bool)
            keep[gone] = False
            dropped += int(counts[~keep].sum())
            starts, counts = starts[keep], counts[keep]
        pad = 0
    else:
        rk = np.flatnonzero(rem)
        starts = np.concatenate([starts, seg[rk] + full[rk] * capacity[rk]])
        counts = np.concatenate([counts, rem[rk]])
        starts, counts, pad = _split_largest(starts, counts, (-starts.shape[0]) % W, rng)
    if not starts.shape[0] and not pad:
        return _empty(W, dropped)
    ext = srt
    if pad:  # every batch is one image and there are still fewer than a multiple of W: repeat some
        again = rng.choice(srt, pad, replace=pad > M) if rng is not None else srt[np.arange(pad) % M]
        ext = np.concatenate([srt, again])
        starts = np.concatenate([starts, M + np.arange(pad)])
        counts = np.concatenate([counts, np.ones(pad, dtype=np.int64)])
    return _deal(ext, M, starts, counts, bucket_of, areas, W, cost, rng, pad=pad, dropped=dropped)


def _deal(ext: np.ndarray, real: int, starts: np.ndarray, counts: np.ndarray, bucket_of: np.ndarray,
          areas: np.ndarray, W: int, cost: CostFn, rng: np.random.Generator | None, *, pad: int,
          dropped: int) -> Plan:
    """Batches (ranges of ``ext``) sorted by cost and dealt ``W`` at a time into steps (see the module doc)."""
    area = areas[bucket_of[ext[starts]]].astype(np.int64)
    ls = areas[bucket_of[ext]].astype(np.int64)
    costs = cost.batch_costs(ls, starts, counts, lambda: (counts, area, (counts * area).astype(np.float64),
                                                          counts * area.astype(np.float64) ** 2))
    T = starts.shape[0]
    S = T // W
    tie = rng.random(T) if rng is not None else np.arange(T)
    grid = np.lexsort((tie, -costs)).reshape(S, W)  # dearest first, W of about equal cost per step
    if rng is not None:
        grid = np.take_along_axis(grid, np.argsort(rng.random((S, W)), axis=1), axis=1)
    bc = counts[grid].ravel()
    at = ranges(starts[grid].ravel(), bc)
    samples = ext[at]
    offsets = (np.cumsum(bc) - bc).reshape(S, W)
    step_order = rng.permutation(S) if rng is not None else np.arange(S)
    return Plan(samples=samples, lengths=ls[at], starts=offsets, counts=bc.reshape(S, W),
                order=step_order.astype(np.int64), num_repeats=pad, num_dropped=dropped, valid=at < real)


# ---------------------------------------------------------------------- the sampler
class DistributedAspectRatioSampler(_LengthSampler):
    """Batches of one aspect-ratio bucket each, equal steps and balanced pixels on every rank.

    Args:
        path: a packed dataset (folder, URL or :class:`~fastfeed.packed.index.DatasetIndex`)
            whose index records image sizes (``fastfeed shapes DST`` adds them to an older
            one), a ``.npy`` of sizes, or an (N, 2) array of (height, width) per image.
        resolution: the generated buckets hold about ``resolution ** 2`` pixels (at most
            8192, :data:`~fastfeed.sampling.buckets.MAX_SIDE`).
        batch_size: images per batch (per rank), the same for every bucket (at most 2**40); or
        max_pixels: a pixel budget per batch: ``max_pixels // (H * W)`` images of a bucket
            ``H x W``, so every batch (and every rank's step) costs about the same; or
        max_cost: a budget in the unit of ``cost`` (seconds, or ``"120ms"``, for a fitted model).
        buckets: ``(height, width)`` shapes to use instead of the generated ones (SDXL's list,
            say): one per aspect ratio.
        step: the generated buckets' sides are multiples of this (at most 8192).
        max_ratio: the generated buckets go from ``1 : max_ratio`` to ``max_ratio : 1`` (at
            most 64, :data:`~fastfeed.sampling.buckets.MAX_RATIO`).
        cost: what a batch costs: ``"pixels"`` (``n * H * W``, the default), a
            :class:`~fastfeed.sampling.costmodel.CostModel` over pixel counts (a fitted one in
            seconds: ``fastfeed.calibrate`` with lengths being ``H * W``), or a callable
            ``f(pixels of each image of one batch) -> cost``. Steps pair batches of equal cost.
        max_upscale: an image that must be enlarged more than this to cover its bucket fits no
            bucket well (1.0: never enlarge; None: no limit).
        max_crop: an image whose crop would cut away more than this share of the resized image
            fits no bucket well (None: no limit).
        misfit: what happens to images that fit no bucket well (and to images without a
            recorded size): ``"error"`` (default; the message names the first and counts them)
            or ``"skip"`` (left out of every epoch, counted in ``num_skipped`` and
            ``skipped_reasons``, logged).
        subset: the images to use (a bool mask or indices; a filter on the index's
            metadata, e.g. ``idx.labels < 100``): the others are never drawn (``num_filtered``).
        num_replicas, rank: the world; default from torch.distributed, then the
            ``WORLD_SIZE``/``RANK`` environment (:func:`fastfeed.resolve_world`).
        seed: the plan is a function of (seed, epoch); use the same seed on every rank.
        shuffle: False gives one fixed plan (for evaluation).
        drop_last: False (default): every image once, batches halved so the count fits the
            ranks, at most ``W - 1`` repeats flagged ``valid=False``; True: only full batches,
            the rest sits the epoch out.

    Attributes:
        buckets: the :class:`~fastfeed.sampling.buckets.Buckets`.
        bucket_of: int64 (N,) each image's bucket (-1: left out).
        sizes: int64 (N, 2) the images' (height, width), as the index records them.
        batch_sizes: int64 (K,) images per batch of each bucket.

    Example:
        >>> sizes = np.array([[480, 640]] * 10 + [[640, 480]] * 7)
        >>> s = DistributedAspectRatioSampler(sizes, resolution=512, max_pixels=4 * 512 * 512, num_replicas=2,
        ...                                   rank=1)
        >>> len(s), sorted(len(b) for b in s), int(s.batch_sizes[s.bucket_of[0]])
        (3, [2, 2, 4], 4)
    """

    def __init__(self, path: SizesLike, resolution: int = 1024, batch_size: int | None = None,
                 max_pixels: int | None = None, *, max_cost: float | str | None = None, buckets: Any = None,
                 step: int = 64, max_ratio: float = 4.0, cost: str | CostModel | Callable[[np.ndarray], float] = "pixels",
                 max_upscale: float | None = 2.0, max_crop: float | None = None, misfit: str = "error",
                 subset: Any = None, num_replicas: int | None = None, rank: int | None = None, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False) -> None:
        given = [n for n, v in (("batch_size", batch_size), ("max_pixels", max_pixels), ("max_cost", max_cost))
                 if v is not None]
        if len(given) != 1:
            raise ConfigError("DistributedAspectRatioSampler needs exactly one of batch_size= (images per batch), "
                              "max_pixels= (a pixel budget per batch) or max_cost= (a cost model's budget)"
                              + (f"; got {' and '.join(given)}" if given else ""))
        self.resolution = check_side("resolution", resolution)
        self.sizes, self.index, self.where = resolve_sizes(path)
        self.buckets: Buckets = as_buckets(buckets, resolution=resolution, step=step, max_ratio=max_ratio)
        self.policy = FitPolicy(max_upscale=max_upscale, max_crop=max_crop, misfit=misfit)
        model = PIXELS if cost == "pixels" else cost
        if isinstance(model, str):
            raise ConfigError(f"cost={cost!r}: use 'pixels' (the default), a CostModel over pixel counts or a "
                              "callable(pixels of each image of a batch) -> cost")
        n = int(self.sizes.shape[0])
        self.bucket_of = assign(self.sizes, self.buckets)
        self._filtered = self._subset(subset, n)
        self._misfits = self._apply_policy()
        areas = self.buckets.areas
        lengths = np.where(self.bucket_of >= 0, areas[np.maximum(self.bucket_of, 0)], 0)
        super().__init__(lengths, num_replicas=num_replicas, rank=rank, seed=seed, shuffle=shuffle,
                         drop_last=drop_last, jitter=0.0, cost=model, num_samples=None, adaptive_jitter=False)
        self.batch_size = None if batch_size is None else self._positive(batch_size)
        self.max_pixels = None if max_pixels is None else self._positive(max_pixels, "max_pixels")
        self.max_cost = None if max_cost is None else _parse_budget(max_cost, self.cost)
        self.batch_sizes = self._capacities()
        self._digest = self._identity()

    # -- setup
    @staticmethod
    def _positive(v: Any, name: str = "batch_size") -> int:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_COUNT:
            raise ConfigError(f"{name}={v!r} must be a positive integer up to {MAX_COUNT} (2**40)")
        return int(v)

    def _subset(self, subset: Any, n: int) -> np.ndarray | None:
        """The images ``subset`` leaves out (bool (N,)), or None."""
        if subset is None:
            return None
        arr = np.asarray(subset)
        if arr.dtype == bool:
            if arr.shape != (n,):
                raise ConfigError(f"subset= is a mask of {arr.shape}, the dataset has {n} images")
            keep = arr
        else:
            if arr.dtype.kind not in "iu" or arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= n)):
                raise ConfigError(f"subset= must be a bool mask of {n} or indices in [0, {n})")
            keep = np.zeros(n, dtype=bool)
            keep[arr] = True
        self.bucket_of[~keep] = -1
        return ~keep

    def _apply_policy(self) -> np.ndarray:
        """Leave out (or refuse) the images that fit no bucket well; returns their mask."""
        n = self.bucket_of.shape[0]
        chosen = np.arange(n) if self._filtered is None else np.flatnonzero(~self._filtered)
        bad = np.zeros(n, dtype=bool)
        some, counts = self.policy.misfits(self.sizes[chosen], self.buckets, self.bucket_of[chosen])
        bad[chosen[some]] = True
        #: images left out (or refused) per reason: ``{"no size", "upscale", "crop"}``
        self.skipped_reasons = {k: counts[k] for k in REASONS}
        if not bad.any():
            return bad
        msg = self._misfit_message(bad, counts)
        if self.policy.misfit == "error":
            raise ConfigError(msg + "; pass misfit='skip' to leave them out (counted), max_upscale=None (or a larger "
                              "one) to enlarge them, or a lower resolution")
        log.warning("%s: leaving them out of every epoch (misfit='skip')", msg)
        self.bucket_of[bad] = -1
        return bad

    def _misfit_message(self, bad: np.ndarray, counts: dict[str, int]) -> str:
        i = int(np.flatnonzero(bad)[0])
        h, w = (int(v) for v in self.sizes[i])
        why = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        if h == 0:
            first = "no recorded size (no image, or a header that could not be read)"
        else:
            f = fit(self.sizes[i:i + 1], self.buckets, self.bucket_of[i:i + 1])
            H, W = self.buckets.shape(int(self.bucket_of[i]))
            first = (f"{h}x{w}: a {float(f.scale[0]):.2f}x resize to cover its bucket {H}x{W}, cutting "
                     f"{float(f.crop[0]):.0%} away")
        return (f"{self.where}: {int(bad.sum())} image(s) fit no bucket well ({why}; max_upscale="
                f"{self.policy.max_upscale}, max_crop={self.policy.max_crop}); the first: {self._name(i)}, {first}")

    def _name(self, i: int) -> str:
        """``sample i 'key'`` (the key read from the dataset when there is one)."""
        if self.index is None:
            return f"image {i}"
        try:
            from fastfeed.packed.reader import DatasetReader

            return f"sample {i} '{DatasetReader(self.index, max_open=1).read(i).get('__key__', '')}'"
        except Exception:  # noqa: BLE001 - only for the message: an unreadable shard is reported when loaded
            return f"sample {i}"

    def _capacities(self) -> np.ndarray:
        """Images per batch of each bucket (:attr:`batch_sizes`)."""
        K = len(self.buckets)
        if self.batch_size is not None:
            return np.full(K, self.batch_size, dtype=np.int64)
        budget = float(self.max_pixels if self.max_pixels is not None else self.max_cost)  # type: ignore[arg-type]
        cap = np.asarray(self._cost_fn.capacity(self.buckets.areas, budget), dtype=np.int64)
        used = np.unique(self.bucket_of[self.bucket_of >= 0])
        small = [int(k) for k in used if cap[k] < 1]
        if small:
            H, W = self.buckets.shape(small[0])
            name = "max_pixels" if self.max_pixels is not None else "max_cost"
            raise ConfigError(f"{name}={budget:g} does not fit one image of bucket {H}x{W} ({H * W} pixels); "
                              f"raise {name} or lower the resolution")
        return np.maximum(cap, 1)

    def _identity(self) -> str:
        h = hashlib.blake2b(digest_size=8)
        for arr in (self.sizes, self.bucket_of):
            h.update(np.ascontiguousarray(arr).view(np.uint8))
        return h.hexdigest()

    # -- planning (the base class runs epochs, resume and elastic resume over it)
    def _plan_over(self, ids: np.ndarray | None, *, epoch: int, world_size: int, seed: int,
                   jitter: float | None = None) -> Plan:
        return plan_buckets(self.bucket_of, self.batch_sizes, self.buckets.areas, world_size=world_size, seed=seed,
                            epoch=epoch, shuffle=self.shuffle, drop_last=self.drop_last, cost=self._cost_fn, ids=ids)

    @property
    def jitter(self) -> float:
        """No jitter: images are grouped by bucket, shuffled within it."""
        return 0.0

    def _config(self) -> dict[str, Any]:
        return {"buckets": self.buckets.describe(), "batch_size": self.batch_size, "max_pixels": self.max_pixels,
                "max_cost": self.max_cost, "cost": self._cost_fn.describe(), "shuffle": self.shuffle,
                "drop_last": self.drop_last, "max_upscale": self.policy.max_upscale,
                "max_crop": self.policy.max_crop, "misfit": self.policy.misfit}

    # -- what the loader and reports read
    @property
    def num_skipped(self) -> int:
        """Images left out of every epoch because they fit no bucket well (``misfit="skip"``)."""
        return int(self._misfits.sum())

    @property
    def num_filtered(self) -> int:
        """Images ``subset=`` leaves out."""
        return 0 if self._filtered is None else int(self._filtered.sum())

    def bucket_counts(self) -> np.ndarray:
        """int64 (K,): the images of each bucket (those the epochs draw)."""
        return np.bincount(self.bucket_of[self.bucket_of >= 0], minlength=len(self.buckets))

    def batch_shape(self, ids: Sequence[int] | np.ndarray) -> tuple[int, int]:
        """The (height, width) of the batch of images ``ids`` (one bucket).

        Raises:
            ValueError: ``ids`` is empty, holds an image left out, or spans buckets.
        """
        b = np.unique(self.bucket_of[np.asarray(ids, dtype=np.int64)])
        if b.size != 1 or b[0] < 0:
            raise ValueError(f"images {list(ids)[:8]} are not one bucket's batch of this sampler")
        return self.buckets.shape(int(b[0]))

