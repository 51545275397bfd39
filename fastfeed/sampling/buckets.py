"""Aspect-ratio buckets: the set of (height, width) shapes, and which bucket each image goes to.

Pure numpy over the images' displayed sizes (``sizes.npy``, :attr:`~fastfeed.packed.index.DatasetIndex.image_sizes`);
no image is read. Used by :class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler` and
its balance report.

- :func:`make_buckets`: every (h, w) with both sides multiples of ``step`` whose area is the
  closest such to ``resolution ** 2``, from ``1 : max_ratio`` to ``max_ratio : 1`` (at 1024:
  2048x512 ... 1024x1024 ... 512x2048, 33 buckets). :func:`as_buckets` takes the user's list
  (SDXL's, say) instead.
- :func:`assign`: each image goes to the bucket whose aspect ratio is nearest its own **in log
  space** (``|log(w/h) - log(W/H)|``, so 2:1 and 1:2 are equally far from 1:1).
- :func:`fit`: how the image covers its bucket: the scale that makes it cover ``H x W``
  (``max(H / h, W / w)``, > 1 is an upscale) and the share of the covered image a crop cuts
  away. :class:`FitPolicy` says which images fit no bucket well (an upscale beyond
  ``max_upscale``, a crop beyond ``max_crop``, or no recorded size) and whether that is an
  error or a counted skip.

Example:
    >>> b = make_buckets(1024)
    >>> len(b), b.shape(0), b.shape(len(b) - 1), (1024, 1024) in b.shapes()
    (33, (2048, 512), (512, 2048), True)
    >>> assign(np.array([[375, 500], [1000, 1000], [500, 375]]), b).tolist()
    [18, 16, 14]
    >>> [b.shape(k) for k in (18, 16, 14)]
    [(896, 1152), (1024, 1024), (1152, 896)]
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fastfeed.errors import ConfigError

__all__ = ["Buckets", "Fit", "FitPolicy", "MAX_RATIO", "MAX_SIDE", "as_buckets", "assign", "check_ratio", "check_side",
           "fit", "make_buckets"]

#: The largest ``resolution`` and ``step`` (pixels): the decoder's largest output side,
#: :data:`fastfeed.decode.geometry.MAX_IMAGE_SIDE` (equal by a test: sampling does not import decode).
MAX_SIDE = 8192
#: The largest ``max_ratio``: 64:1 is already a 8192 x 128 strip; without a bound, 2**63 makes buckets
#: until memory runs out.
MAX_RATIO = 64.0
#: Misfit reasons, in the order reports list them.
REASONS = ("no size", "upscale", "crop")


@dataclass(frozen=True)
class Buckets:
    """A set of bucket shapes, sorted by aspect ratio (tallest first); at most one per aspect ratio.

    Attributes:
        heights, widths: int64 (K,) each.
    """

    heights: np.ndarray
    widths: np.ndarray

    def __len__(self) -> int:
        return int(self.heights.shape[0])

    def shape(self, k: int) -> tuple[int, int]:
        """(height, width) of bucket ``k``."""
        return int(self.heights[k]), int(self.widths[k])

    def shapes(self) -> list[tuple[int, int]]:
        """Every bucket's (height, width), in order."""
        return [self.shape(k) for k in range(len(self))]

    @property
    def areas(self) -> np.ndarray:
        """int64 (K,): pixels of each bucket."""
        return self.heights * self.widths

    @property
    def log_ratios(self) -> np.ndarray:
        """float64 (K,): ``log(width / height)`` of each bucket, increasing."""
        return np.log(self.widths / self.heights)

    def describe(self) -> list[list[int]]:
        """The shapes as plain lists, for a sampler's state and reports."""
        return [[h, w] for h, w in self.shapes()]


def _sorted(hw: np.ndarray, where: str) -> Buckets:
    ratio = np.log(hw[:, 1] / hw[:, 0])
    order = np.argsort(ratio, kind="stable")
    hw, ratio = hw[order], ratio[order]
    same = np.flatnonzero(np.abs(np.diff(ratio)) < 1e-9)
    if same.size:
        a, b = hw[same[0]], hw[same[0] + 1]
        raise ConfigError(f"{where}: buckets ({a[0]}, {a[1]}) and ({b[0]}, {b[1]}) have the same aspect ratio; give "
                          "one bucket per aspect ratio (an image goes to the bucket of the nearest ratio)")
    return Buckets(np.ascontiguousarray(hw[:, 0]), np.ascontiguousarray(hw[:, 1]))


def make_buckets(resolution: int, *, step: int = 64, max_ratio: float = 4.0) -> Buckets:
    """Buckets of about ``resolution ** 2`` pixels, sides multiples of ``step``, ratios up to ``max_ratio``.

    For every side ``a`` that is a multiple of ``step``, the other side is the multiple of
    ``step`` that brings ``a * b`` closest to ``resolution ** 2``, in both orientations
    (``(a, b)`` and ``(b, a)``: the set is symmetric); shapes whose longer side exceeds
    ``max_ratio`` times the shorter are left out.

    Raises:
        ConfigError: a resolution, step or ratio that makes no bucket, is not a number, or is
            past its bound (:data:`MAX_SIDE`, :data:`MAX_RATIO`).

    Example:
        >>> make_buckets(256, max_ratio=2).shapes()
        [(384, 192), (320, 192), (256, 256), (192, 320), (192, 384)]
    """
    resolution, step = check_side("resolution", resolution), check_side("step", step)
    max_ratio = check_ratio(max_ratio)
    area = float(resolution) ** 2
    sides = np.arange(step, int(math.ceil(math.sqrt(area * max_ratio) / step)) * step + step, step, dtype=np.int64)
    other = np.maximum(step, np.round(area / sides / step).astype(np.int64) * step)
    hw = np.concatenate([np.stack([sides, other], axis=1), np.stack([other, sides], axis=1)])
    hw = np.unique(hw[np.maximum(hw[:, 0] / hw[:, 1], hw[:, 1] / hw[:, 0]) <= max_ratio * (1 + 1e-9)], axis=0)
    if not len(hw):
        raise ConfigError(f"resolution={resolution}, step={step}, max_ratio={max_ratio}: no bucket has sides that are "
                          f"multiples of {step} within that ratio; use a larger resolution or a smaller step")
    # one bucket per aspect ratio: of shapes of one ratio (rare), the one closest to the area
    ratio = np.round(np.log(hw[:, 1] / hw[:, 0]), 9)
    order = np.lexsort((np.abs(hw[:, 0] * hw[:, 1] - area), ratio))
    _, first = np.unique(ratio[order], return_index=True)
    hw = hw[order[first]]
    return _sorted(hw, f"make_buckets({resolution})")


def check_side(name: str, value: Any) -> int:
    """``resolution`` or ``step``: an integer from 1 to :data:`MAX_SIDE` pixels.

    Example:
        >>> check_side("resolution", 10**30)
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: resolution=1000000000000000000000000000000 must be a positive integer (pixels) up to 8192, the largest side the decoder makes
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_SIDE:
        raise ConfigError(f"{name}={value!r} must be a positive integer (pixels) up to {MAX_SIDE}, the largest side "
                          "the decoder makes")
    return int(value)


def check_ratio(value: Any) -> float:
    """``max_ratio``: a number from 1 to :data:`MAX_RATIO` (the longer side over the shorter).

    Example:
        >>> check_ratio(2**63)
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: max_ratio=9223372036854775808 must be a number from 1 to 64 (the longer side over the shorter; 64 is a 8192 x 128 strip)
    """
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not real or not 1 <= value <= MAX_RATIO:  # nan fails the comparison too
        raise ConfigError(f"max_ratio={value!r} must be a number from 1 to {MAX_RATIO:g} (the longer side over the "
                          f"shorter; {MAX_RATIO:g} is a {MAX_SIDE} x {MAX_SIDE // int(MAX_RATIO)} strip)")
    return float(value)


def as_buckets(buckets: Any, *, resolution: int = 1024, step: int = 64, max_ratio: float = 4.0) -> Buckets:
    """``buckets`` given as a :class:`Buckets`, a list of ``(height, width)``, or None (:func:`make_buckets`).

    Raises:
        ConfigError: not pairs of positive integers, or two buckets of one aspect ratio.

    Example:
        >>> as_buckets([(1024, 1024), (768, 1344), (1344, 768)]).shapes()
        [(1344, 768), (1024, 1024), (768, 1344)]
    """
    if buckets is None:
        return make_buckets(resolution, step=step, max_ratio=max_ratio)
    if isinstance(buckets, Buckets):
        return buckets
    try:
        hw = np.array([[int(h), int(w)] for h, w in buckets], dtype=np.int64).reshape(-1, 2)
        exact = all(int(h) == h and int(w) == w for h, w in buckets)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a side too large for int64
        hw, exact = np.zeros((0, 2), np.int64), False
    if not len(hw) or not exact or (hw < 1).any():
        raise ConfigError(f"buckets={buckets!r}: give a list of (height, width) pairs of positive integers, e.g. "
                          "[(1024, 1024), (832, 1216), (1216, 832)]")
    return _sorted(hw, "buckets")


def assign(sizes: np.ndarray, buckets: Buckets) -> np.ndarray:
    """The bucket of each image: the nearest aspect ratio in log space; -1 for an image without a size.

    Args:
        sizes: int (N, 2) displayed (height, width); (0, 0) for unknown.
        buckets: the bucket set.

    Example:
        >>> assign(np.array([[100, 400], [0, 0]]), make_buckets(256, max_ratio=2)).tolist()
        [4, -1]
    """
    hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    known = (hw[:, 0] > 0) & (hw[:, 1] > 0)
    ratio = np.log(np.where(known, hw[:, 1], 1) / np.where(known, hw[:, 0], 1))
    logs = buckets.log_ratios
    mids = (logs[1:] + logs[:-1]) / 2
    out = np.searchsorted(mids, ratio, side="left").astype(np.int64)
    out[~known] = -1
    return out


@dataclass(frozen=True)
class Fit:
    """How each image covers its bucket (float64 (N,) each; NaN where an image has no bucket).

    Attributes:
        scale: the resize factor that makes the image cover its bucket (> 1: an upscale).
        crop: the share of the resized image the crop cuts away.
    """

    scale: np.ndarray
    crop: np.ndarray


def fit(sizes: np.ndarray, buckets: Buckets, bucket_of: np.ndarray) -> Fit:
    """:class:`Fit` of images of ``sizes`` in their buckets ``bucket_of`` (:func:`assign`).

    Example:
        >>> f = fit(np.array([[500, 500]]), as_buckets([(1000, 1000)]), np.array([0]))
        >>> float(f.scale[0]), float(f.crop[0])
        (2.0, 0.0)
    """
    hw = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)
    ok = bucket_of >= 0
    k = np.where(ok, bucket_of, 0)
    H, W = buckets.heights[k].astype(np.float64), buckets.widths[k].astype(np.float64)
    h, w = np.where(ok, hw[:, 0], 1.0), np.where(ok, hw[:, 1], 1.0)
    scale = np.maximum(H / h, W / w)
    crop = 1.0 - (H * W) / (scale * scale * h * w)
    return Fit(np.where(ok, scale, np.nan), np.where(ok, np.clip(crop, 0.0, 1.0), np.nan))


@dataclass(frozen=True)
class FitPolicy:
    """Which images fit no bucket well, and what happens to them.

    Attributes:
        max_upscale: the largest resize factor allowed to cover the bucket (1.0: never
            upscale; None: no limit).
        max_crop: the largest share of the resized image a crop may cut away (None: no limit).
        misfit: ``"error"``: a :class:`~fastfeed.errors.ConfigError` naming the first image
            and the counts; ``"skip"``: left out of every epoch, counted and logged.

    Example:
        >>> FitPolicy(max_upscale=2.0).misfits(np.array([[100, 100], [600, 600], [0, 0]]),
        ...                                    as_buckets([(1024, 1024)]))[1]
        {'no size': 1, 'upscale': 1, 'crop': 0}
    """

    max_upscale: float | None = 2.0
    max_crop: float | None = None
    misfit: str = "error"

    def __post_init__(self) -> None:
        up, crop = self.max_upscale, self.max_crop
        # compared, not float()-ed: an int too large for a float (10**400) is refused, not an OverflowError
        if up is not None and (isinstance(up, bool) or not isinstance(up, (int, float))
                               or not 1 <= up <= sys.float_info.max):
            raise ConfigError(f"max_upscale={up!r} must be a number >= 1 and finite (1: never enlarge an image), or "
                              "None for no limit")
        if crop is not None and (isinstance(crop, bool) or not isinstance(crop, (int, float)) or not 0 <= crop < 1):
            raise ConfigError(f"max_crop={crop!r} must be a share in [0, 1) of the resized image, or None")
        if self.misfit not in ("error", "skip"):
            raise ConfigError(f"misfit={self.misfit!r} must be 'error' or 'skip'")

    def misfits(self, sizes: np.ndarray, buckets: Buckets,
                bucket_of: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int]]:
        """(bool (N,) images that fit no bucket well, counts per reason of :data:`REASONS`).

        An image counts once, under its first reason.
        """
        b = assign(sizes, buckets) if bucket_of is None else bucket_of
        f = fit(sizes, buckets, b)
        none = b < 0
        up = ~none & (f.scale > self.max_upscale * (1 + 1e-9)) if self.max_upscale is not None else np.zeros_like(none)
        crop = ~none & ~up & (f.crop > self.max_crop + 1e-12) if self.max_crop is not None else np.zeros_like(none)
        counts = {"no size": int(none.sum()), "upscale": int(up.sum()), "crop": int(crop.sum())}
        return none | up | crop, counts


def check_sizes(sizes: Any, where: str) -> np.ndarray:
    """``sizes`` as a validated int64 (N, 2) array of (height, width) (0, 0 for unknown).

    Raises:
        ConfigError: not (N, 2) non-negative integers, or no sample.

    Example:
        >>> check_sizes([[480, 640]], "sizes").tolist()
        [[480, 640]]
    """
    arr = np.asarray(sizes)
    if arr.ndim != 2 or arr.shape[1:] != (2,) or arr.dtype.kind not in "iu":
        raise ConfigError(f"{where}: sizes must be integers of shape (N, 2), (height, width) per image; got "
                          f"{arr.dtype} {arr.shape}")
    if not arr.shape[0]:
        raise ConfigError(f"{where}: no images (empty sizes)")
    if (arr < 0).any():
        i = int(np.flatnonzero((arr < 0).any(axis=1))[0])
        raise ConfigError(f"{where}: image {i} has a negative size {arr[i].tolist()}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def sizes_of(shapes: Sequence[Sequence[int]]) -> np.ndarray:
    """A list of (height, width) as the int64 (N, 2) array the planners take (a convenience).

    Example:
        >>> sizes_of([(3, 4)]).dtype.name
        'int64'
    """
    return check_sizes(np.asarray(shapes, dtype=np.int64).reshape(-1, 2), "sizes")
