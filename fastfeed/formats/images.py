"""Image facts used by ``pack`` and ``verify``: format sniffing, re-encoding, decode checks.

Which fields are images is :data:`fastfeed.formats.naming.IMAGE_EXTENSIONS`.

- :func:`sniff` names an image format from its first bytes (no decoding), and
  :func:`looks_like_image` is how ``pack`` catches files that carry an image extension
  but are not images;
- :func:`reencode` implements ``pack --max-side/--quality``: EXIF orientation applied,
  CMYK / 16-bit / palette / alpha images converted properly, resized so the longer side
  is at most ``max_side``, and encoded in the format the field's extension names;
- :func:`decode_error` fully decodes an image and returns what went wrong, for ``verify``;
- :func:`jpeg_damage` says whether libjpeg finds a JPEG's data damaged, for ``pack``.

A JPEG is damaged when libjpeg warns of corrupt data ("Corrupt JPEG data: ...", "Premature
end of JPEG file"), not only when it fails: Pillow decodes such a file without a word (the
missing part grey), also one cut short that still ends in an end-of-image marker. Both
:func:`decode_error` and :func:`jpeg_damage` decode JPEGs with libjpeg-turbo's strict mode
(simplejpeg, at 1/8 scale: every entropy-coded block is still read) to hear the warnings.

Example:
    >>> sniff(b"\\x89PNG\\r\\n\\x1a\\n...."), sniff(b"hello"), looks_like_image(b"hello", "jpg")
    ('png', None, False)
"""

from __future__ import annotations

import io
import struct
import warnings
from typing import Any

import numpy as np

from fastfeed.formats.naming import last_ext

__all__ = [
    "corrupt_jpeg_message",
    "decode_error",
    "decode_errors",
    "jpeg_damage",
    "jpeg_truncated",
    "looks_like_image",
    "reencode",
    "sniff",
]

#: field extension -> Pillow format written by :func:`reencode`; other images are kept.
_TARGETS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
#: Image extensions whose files start with no magic number.
_NO_MAGIC = frozenset({"tga"})
_ORIENTATION = 0x0112


def sniff(data: bytes) -> str | None:
    """Name the image format of ``data`` from its magic bytes, or None.

    Returns one of ``jpeg png gif bmp dib webp tiff pnm isobmff`` (AVIF/HEIF) ``ico jp2
    j2k psd sgi pcx``; TGA has no magic number (see :func:`looks_like_image`).
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
    return _sniff_rare(data)


def _sniff_rare(data: bytes) -> str | None:
    """The less common formats of :data:`~fastfeed.formats.naming.IMAGE_EXTENSIONS`."""
    if data[:4] == b"\x00\x00\x01\x00" and len(data) >= 6 and data[4:6] != b"\x00\x00":
        return "ico"
    if data[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n":
        return "jp2"
    if data[:4] == b"\xffO\xffQ":
        return "j2k"
    if data[:4] == b"8BPS":
        return "psd"
    if data[:2] == b"\x01\xda":
        return "sgi"
    if len(data) >= 3 and data[0] == 0x0A and data[1] in (0, 2, 3, 4, 5) and data[2] == 1:
        return "pcx"
    if data[:4] in (b"\x28\x00\x00\x00", b"\x0c\x00\x00\x00", b"\x6c\x00\x00\x00", b"\x7c\x00\x00\x00"):
        return "dib"  # a BMP without its file header: the info header's size first
    return None


def looks_like_image(data: bytes, field: str) -> bool:
    """False when ``data`` (its first 32 bytes suffice) is surely not an image.

    Formats without a magic number (TGA) are taken on trust; the others must sniff as some
    image format (not necessarily the one the extension names: re-encoding converts).
    """
    return sniff(data) is not None or last_ext(field) in _NO_MAGIC


def decode_errors() -> tuple[type[BaseException], ...]:
    """The exceptions Pillow raises on damaged or hostile image data."""
    from PIL import Image

    return (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError,
            Image.DecompressionBombError)


def _open(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data))


#: The texts of libjpeg's warnings that mean damaged data (jerror.h: JWRN_HIT_MARKER,
#: JWRN_EXTRANEOUS_DATA, JWRN_HUFF_BAD_CODE, JWRN_MUST_RESYNC, JWRN_JPEG_EOF, ...); its other
#: warnings (an unknown JFIF revision, an Adobe transform code) are harmless.
_CORRUPT = ("Corrupt JPEG data", "Premature end of JPEG file")


def corrupt_jpeg_message(text: str) -> bool:
    """True when ``text`` (a libjpeg message, maybe behind a prefix such as ``JPEG: ``) says the
    JPEG's data is damaged.

    Example:
        >>> corrupt_jpeg_message("JPEG: Corrupt JPEG data: premature end of data segment")
        True
        >>> corrupt_jpeg_message("Warning: unknown JFIF revision number 1.03")
        False
    """
    return any(marker in text for marker in _CORRUPT)


def _strict_jpeg(data: bytes | memoryview) -> tuple[bool, str | None]:
    """``(decided, damage)``: libjpeg-turbo's strict decode of a JPEG at 1/8 scale (every
    entropy-coded block read). Decided when it decodes cleanly (damage None) or warns of
    corrupt data (damage says what); undecided (an unsupported colour space, a header it
    rejects, no simplejpeg) leaves the verdict to Pillow."""
    try:
        import simplejpeg
    except ImportError:
        return False, None
    try:
        simplejpeg.decode_jpeg(data, colorspace="gray", fastdct=True, min_height=1, min_width=1, strict=True)
    except ValueError as e:
        if corrupt_jpeg_message(str(e)):
            return True, f"damaged JPEG data (libjpeg: {e})"
        return False, None
    return True, None


def jpeg_damage(data: bytes | memoryview) -> str | None:
    """Why libjpeg finds the JPEG ``data`` damaged (cut short, even when it still ends in an
    end-of-image marker; corrupt entropy-coded data), or None (also for what is not a JPEG).

    Costs a strict decode at 1/8 scale (~1.5 ms for a 500x375 JPEG on the 2-core development
    machine): ``pack`` calls it where no other step of its reads the whole JPEG.

    Example:
        >>> from PIL import Image
        >>> pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)
        >>> buf = io.BytesIO(); Image.fromarray(pixels).save(buf, "JPEG"); jpeg = buf.getvalue()
        >>> jpeg_damage(jpeg) is None
        True
        >>> jpeg_damage(jpeg[: len(jpeg) // 2] + b"\\xff\\xd9")
        'damaged JPEG data (libjpeg: Corrupt JPEG data: premature end of data segment)'
    """
    if bytes(data[:3]) != b"\xff\xd8\xff":
        return None
    return _strict_jpeg(data)[1]


def decode_error(data: bytes) -> str | None:
    """Fully decode ``data`` (first frame) and return the error text, or None when it decodes.

    JPEGs are decoded strictly (:func:`jpeg_damage`: libjpeg's corrupt-data warnings are
    damage), and by Pillow when libjpeg-turbo leaves the verdict open; other images by Pillow.
    JPEGs are decoded with DCT scaling, which still reads every entropy-coded block, so
    truncation and corruption are found at a fraction of the cost.
    """
    from PIL import Image

    if data[:3] == b"\xff\xd8\xff":
        decided, damage = _strict_jpeg(data)
        if decided:
            return damage

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


#: Bytes at the end of a JPEG searched for its EOI marker (padding and small trailers allowed).
_JPEG_TAIL = 4096


def jpeg_truncated(data: bytes) -> str | None:
    """Why the JPEG ``data`` is cut short, or None: its end must be the EOI marker ``FF D9``.

    Zero or whitespace padding after EOI is allowed. Costs a look at the last bytes; only a
    JPEG whose tail is not EOI (truncated, or with data appended after EOI, as motion photos
    have) is decoded (:func:`decode_error`) to tell the two apart.

    Example:
        >>> jpeg_truncated(b"\\xff\\xd8\\xff\\xe0" + b"x" * 10 + b"\\xff\\xd9\\0\\0") is None
        True
    """
    if data[:3] != b"\xff\xd8\xff":
        return None
    if data[-_JPEG_TAIL:].rstrip(b"\0 \t\r\n").endswith(b"\xff\xd9"):
        return None
    err = decode_error(data)
    if err is None:
        return None
    return f"truncated JPEG: no end-of-image marker (FF D9) at its end ({err})"


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
