"""Image facts used by ``pack`` and ``verify``: extensions, format sniffing, re-encoding.

- :func:`field_ext` normalises a field name's last extension (``JPEG`` -> ``jpg``), so
  ``a.jpg`` and ``a.jpeg`` map to one field;
- :func:`sniff` names an image format from its first bytes (no decoding), which is how
  ``pack`` catches files that carry an image extension but are not images;
- :func:`reencode` implements ``pack --max-side/--quality``: EXIF orientation applied,
  CMYK / 16-bit / palette / alpha images converted properly, resized so the longer side
  is at most ``max_side``, and encoded in the format the field's extension names;
- :func:`decode_error` fully decodes an image and returns what went wrong, for ``verify``.

Example:
    >>> field_ext("seg.JPEG"), sniff(b"\\x89PNG\\r\\n\\x1a\\n...."), sniff(b"hello")
    ('seg.jpg', 'png', None)
"""

from __future__ import annotations

import io
import struct
import warnings
from typing import Any

import numpy as np

__all__ = [
    "IMAGE_EXTS",
    "decode_error",
    "decode_errors",
    "field_ext",
    "is_image_field",
    "reencode",
    "sniff",
]

#: File extensions treated as images (after :func:`field_ext` normalisation).
IMAGE_EXTS = frozenset(
    {"jpg", "png", "gif", "bmp", "webp", "tif", "ppm", "pgm", "pbm", "pnm", "avif", "heic", "heif"}
)
_ALIASES = {"jpeg": "jpg", "jpe": "jpg", "jfif": "jpg", "tiff": "tif"}
#: field extension -> Pillow format written by :func:`reencode`; other images are kept.
_TARGETS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
_ORIENTATION = 0x0112


def field_ext(field: str) -> str:
    """Lower-case a field name and normalise the alias of its last part (``jpeg`` -> ``jpg``)."""
    field = field.lower()
    head, dot, last = field.rpartition(".")
    return f"{head}{dot}{_ALIASES.get(last, last)}"


def is_image_field(field: str) -> bool:
    """True when the field's last extension names an image format."""
    return field.rpartition(".")[2] in IMAGE_EXTS


def sniff(data: bytes) -> str | None:
    """Name the image format of ``data`` from its magic bytes, or None.

    Returns one of ``jpeg png gif bmp webp tiff pnm isobmff`` (AVIF/HEIF).
    """
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM" and len(data) >= 26:
        return "bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if len(data) >= 3 and data[0:1] == b"P" and data[1:2] in b"1234567" and data[2:3].isspace():
        return "pnm"
    if data[4:8] == b"ftyp":
        return "isobmff"
    return None


def decode_errors() -> tuple[type[BaseException], ...]:
    """The exceptions Pillow raises on damaged or hostile image data."""
    from PIL import Image

    return (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError,
            Image.DecompressionBombError)


def _open(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data))


def decode_error(data: bytes) -> str | None:
    """Fully decode ``data`` (first frame) and return the error text, or None when it decodes.

    JPEGs are decoded with DCT scaling (``draft``), which still reads every entropy-coded
    block, so truncation and corruption are found at a fraction of the cost.
    """
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = _open(data)
            if img.format == "JPEG":
                img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
        except decode_errors() as e:
            return f"{type(e).__name__}: {e}"
    return None


def reencode(data: bytes, field: str, max_side: int, quality: int) -> bytes:
    """Implement ``pack --max-side``: return ``data`` re-encoded, or unchanged when it can stay.

    An image is re-encoded when its longer side exceeds ``max_side``, when its EXIF
    orientation is not upright, when its content is not the format its field names (a
    PNG in a ``jpg`` field), or when a ``jpg`` field holds a mode JPEG readers handle
    badly (CMYK, 16-bit, palette, alpha). The output format follows the field: ``jpg``
    -> JPEG at ``quality``, ``png`` -> PNG (lossless, alpha kept), ``webp`` -> WebP at
    ``quality``; other image types and animations are kept as they are. EXIF orientation
    is applied to the pixels and dropped; the ICC profile is kept when the colour space
    is. Output is deterministic for a given Pillow build.

    Raises:
        One of :func:`decode_errors` when the image cannot be decoded; the caller turns
        it into a ``BadFileError``.
    """
    from PIL import Image

    target = _TARGETS.get(field.rpartition(".")[2])
    if target is None:
        return data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = _open(data)
        if getattr(img, "is_animated", False):
            return data
        orientation = img.getexif().get(_ORIENTATION, 1)
        w, h = img.size
        scale = min(1.0, max_side / max(w, h))
        odd_mode = target == "JPEG" and img.mode not in ("RGB", "L")
        if scale >= 1.0 and orientation in (0, 1) and img.format == target and not odd_mode:
            return data
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        if img.format == "JPEG" and scale < 1.0:
            img.draft(img.mode, size)  # DCT-scaled decode to >= size: fast, then resize exactly
        icc = img.info.get("icc_profile")
        decoded_mode = img.mode
        img.load()
        if orientation in (5, 6, 7, 8):
            size = (size[1], size[0])
        from PIL import ImageOps

        img = ImageOps.exif_transpose(img)
        img = _to_mode(img, target)
        if img.size != size:
            img = img.resize(size, Image.LANCZOS)
        out = io.BytesIO()
        kwargs: dict[str, Any] = {}
        if icc and _same_space(decoded_mode, img.mode):
            kwargs["icc_profile"] = icc
        if target == "JPEG":
            img.save(out, "JPEG", quality=quality, optimize=False, progressive=False, **kwargs)
        elif target == "WEBP":
            img.save(out, "WEBP", quality=quality, method=4, exif=b"", **kwargs)
        else:
            img.save(out, "PNG", optimize=False, **kwargs)
        return out.getvalue()


def _same_space(before: str, after: str) -> bool:
    gray = ("L", "LA", "1", "I", "I;16", "F")
    return (before in gray) == (after in gray) and before != "CMYK" and after != "CMYK"


def _to_mode(img: Any, target: str) -> Any:
    """Convert a decoded image to a mode ``target`` stores well (see :func:`reencode`)."""
    mode = img.mode
    if mode.startswith("I") or mode == "F":
        img = _to_8bit(img)
        mode = img.mode
    if mode == "1":
        img, mode = img.convert("L"), "L"
    if mode == "CMYK" or mode in ("YCbCr", "LAB", "HSV"):
        img, mode = img.convert("RGB"), "RGB"
    has_alpha = mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info
    if target == "PNG":
        if mode in ("P", "L", "RGB", "RGBA", "LA"):
            return img
        return img.convert("RGBA" if has_alpha else "RGB")
    if target == "WEBP":
        if mode in ("RGB", "RGBA"):
            return img
        return img.convert("RGBA" if has_alpha else "RGB")
    # JPEG: no alpha; composite transparent areas on white rather than exposing the
    # arbitrary colours hidden under alpha = 0.
    if not has_alpha:
        return img if mode in ("RGB", "L") else img.convert("RGB")
    gray = mode in ("L", "LA", "La")
    rgba = img.convert("LA" if gray else "RGBA")
    from PIL import Image

    background = Image.new("L" if gray else "RGB", rgba.size, 255 if gray else (255, 255, 255))
    background.paste(rgba.convert("L" if gray else "RGB"), mask=rgba.getchannel("A"))
    return background


def _to_8bit(img: Any) -> Any:
    """16-bit / 32-bit integer or float grey images -> 8-bit ``L`` (scaled, not clipped)."""
    from PIL import Image

    arr = np.asarray(img)
    if arr.dtype.kind == "f":
        out = np.clip(arr, 0, 255)
    else:
        arr = arr.astype(np.int64)
        out = arr >> 8 if arr.max(initial=0) > 255 else arr
        out = np.clip(out, 0, 255)
    return Image.fromarray(out.astype(np.uint8), mode="L")
