"""Crop geometry and per-sample randomness for the CPU image decoder (pure numpy).

Random augmentation draws come from a counter-based hash of ``(seed, epoch, sample)``
(splitmix64), computed for a whole batch in one vectorised call, so a sample gets the
same crop and flip whichever worker or process decodes it, and no generator object is
created per sample.

:func:`random_resized_crop` is the usual RandomResizedCrop rule: up to 10 tries of a
random area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``, placed
uniformly; the fallback is the largest central crop with the ratio clamped into range.
:func:`center_crop` is the evaluation crop (resize the shorter side to
``size / crop_fraction`` then take the central ``size``), expressed as a box in the
original image so the decoder can crop before it resizes. :func:`cover_crops` is the crop of
aspect-ratio bucket batches: resize to cover the bucket, crop it (random or central), flip; one
vectorised function that both backends (``decode="cpu"`` and ``"dali"``) call, so their crops
are the same. :func:`normalize_image_size` is
the one reading of an ``image_size`` argument (``224`` or ``(h, w)``) for every decoder,
the loader's options and the tune store.

Example:
    >>> u = uniforms(seed=0, epoch=0, ids=np.array([7]), n=NUM_UNIFORMS)
    >>> y, x, h, w = random_resized_crop(375, 500, u[0])
    >>> 0 <= y and y + h <= 375 and 0 <= x and x + w <= 500
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fastfeed.errors import ConfigError

__all__ = ["CROPS", "MAX_IMAGE_SIDE", "NUM_UNIFORMS", "CoverCrops", "center_crop", "check_crop", "cover_crops",
           "dct_denominator", "normalize_image_size", "random_resized_crop", "uniforms"]

_TRIES = 10
#: Uniform draws per sample: 2 per try, 2 for the placement, 1 for the flip.
NUM_UNIFORMS = 2 * _TRIES + 3
FLIP = NUM_UNIFORMS - 1
_PLACE = 2 * _TRIES  # the two placement draws (top, left), which cover_crops uses too
#: Where an aspect-ratio bucket batch crops an image resized to cover the bucket (``Crop(bucket_crop=)``).
CROPS = ("random", "center")
#: The largest side ``image_size`` may ask for: one 8192 x 8192 RGB output is 201 MB, a batch of 32 of
#: them 6.4 GB (beyond, a typo such as ``image_size=100000`` would try to allocate 30 GB per image).
MAX_IMAGE_SIDE = 8192

def normalize_image_size(image_size: int | Sequence[int] | None) -> tuple[int, int] | None:
    """``224`` or ``(h, w)`` (a tuple, a list from JSON) -> ``(h, w)``; None stays None.

    Raises:
        ConfigError: not an int or a pair of ints, not positive, or a side over
            :data:`MAX_IMAGE_SIDE`.

    Example:
        >>> normalize_image_size(224), normalize_image_size([160, 128]), normalize_image_size(None)
        ((224, 224), (160, 128), None)
        >>> normalize_image_size(100000)
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: image_size=100000: a side of at most 8192 pixels (one 100000 x 100000 RGB image is 30.0 GB, and a batch holds batch_size of them); pass the size the model takes (e.g. 224), or image_size=None for the images as stored
        >>> normalize_image_size(10**400)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: image_size=1000...000: a side of at most 8192 pixels (one RGB image of that size is more than a million GB, ...
    """
    if image_size is None:
        return None
    if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
        size = (int(image_size), int(image_size))
    else:
        try:
            h, w = image_size  # type: ignore[misc]
            if isinstance(h, bool) or isinstance(w, bool) or int(h) != h or int(w) != w:
                raise ValueError
            size = (int(h), int(w))
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
            raise ConfigError(f"image_size={image_size!r}: give an int or (height, width)") from None
    if min(size) < 1:
        raise ConfigError(f"image_size={image_size!r} must be positive")
    if max(size) > MAX_IMAGE_SIDE:
        # in integers first: the bytes of a side of 10**400 are too large for a float
        one = (f"one {size[0]} x {size[1]} RGB image is {3 * size[0] * size[1] / 1e9:.1f} GB"
               if 3 * size[0] * size[1] < 10**15 else "one RGB image of that size is more than a million GB")
        raise ConfigError(f"image_size={image_size!r}: a side of at most {MAX_IMAGE_SIDE} pixels ({one}, and a batch "
                          "holds batch_size of them); pass the size the model takes (e.g. 224), or image_size=None "
                          "for the images as stored")
    return size


def _pair(name: str, value: Sequence[float], hi: float) -> tuple[float, float]:
    try:
        lo_v, hi_v = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name}={value!r}: give two numbers (low, high)") from None
    if not 0 < lo_v <= hi_v <= hi:
        raise ConfigError(f"{name}={value!r}: need 0 < low <= high <= {hi:g}")
    return lo_v, hi_v


def check_crop(scale: Sequence[float], ratio: Sequence[float], crop_fraction: float, *,
               names: tuple[str, str, str] = ("scale", "ratio", "crop_fraction"),
               ) -> tuple[tuple[float, float], tuple[float, float], float]:
    """Validate the crop settings: RandomResizedCrop's area ``scale`` and aspect ``ratio``
    ranges, and the evaluation crop's ``crop_fraction`` of the shorter side; ``names`` are
    what the messages call them.

    Raises:
        ConfigError: a range that is not ``0 < low <= high`` (``scale <= 1``), or a
            fraction outside (0, 1].

    Example:
        >>> check_crop((0.08, 1), [0.75, 4 / 3], 0.875)
        ((0.08, 1.0), (0.75, 1.3333333333333333), 0.875)
    """
    try:
        fraction = float(crop_fraction)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float (10**400)
        fraction = math.nan
    if not 0 < fraction <= 1:
        raise ConfigError(f"{names[2]}={crop_fraction!r} must be in (0, 1]")
    return _pair(names[0], scale, 1.0), _pair(names[1], ratio, 100.0), fraction


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def uniforms(*, seed: int, epoch: int, ids: np.ndarray, n: int) -> np.ndarray:
    """float64 ``(len(ids), n)`` uniforms in [0, 1), a pure function of (seed, epoch, id).

    Example:
        >>> a = uniforms(seed=1, epoch=2, ids=np.array([5, 9]), n=3)
        >>> b = uniforms(seed=1, epoch=2, ids=np.array([9]), n=3)
        >>> bool((a[1] == b[0]).all())
        True
    """
    base = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
    base = _mix(base ^ np.array([epoch & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    keys = _mix(base ^ np.asarray(ids, dtype=np.int64).astype(np.uint64))  # (B,)
    counters = (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)[None, :]  # (1, n)
    bits = _mix(keys[:, None] + counters)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def random_resized_crop(
    height: int, width: int, u: np.ndarray | Sequence[float],
    scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """A RandomResizedCrop box ``(top, left, height, width)`` from a row of :func:`uniforms`.

    Example:
        >>> random_resized_crop(100, 100, np.full(NUM_UNIFORMS, 0.5))
        (14, 14, 73, 73)
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(_TRIES):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[2 * t])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[2 * t + 1])
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[2 * _TRIES] * (height - h + 1))
            left = int(u[2 * _TRIES + 1] * (width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    h, w = max(1, min(h, height)), max(1, min(w, width))
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop(height: int, width: int, out_h: int, out_w: int,
                crop_fraction: float = 0.875) -> tuple[int, int, int, int]:
    """The evaluation crop box ``(top, left, height, width)`` in the original image.

    Same as resizing the shorter side to ``max(out_h, out_w) / crop_fraction`` and taking
    the central ``out_h x out_w`` (``Resize(256)`` + ``CenterCrop(224)`` for 224).

    Example:
        >>> center_crop(375, 500, 224, 224)
        (23, 86, 328, 328)
    """
    k = max(out_h, out_w) / (crop_fraction * min(height, width))
    h = max(1, min(height, int(round(out_h / k))))
    w = max(1, min(width, int(round(out_w / k))))
    return (height - h) // 2, (width - w) // 2, h, w


def dct_denominator(crop_h: int, crop_w: int, out_h: int, out_w: int) -> int:
    """The largest JPEG DCT reduction (1, 2, 4 or 8) that keeps the crop >= the output.

    Only power-of-two reductions are used: libjpeg-turbo's other ratios (3/8, 5/8...)
    are slower than decoding at full size.

    Example:
        >>> dct_denominator(400, 400, 224, 224), dct_denominator(1000, 1000, 224, 224)
        (1, 4)
    """
    room = min(crop_h / out_h, crop_w / out_w)
    d = 1
    while d < 8 and room >= 2 * d:
        d *= 2
    return d


@dataclass(frozen=True)
class CoverCrops:
    """The crops of a batch of images resized to cover one bucket (see :func:`cover_crops`).

    Attributes:
        boxes: int64 (B, 4) ``(top, left, height, width)`` of the crop in each upright original image.
        top_left: int64 (B, 2) the crop's (top, left) in the image resized to cover the bucket (and
            flipped, when flipped): SDXL's ``crop_coords_top_left``.
        flips: bool (B,) mirrored horizontally.
    """

    boxes: np.ndarray
    top_left: np.ndarray
    flips: np.ndarray


def cover_crops(sizes: np.ndarray, out_h: int, out_w: int, *, seed: int, epoch: int, ids: np.ndarray,
                random: bool, flip: bool) -> CoverCrops:
    """Resize each image to cover ``out_h x out_w`` (aspect kept), crop that, maybe flip.

    Image ``i`` of upright size ``(h, w)`` is scaled by ``s = max(out_h / h, out_w / w)`` to
    ``(round(h s), round(w s))``; the crop's top-left corner in that image is drawn from
    :func:`uniforms` (the draws RandomResizedCrop places its crop with) when ``random``, else
    central; it flips when ``flip`` and the flip draw is under 0.5. What the decoders cut is the
    same crop in the original image (rounded to whole pixels), which they resize to the output.

    Args:
        sizes: int (B, 2) upright (height, width) of each image, as the index records them.
        out_h, out_w: the bucket.
        seed, epoch, ids: the draws' key (the loader's seed, the epoch, each sample's number).
        random: random placement (else the center).
        flip: random horizontal flips.

    Example:
        >>> c = cover_crops(np.array([[300, 400]]), 100, 100, seed=0, epoch=0, ids=np.array([0]), random=False,
        ...                 flip=False)
        >>> c.boxes.tolist(), c.top_left.tolist()
        ([[0, 48, 300, 300]], [[0, 16]])
    """
    hw = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)
    h, w = hw[:, 0], hw[:, 1]
    s = np.maximum(out_h / h, out_w / w)
    room_h = np.maximum(0, np.floor(h * s + 0.5) - out_h)
    room_w = np.maximum(0, np.floor(w * s + 0.5) - out_w)
    u = uniforms(seed=seed, epoch=epoch, ids=ids, n=NUM_UNIFORMS) if (random or flip) and len(ids) else None
    if random and u is not None:
        top = np.minimum(np.floor(u[:, _PLACE] * (room_h + 1)), room_h)
        left = np.minimum(np.floor(u[:, _PLACE + 1] * (room_w + 1)), room_w)
    else:
        top, left = np.floor(room_h / 2), np.floor(room_w / 2)
    flips = (u[:, FLIP] < 0.5) if flip and u is not None else np.zeros(len(h), dtype=bool)
    y0 = np.minimum(np.floor(top / s + 0.5), h - 1)
    x0 = np.minimum(np.floor(left / s + 0.5), w - 1)
    bh = np.clip(np.floor(out_h / s + 0.5), 1, h - y0)
    bw = np.clip(np.floor(out_w / s + 0.5), 1, w - x0)
    boxes = np.stack([y0, x0, bh, bw], axis=1).astype(np.int64)
    shown_left = np.where(flips, room_w - left, left)  # measured in the flipped image when flipped
    return CoverCrops(boxes, np.stack([top, shown_left], axis=1).astype(np.int64), flips)
