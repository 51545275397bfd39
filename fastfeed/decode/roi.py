"""Region-of-interest JPEG decoding: decode only the crop (``fastfeed._jpegroi``).

A RandomResizedCrop keeps about half of an image, and decoding is most of the CPU
path's cost. The optional C extension ``fastfeed._jpegroi`` (built from
``fastfeed/_jpegroi.c`` by ``pip install`` when a C compiler and libjpeg-turbo's
headers are present, e.g. Debian's ``libjpeg62-turbo-dev``) drives libjpeg-turbo's
libjpeg API directly: IDCT, upsampling and colour conversion only for the crop's
columns (``jpeg_crop_scanline``), only entropy decoding for the rows above it
(``jpeg_skip_scanlines``), and nothing below it (the decode stops after its last row),
at the same DCT scale (1/2, 1/4, 1/8) the full decoder would use. It releases the GIL.

When the extension is missing (no compiler or headers at install time, another
Python), :func:`available` is False and :class:`fastfeed.decode.image.ImageDecoder`
decodes the whole image with simplejpeg or Pillow as before. Anything the extension
does not take (CMYK/YCCK, corrupt or truncated data, which libjpeg reports as a
warning) also goes to that path, so errors and skips behave exactly as without it.

The crop is chosen on the upright image (after EXIF orientation);
:func:`stored_rect` maps it back to the stored image, whose pixels are then decoded
and turned upright.

Example:
    >>> stored_rect((0, 10, 20, 30), orientation=6, stored_hw=(100, 200))
    (60, 0, 30, 20)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["available", "decode_crop", "header", "scratch_size", "stored_rect"]

_MODULE: Any = None
_LOADED = False


def _module() -> Any:
    global _MODULE, _LOADED
    if not _LOADED:
        _LOADED = True
        try:
            from fastfeed import _jpegroi
        except ImportError:  # not built (no compiler/headers at install time) or another Python
            _jpegroi = None
        _MODULE = _jpegroi
    return _MODULE


def available() -> bool:
    """True when the ``fastfeed._jpegroi`` extension was built and imports."""
    return _module() is not None


def add_restarts(data: bytes | memoryview) -> bytes:
    """The same JPEG with a restart marker after every MCU, losslessly.

    The DCT coefficients are copied unchanged (decoded pixels are identical) and the
    Huffman tables re-optimised, which usually more than pays for the markers (2 bytes
    per 16x16 block). EXIF, ICC and other APPn/COM markers are kept; progressive input
    comes out baseline. :func:`decode_crop` then cuts a crop's restart segments out of
    the entropy-coded data and decodes only those, instead of entropy-decoding every
    row down to the crop's last one (what ``fastfeed pack --jpeg-restarts`` is for).

    Raises:
        ValueError: libjpeg cannot read the image cleanly (corrupt or truncated data).
        RuntimeError: the extension is not built (see :func:`available`).

    Example:
        >>> from fastfeed.decode import roi
        >>> roi.add_restarts(open("photo.jpg", "rb").read())[:2]  # doctest: +SKIP
        b'\\xff\\xd8'
    """
    m = _module()
    if m is None:
        raise RuntimeError("fastfeed._jpegroi is not built: reinstall fastfeed from source with a C compiler "
                           "and libjpeg-turbo's headers (apt-get install libturbojpeg0-dev)")
    out: bytes = m.add_restarts(data)
    return out


def header(data: bytes | memoryview) -> tuple[int, int, bool] | None:
    """``(height, width, supported)`` of a JPEG; None when libjpeg cannot read the header.

    ``supported`` is False for CMYK/YCCK images (left to the full decoder).
    """
    m = _module()
    try:
        h, w, cs = m.header(data)
    except ValueError:
        return None
    return h, w, cs not in (m.JCS_CMYK, m.JCS_YCCK)


def stored_rect(rect: tuple[int, int, int, int], *, orientation: int,
                stored_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """The stored image's rectangle that becomes ``rect`` of the upright image.

    Args:
        rect: ``(top, left, height, width)`` in the upright image.
        orientation: EXIF orientation 1..8 (how the stored pixels are turned upright,
            as :func:`fastfeed.decode.image._orient` does).
        stored_hw: ``(height, width)`` of the stored image (at the decode scale).

    Example:
        >>> stored_rect((1, 2, 3, 4), orientation=3, stored_hw=(10, 10))
        (6, 4, 3, 4)
    """
    top, left, h, w = rect
    H, W = stored_hw
    bottom, right = top + h, left + w
    if orientation == 2:
        return top, W - right, h, w
    if orientation == 3:
        return H - bottom, W - right, h, w
    if orientation == 4:
        return H - bottom, left, h, w
    if orientation == 5:
        return left, top, w, h
    if orientation == 6:
        return H - right, top, w, h
    if orientation == 7:
        return H - right, W - bottom, w, h
    if orientation == 8:
        return left, W - bottom, w, h
    return rect


def decode_crop(data: bytes | memoryview, denom: int, rect: tuple[int, int, int, int],
                scratch: np.ndarray | None = None) -> np.ndarray | None:
    """RGB ``(height, width, 3)`` uint8 pixels of ``rect`` of the stored image at scale 1/denom.

    ``rect`` is ``(top, left, height, width)`` in the image as libjpeg scales it
    (``ceil(size / denom)``). With ``scratch`` (a 1-D uint8 array) the result is a view
    of it, which saves allocating (and page-faulting) a fresh buffer per image. When
    ``scratch`` holds :func:`scratch_size` bytes, libjpeg writes its rows (widened to whole
    blocks) straight into it and the result is a strided view of those rows, with no copy.
    Returns None when the extension declines the image (unsupported colour space, corrupt
    or truncated data): decode it some other way.

    Example:
        >>> scratch = np.empty(scratch_size(100, 120), np.uint8)  # doctest: +SKIP
        >>> decode_crop(jpeg_bytes, 1, (10, 20, 100, 120), scratch).shape  # doctest: +SKIP
        (100, 120, 3)
    """
    top, left, h, w = rect
    n = h * w * 3
    if scratch is None or scratch.size < n:
        scratch = np.empty(n, np.uint8)
    try:
        if scratch.size < scratch_size(h, w):
            _module().decode_crop(data, scratch, denom, top, left, h, w)
            return scratch[:n].reshape(h, w, 3)
        _, cols, skip = _module().decode_crop(data, scratch, denom, top, left, h, w, True)
    except ValueError:
        return None
    return scratch[: h * cols * 3].reshape(h, cols, 3)[:, skip: skip + w]


def scratch_size(height: int, width: int) -> int:
    """Bytes of scratch that let :func:`decode_crop` skip its row copy for a crop this size.

    libjpeg widens a cropped row to whole iMCUs (at most 32 pixels each side).
    """
    return height * (width + 64) * 3
