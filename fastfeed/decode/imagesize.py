"""An image's displayed (height, width) from its header, without decoding a pixel.

What ``pack`` records in ``sizes.npy`` and ``fastfeed shapes`` adds to an existing dataset:
the size of the image as the CPU loader decodes it, **upright**, so an EXIF-rotated photo
(orientation 5-8) counts with its sides swapped, as :class:`~fastfeed.decode.image.ImageDecoder`
hands it over.

- JPEG: the frame header (``SOFn``) gives the stored size, the EXIF orientation is read as the
  decoder reads it (:func:`fastfeed.decode._exif.jpeg_orientation`): a walk over the marker
  segments, no entropy-coded data touched.
- PNG: the ``IHDR`` chunk, the first one of every PNG; a PNG that carries an ``eXIf`` chunk
  before its image data (rare) is measured by Pillow, which reads its orientation as the
  decoder does.
- Anything else (WebP, GIF, TIFF, ...), and a JPEG whose frame header gives no height
  (a ``DNL`` marker): Pillow's lazy ``Image.open`` (the header only) and its EXIF orientation.

A header that cannot be read gives None; the loader then finds out what is wrong when it
decodes the image, and the index records ``(0, 0)``.

Example:
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (64, 48)).save(buf, "JPEG")
    >>> image_size(buf.getvalue())
    (48, 64)
    >>> buf = io.BytesIO(); Image.new("L", (5, 7)).save(buf, "PNG")
    >>> image_size(buf.getvalue()), image_size(b"not an image")
    ((7, 5), None)
"""

from __future__ import annotations

import io
import struct
from typing import Any, Mapping

from fastfeed.decode._exif import jpeg_orientation, jpeg_segments
from fastfeed.formats.naming import RAW_FIELD, pick_image_field

__all__ = ["image_size", "jpeg_size", "png_size", "sample_size"]

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: Start-of-frame markers that carry the frame size (not DHT C4, JPG C8, DAC CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_EXIF_ORIENTATION = 0x0112


def _upright(h: int, w: int, orientation: int) -> tuple[int, int]:
    return (w, h) if orientation >= 5 else (h, w)


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """Stored (height, width) of a JPEG from its frame header; None when there is none (or a height of 0).

    Example:
        >>> jpeg_size(b"\\xff\\xd8\\xff\\xc0\\x00\\x11\\x08\\x00\\x30\\x00\\x40\\x03" + bytes(9))
        (48, 64)
    """
    mv = memoryview(data)
    for marker, pos, seglen in jpeg_segments(mv):
        if marker in _SOF:
            if seglen < 7 or pos + 9 > len(mv):
                return None
            h, w = struct.unpack_from(">HH", mv, pos + 5)
            return (h, w) if h and w else None
    return None


def png_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """Stored (height, width) of a PNG from its ``IHDR`` chunk; None for anything else.

    Example:
        >>> png_size(b"\\x89PNG\\r\\n\\x1a\\n\\x00\\x00\\x00\\rIHDR\\x00\\x00\\x00\\x05\\x00\\x00\\x00\\x07")
        (7, 5)
    """
    mv = memoryview(data)
    if len(mv) < 24 or bytes(mv[:8]) != _PNG_MAGIC or bytes(mv[12:16]) != b"IHDR":
        return None
    w, h = struct.unpack_from(">II", mv, 16)
    return (h, w) if h and w else None


def _png_has_exif(mv: memoryview) -> bool:
    """True when a PNG has an ``eXIf`` chunk before its first ``IDAT`` (where its orientation lives)."""
    pos, n = 8, len(mv)
    while pos + 8 <= n:
        length = struct.unpack_from(">I", mv, pos)[0]
        kind = bytes(mv[pos + 4: pos + 8])
        if kind == b"eXIf":
            return True
        if kind in (b"IDAT", b"IEND"):
            return False
        pos += 12 + length
    return False


def _pillow_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """Upright (height, width) from Pillow's lazy open (the header only), None when it cannot read it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            w, h = im.size
            if im.format == "JPEG":
                orientation = jpeg_orientation(data)
            else:
                orientation = int(im.getexif().get(_EXIF_ORIENTATION, 1) or 1)
    except Exception:  # noqa: BLE001 - Pillow raises many kinds on damaged headers; the decoder reports it
        return None
    if not (h and w):
        return None
    return _upright(h, w, orientation if 1 <= orientation <= 8 else 1)


def image_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """Displayed (height, width) of an encoded image: EXIF orientation applied (see the module doc).

    Args:
        data: the image file's bytes (JPEG, PNG, or anything Pillow opens).

    Returns:
        ``(height, width)`` upright, or None when the header cannot be read.

    Example:
        >>> image_size(b"\\xff\\xd8\\xff\\xc0\\x00\\x11\\x08\\x00\\x30\\x00\\x40\\x03" + bytes(9))
        (48, 64)
    """
    mv = memoryview(data)
    head = bytes(mv[:8])
    if head[:3] == b"\xff\xd8\xff":
        hw = jpeg_size(mv)
        if hw is not None:
            return _upright(hw[0], hw[1], jpeg_orientation(mv))
    elif head == _PNG_MAGIC:
        hw = png_size(mv)
        if hw is not None and not _png_has_exif(mv):
            return hw
    return _pillow_size(mv)


def sample_size(sample: Mapping[str, Any]) -> tuple[int, int]:
    """Displayed (height, width) of the image the CPU loader decodes from ``sample`` (a dict of
    field -> bytes, as shard readers give it): the header of its image field
    (:func:`~fastfeed.formats.naming.pick_image_field`), or for raw pixels (``rgb8``) the
    ``"__shape__"`` the reader attached; ``(0, 0)`` when it has no image or no readable header.

    Example:
        >>> sample_size({"__key__": "a", "txt": b"hi"}), sample_size({"rgb8": b"", "__shape__": (2, 3)})
        ((0, 0), (2, 3))
    """
    name = pick_image_field(k for k in sample if not k.startswith("__"))
    if name is None:
        return 0, 0
    if name == RAW_FIELD:
        shape = sample.get("__shape__")
        return (int(shape[0]), int(shape[1])) if shape is not None else (0, 0)
    data = sample[name]
    hw = image_size(data) if isinstance(data, (bytes, bytearray, memoryview)) else None
    return (0, 0) if hw is None else hw
