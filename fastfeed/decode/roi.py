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
Python), :func:`built` is False. JPEGs with a restart marker after every MCU
(``fastfeed pack``'s default) are then still cut in the compressed domain, in Python
(:func:`cut_restarts`), and the smaller JPEG decoded by simplejpeg; plain JPEGs are
decoded whole by simplejpeg or Pillow. Anything the extension does not take
(CMYK/YCCK, corrupt or truncated data, which libjpeg reports as a warning) also goes to
the full decoders, so errors and skips behave exactly as without it.

``FASTFEED_NO_JPEGROI=1`` in the environment (read at each call) makes this process behave
as if the extension were not built: to compare the paths, or to check what a machine
without it (a Ray node, a worker) does.

The crop is chosen on the upright image (after EXIF orientation);
:func:`stored_rect` maps it back to the stored image, whose pixels are then decoded
and turned upright.

Example:
    >>> stored_rect((0, 10, 20, 30), orientation=6, stored_hw=(100, 200))
    (60, 0, 30, 20)
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RestartCut", "add_restarts", "available", "built", "cut_restarts", "decode_crop", "header",
           "scratch_size", "stored_rect", "why_not_built"]

_MODULE: Any = None
_LOADED = False
_TURBO: bool | None = None

#: Set (to anything but ``0``) in a process's environment: the extension is treated as not built there.
NO_EXTENSION_ENV = "FASTFEED_NO_JPEGROI"


def _module() -> Any:
    global _MODULE, _LOADED
    if os.environ.get(NO_EXTENSION_ENV, "") not in ("", "0"):
        return None
    if not _LOADED:
        _LOADED = True
        try:
            from fastfeed import _jpegroi
        except ImportError:  # not built (no compiler/headers at install time) or another Python
            _jpegroi = None
        _MODULE = _jpegroi
    return _MODULE


def built() -> bool:
    """True when the ``fastfeed._jpegroi`` extension was built and imports (and
    ``FASTFEED_NO_JPEGROI`` is not set).

    Packing needs it to add restart markers (:func:`add_restarts`); the decoder needs it
    to decode only the region of a plain JPEG (see :func:`available`).
    """
    return _module() is not None


def why_not_built() -> str:
    """Why :func:`built` is False in this process (for messages); ``""`` when it is True.

    Example:
        >>> why_not_built() in ("", "not built", "FASTFEED_NO_JPEGROI is set")
        True
    """
    if os.environ.get(NO_EXTENSION_ENV, "") not in ("", "0"):
        return f"{NO_EXTENSION_ENV} is set"
    return "" if built() else "not built"


def available() -> bool:
    """True when the CPU decoder decodes only the crop of every JPEG it crops.

    That needs the extension (:func:`built`) and the decoder's turbo path, simplejpeg and
    OpenCV (which resizes the crops); without them the decoder uses Pillow and never this
    module. JPEGs with restart markers are cropped by :func:`cut_restarts` even without
    the extension (see :func:`fastfeed.decode.image.decode_path`).
    """
    return built() and _turbo_libs()


def _turbo_libs() -> bool:
    global _TURBO
    if _TURBO is None:
        try:
            import cv2  # noqa: F401
            import simplejpeg  # noqa: F401
        except ImportError:
            _TURBO = False
        else:
            _TURBO = True
    return _TURBO


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
        raise RuntimeError("fastfeed._jpegroi is not built: install a C compiler and libjpeg-turbo's headers "
                           "(Debian: apt-get install gcc libjpeg62-turbo-dev; Ubuntu: apt-get install gcc "
                           "libjpeg-turbo8-dev), then reinstall from the fastfeed clone: pip install --no-deps "
                           "--force-reinstall . (pip install --no-deps -e . for an editable install)")
    out: bytes = m.add_restarts(data)
    return out


def header(data: bytes | memoryview) -> tuple[int, int, bool] | None:
    """``(height, width, supported)`` of a JPEG; None when libjpeg cannot read the header.

    ``supported`` is False for CMYK/YCCK images (left to the full decoder). None too when
    the extension is not loaded (``FASTFEED_NO_JPEGROI`` set since the caller checked).
    """
    m = _module()
    if m is None:
        return None
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
    m = _module()
    if m is None:  # FASTFEED_NO_JPEGROI set since the caller checked available()
        return None
    top, left, h, w = rect
    n = h * w * 3
    if scratch is None or scratch.size < n:
        scratch = np.empty(n, np.uint8)
    try:
        if scratch.size < scratch_size(h, w):
            m.decode_crop(data, scratch, denom, top, left, h, w)
            return scratch[:n].reshape(h, w, 3)
        _, cols, skip = m.decode_crop(data, scratch, denom, top, left, h, w, True)
    except ValueError:
        return None
    return scratch[: h * cols * 3].reshape(h, cols, 3)[:, skip: skip + w]


def scratch_size(height: int, width: int) -> int:
    """Bytes of scratch that let :func:`decode_crop` skip its row copy for a crop this size.

    libjpeg widens a cropped row to whole iMCUs (at most 32 pixels each side).
    """
    return height * (width + 64) * 3


# ----------------------------------------------------------------------- restart segments, in Python
# The same cut as ``restart_subimage`` in fastfeed/_jpegroi.c, for installs without the
# extension: a JPEG with a restart marker after every MCU (``fastfeed pack``'s default) is
# cut in the compressed domain into a smaller JPEG holding only the crop's MCUs, which
# simplejpeg then decodes. Byte scanning is numpy's; the Python work is per MCU row.

@dataclass(frozen=True)
class _Frame:
    """What the cut needs from a baseline JPEG's headers."""

    head: bytes  # SOI + the table/frame/DRI/scan segments (no APPn/COM), SOF size patched later
    sof_at: int  # where the SOF segment starts in ``head``
    height: int
    width: int
    mcu_h: int
    mcu_w: int
    restart_interval: int
    scan: int  # where the entropy-coded data starts in the file


def _frame(data: bytes) -> _Frame | None:
    """The headers of a baseline, single-scan JPEG with restart markers; None otherwise."""
    n, pos = len(data), 2
    keep: list[bytes] = [b"\xff\xd8"]
    kept = 2
    sof_at = ri = X = Y = nf = 0
    hmax = vmax = 1
    if data[:2] != b"\xff\xd8":
        return None
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        m = data[pos + 1]
        if m == 0xFF:
            pos += 1
            continue
        seg_len = (data[pos + 2] << 8) | data[pos + 3]
        end = pos + 2 + seg_len
        if seg_len < 2 or end > n:
            return None
        if m in (0xC0, 0xC1):
            if seg_len < 8 or data[pos + 4] != 8:
                return None
            Y, X, nf = struct.unpack_from(">HHB", data, pos + 5)
            if nf not in (1, 3) or seg_len < 8 + 3 * nf or not X or not Y:
                return None
            for c in range(nf):
                hv = data[pos + 11 + 3 * c]
                h, v = hv >> 4, hv & 15
                if not (1 <= h <= 4 and 1 <= v <= 4):
                    return None
                hmax, vmax = max(hmax, h), max(vmax, v)
            sof_at = kept
        elif 0xC2 <= m <= 0xCF and m not in (0xC4, 0xC8):
            return None  # progressive, lossless, hierarchical, arithmetic
        elif m == 0xDD:
            if seg_len < 4:
                return None
            ri = (data[pos + 4] << 8) | data[pos + 5]
        elif m == 0xDA:
            if not sof_at or seg_len < 6 or data[pos + 4] != nf or not ri:
                return None
            keep.append(data[pos:end])
            mcu = 8 if nf == 1 else None
            return _Frame(b"".join(keep), sof_at, Y, X, mcu or 8 * vmax, mcu or 8 * hmax, ri, end)
        elif m == 0xD9 or 0xD0 <= m <= 0xD8:
            return None
        if not (0xE0 <= m <= 0xEF or m == 0xFE):
            keep.append(data[pos:end])
            kept += end - pos
        pos = end
    return None


def _segment_starts(data: bytes, scan: int, total: int) -> np.ndarray | None:
    """Where each of the ``total`` restart segments starts, plus the scan's end + 2."""
    buf = np.frombuffer(data, np.uint8)
    ff = np.flatnonzero(buf[scan:-1] == 0xFF) + scan
    nxt = buf[ff + 1]
    marker = ff[(nxt != 0x00) & (nxt != 0xFF)]
    code = buf[marker + 1]
    is_rst = (code >= 0xD0) & (code <= 0xD7)
    n_rst = int(np.argmin(is_rst)) if not is_rst.all() else -1
    if n_rst != total - 1:  # the markers must be RST*(total - 1) then EOI or another marker
        return None
    if not np.array_equal(code[:n_rst], 0xD0 + (np.arange(n_rst) & 7)):
        return None
    starts = np.empty(total + 1, np.int64)
    starts[0] = scan
    starts[1:] = marker[: total] + 2
    return starts


@dataclass(frozen=True)
class RestartCut:
    """A sub-image JPEG cut out of a larger one by :func:`cut_restarts`."""

    jpeg: bytes
    height: int  # the sub-image's size at full scale (as in its SOF)
    width: int
    top: int  # where the asked-for rectangle starts in it, at the asked-for scale
    left: int


def _span(start: int, size: int, seg: int, count: int) -> tuple[int, int]:
    """The segments ``[first, end)`` of one axis a sub-image needs for pixels ``[start, start + size)``.

    Two pixels of context on each side: fancy upsampling reads the neighbouring chroma
    sample, so only a sub-image's outermost pixels differ from the whole image's. At
    least 3 segments (or all there are): libjpeg upsamples a component only 2 samples
    wide or high without the fancy filter, which would change every pixel.
    """
    first, end = max(0, start - 2) // seg, min(count, -(-(start + size + 2) // seg))
    while end - first < 3 and (first > 0 or end < count):
        if end < count:
            end += 1
        else:
            first -= 1
    return first, end


def cut_restarts(data: bytes | memoryview, denom: int, rect: tuple[int, int, int, int]) -> RestartCut | None:
    """A smaller JPEG holding only the restart segments that cover ``rect``.

    ``rect`` is ``(top, left, height, width)`` at scale 1/denom, as for :func:`decode_crop`.
    Returns None when the file has no restart markers dividing its MCU rows (a plain JPEG:
    decode it whole), is not a clean baseline JPEG (progressive, truncated, data after the
    scan), or the crop covers the whole width from the top (nothing to cut). Decoded at
    1/denom, the sub-image holds the same pixels as the whole image around ``rect``: one
    segment more on every side comes along, as chroma upsampling reads its neighbours.

    Example:
        >>> cut_restarts(b"\\xff\\xd8 not a JPEG with restart markers", 1, (0, 0, 8, 8)) is None
        True
    """
    data = data if isinstance(data, bytes) else bytes(data)
    f = _frame(data)
    if f is None:
        return None
    per_row = -(-f.width // f.mcu_w)
    rows = -(-f.height // f.mcu_h)
    if per_row % f.restart_interval:
        return None
    segs_row = per_row // f.restart_interval
    starts = _segment_starts(data, f.scan, segs_row * rows)
    if starts is None:
        return None
    sw, sh = f.restart_interval * f.mcu_w // denom, f.mcu_h // denom
    if not sw or not sh:
        return None
    top, left, height, width = rect
    c0, c1 = _span(left, width, sw, segs_row)
    r0, r1 = _span(top, height, sh, rows)
    if c0 >= c1 or r0 >= r1 or (r0 == 0 and c0 == 0 and c1 == segs_row):
        return None
    sub_w = min(c1 * f.restart_interval * f.mcu_w, f.width) - c0 * f.restart_interval * f.mcu_w
    sub_h = min(r1 * f.mcu_h, f.height) - r0 * f.mcu_h
    head = bytearray(f.head)
    struct.pack_into(">HH", head, f.sof_at + 5, sub_h, sub_w)
    row_first = np.arange(r0, r1) * segs_row
    a, b = starts[row_first + c0], starts[row_first + c1] - 2  # each row's segments, last RST off
    view = memoryview(data)
    pieces = [bytes(head)]
    for i in range(r1 - r0):
        pieces.append(view[a[i]:b[i]])
        pieces.append(b"\xff\xd0")
    pieces[-1] = b"\xff\xd9"
    out = bytearray(b"".join(pieces))
    # renumber the RSTs: inside each row (they kept their old numbers) and between rows
    off = len(head) + np.concatenate(([0], np.cumsum(b - a + 2)[:-1]))
    inner = starts[row_first[:, None] + np.arange(c0 + 1, c1)[None, :]] - 2 - a[:, None] + off[:, None]
    at = np.concatenate([inner, (off + b - a)[:, None]], axis=1).ravel()[:-1]
    arr = np.frombuffer(out, np.uint8)
    arr[at + 1] = 0xD0 + (np.arange(at.size) & 7)
    return RestartCut(bytes(out), sub_h, sub_w, top - r0 * sh, left - c0 * sw)
