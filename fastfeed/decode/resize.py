"""Resizing a crop into a row of the batch buffer: the one resize of the JPEG and the raw-pixel paths.

Pure numpy, the OpenCV module passed in and the optional C extension ``fastfeed._resize``
(no torch, so ``fastfeed.pack`` can use it too).

The last, bilinear step runs in ``fastfeed._resize`` when it is built (``pip install``
builds it with any C compiler; no library needed) and the CPU has SSSE3 (AVX2 where it has
it): about 2x OpenCV's ``INTER_LINEAR`` on a 224 x 224 output, flip included (2.0-2.1x on the
2-core VM, 2.3-3.1x on the H200 host; ``benchmarks/resize_kernel.py``). Its values are within
3 levels of exact bilinear, 0.37 off on average (OpenCV: 0.27; 7-bit weights, two rounded
passes). ``FASTFEED_NO_RESIZE_EXT=1`` in the environment (read at a process's first resize;
forked workers inherit the choice) resizes with OpenCV instead; :func:`kernel` says which one
this process uses.

Example:
    >>> import cv2
    >>> dst = np.empty((4, 4, 3), np.uint8)
    >>> resize_into(cv2, np.full((10, 9, 3), 7, np.uint8), dst, flip=True)
    >>> int(dst.min()), int(dst.max())
    (7, 7)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["NO_EXTENSION_ENV", "kernel", "resize_into", "resize_into_pillow"]

NO_EXTENSION_ENV = "FASTFEED_NO_RESIZE_EXT"

_UNSET = object()
_EXT: Any = _UNSET  # fastfeed._resize, or None (not built, no SIMD, or turned off); forked workers inherit it


def _extension() -> Any:
    """This process's ``fastfeed._resize`` when it is used (see the module docstring), else None."""
    global _EXT
    if _EXT is not _UNSET:
        return _EXT
    mod = None
    if os.environ.get(NO_EXTENSION_ENV, "") in ("", "0"):
        try:
            from fastfeed import _resize as mod
        except ImportError:
            mod = None
        if mod is not None and mod.simd() == "scalar":  # no SSSE3 (e.g. ARM): OpenCV's NEON code is faster
            mod = None
    _EXT = mod
    return mod


def kernel() -> str:
    """The bilinear resize this process uses: ``fastfeed._resize (avx2)`` (or ``(ssse3)``), or ``OpenCV INTER_LINEAR``.

    Example:
        >>> kernel() in ("fastfeed._resize (avx2)", "fastfeed._resize (ssse3)", "OpenCV INTER_LINEAR")
        True
    """
    mod = _extension()
    return f"fastfeed._resize ({mod.simd()})" if mod is not None else "OpenCV INTER_LINEAR"


def resize_into(cv2: Any, crop: np.ndarray, dst: np.ndarray, flip: bool) -> None:
    """Resize ``crop`` into ``dst`` with OpenCV (module ``cv2``), anti-aliased when shrinking 2x or more; flip.

    While a side is at least twice the output, that side is halved by averaging pixel
    pairs (an odd row count loses the last row, an odd column count the first column):
    both sides with OpenCV's 2x2 ``INTER_AREA`` fast path, one side with
    ``INTER_LINEAR`` at exactly 2x, which is the same pair average. What is left (< 2x)
    is bilinear (``fastfeed._resize`` when built, else OpenCV). That keeps ``INTER_AREA``'s
    anti-aliasing at a fraction of its cost at other ratios (~1.3 ms vs ~0.45 ms for a
    460x300 crop to 224x224 here). The JPEG and
    the raw-pixel paths (:mod:`fastfeed.decode.raw`) both resize with it.

    Example:
        >>> import cv2
        >>> dst = np.empty((2, 2, 3), np.uint8)
        >>> resize_into(cv2, np.zeros((8, 8, 3), np.uint8), dst, flip=False)
        >>> dst.shape
        (2, 2, 3)
    """
    out_h, out_w = dst.shape[:2]
    ch, cw = crop.shape[:2]
    while ch >= 2 * out_h or cw >= 2 * out_w:
        fy = 2 if ch >= 2 * out_h else 1
        fx = 2 if cw >= 2 * out_w else 1
        ty, tx = ch % fy, cw % fx
        if ty or tx:
            crop = crop[: ch - ty, tx: cw]  # one row at the bottom, one column at the left
        ch, cw = ch // fy, cw // fx
        interp = cv2.INTER_AREA if fy == fx == 2 else cv2.INTER_LINEAR
        crop = cv2.resize(crop, (cw, ch), interpolation=interp)
    ext = _extension()
    if ext is not None and crop.strides[1:] == (3, 1) and dst.flags.c_contiguous and crop.dtype == np.uint8:
        ext.resize(crop, dst, flip)  # bilinear and the flip in one pass
        return
    cv2.resize(crop, (out_w, out_h), dst=dst, interpolation=cv2.INTER_LINEAR)
    if flip:
        cv2.flip(dst, 1, dst=dst)  # in place


def resize_into_pillow(arr: np.ndarray, rel: tuple[float, float, float, float], dst: np.ndarray,
                       flip: bool) -> None:
    """The crop ``rel`` (fractions top, left, height, width) of ``arr`` resized into ``dst`` by Pillow
    (bilinear), flipped; the path without OpenCV."""
    from PIL import Image

    H, W = arr.shape[:2]
    out_h, out_w = dst.shape[:2]
    box = (rel[1] * W, rel[0] * H, (rel[1] + rel[3]) * W, (rel[0] + rel[2]) * H)
    im = Image.fromarray(arr).resize((out_w, out_h), Image.BILINEAR, box=box)
    res = np.asarray(im)
    dst[...] = res[:, ::-1] if flip else res
