"""EXIF orientation of a JPEG, read from its APP1 segment without decoding anything.

simplejpeg (libjpeg-turbo) ignores EXIF, so the fast path reads the orientation tag
(0x0112) itself: a walk over the marker segments before the first scan, then one
lookup in the TIFF IFD0. Anything malformed answers 1 (upright), like an image without
EXIF. Pillow's :func:`PIL.ImageOps.exif_transpose` covers the other formats.

Example:
    >>> jpeg_orientation(b"\\xff\\xd8\\xff\\xd9")
    1
"""

from __future__ import annotations

import struct
from typing import Iterator

__all__ = ["jpeg_orientation", "jpeg_segments"]

_ORIENTATION_TAG = 0x0112


def jpeg_segments(data: bytes | memoryview) -> Iterator[tuple[int, int, int]]:
    """``(marker, pos, seglen)`` of each length-bearing marker segment of a JPEG before its first scan.

    ``pos`` is the offset of the segment's ``0xFF``; its payload is ``data[pos + 4 : pos + 2 + seglen]``.
    The walk ends at the first scan or the end of the image, and early on anything malformed (no
    JPEG signature, a byte that is no marker).

    Example:
        >>> list(jpeg_segments(b"\\xff\\xd8\\xff\\xe0\\x00\\x04ab\\xff\\xda"))
        [(224, 2, 4)]
    """
    mv = memoryview(data)
    n = len(mv)
    if n < 4 or mv[0] != 0xFF or mv[1] != 0xD8:
        return
    pos = 2
    while pos + 4 <= n:
        if mv[pos] != 0xFF:
            return
        marker = mv[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan / end of image
            return
        seglen = (mv[pos + 2] << 8) | mv[pos + 3]
        yield marker, pos, seglen
        pos += 2 + seglen


def jpeg_orientation(data: bytes | memoryview) -> int:
    """EXIF orientation (1..8) of a JPEG, 1 when absent or unreadable."""
    mv = memoryview(data)
    for marker, pos, seglen in jpeg_segments(mv):
        if marker == 0xE1 and bytes(mv[pos + 4 : pos + 10]) == b"Exif\x00\x00":
            return _tiff_orientation(mv[pos + 10 : pos + 2 + seglen])
    return 1


def _tiff_orientation(t: memoryview) -> int:
    if len(t) < 8:
        return 1
    order = bytes(t[:2])
    if order == b"II":
        e = "<"
    elif order == b"MM":
        e = ">"
    else:
        return 1
    try:
        (ifd,) = struct.unpack_from(e + "I", t, 4)
        (count,) = struct.unpack_from(e + "H", t, ifd)
        for k in range(count):
            entry = ifd + 2 + 12 * k
            tag, typ = struct.unpack_from(e + "HH", t, entry)
            if tag == _ORIENTATION_TAG:
                if typ == 3:  # SHORT
                    (value,) = struct.unpack_from(e + "H", t, entry + 8)
                elif typ == 4:  # LONG
                    (value,) = struct.unpack_from(e + "I", t, entry + 8)
                else:
                    return 1
                return value if 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1
