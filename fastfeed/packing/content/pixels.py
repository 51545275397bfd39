"""``pack --store``: keep images as the JPEGs they are, or store their pixels (trade disk for CPU).

``store`` is one of:

- ``jpeg`` (the default): image files are stored encoded, as they always were;
- ``raw``: the image of each sample (the field the loader decodes as ``"image"``,
  :func:`~fastfeed.formats.naming.pick_image_field`) is decoded at pack time
  (:func:`fastfeed.decode.raw.to_pixels`: EXIF orientation applied, every mode to 8-bit RGB,
  ``max_side`` applied with ``INTER_AREA``) and stored in the field ``rgb8`` as uint8 HWC bytes,
  in place of its encoded field; its (height, width) goes to ``shapes.npy``. Loading then costs
  a read, a crop and a resize: no decode. Other image fields of a sample (masks) stay encoded.
- ``mixed:P`` (``0 < P < 1``): a share ``P`` of the images is stored raw, the rest as JPEG,
  chosen by size, as FFCV's ``smart`` mode chooses (its ``proportion`` mode draws at random):
  **the ``round(P x M)`` images with the fewest stored pixels** (after ``max_side``) are stored
  raw, where ``M`` is the number of planned samples that hold an image (``round`` halves up);
  ties go to the smaller key. Small images gain the most from raw storage: they cost the JPEG
  decoder its whole per-image overhead and DCT scaling cannot shrink them, and they take the
  least disk. The sizes come from the image headers, read while planning; an image whose
  header cannot be read stays JPEG (and is not counted among the candidates for raw), and a
  sample skipped while writing (``on_error="skip"``) is simply not there.

The choice is part of the plan (:attr:`fastfeed.packing.plan.ShardPlan.raw`), so every engine
writes the same shards and a resumed pack continues the same job.

**The pixel limit** (``pack(max_pixels=)``, ``--max-pixels``; default
:data:`~fastfeed.packing.options.MAX_PIXELS`, Pillow's decompression-bomb limit) is one rule for
every image format and every store mode, checked from the image's header before anything decodes it
(:func:`pixel_problem`): the pixels pack holds for an image, :func:`held_pixels`, are what it decodes
(a raw image is decoded whole; a JPEG that ``max_side`` resizes is decoded DCT-scaled, by 2, 4 or 8;
other formats whole) or, for an image stored as it is, what the loader will decode. Pillow's own
check is lifted (:func:`pillow_admits`) while pack decodes an image the limit admitted, so a raised
``max_pixels`` is the one limit.

Example:
    >>> parse_store("mixed:0.25"), parse_store("raw"), parse_store(None)
    (('mixed', 0.25), ('raw', 1.0), ('jpeg', 0.0))
    >>> choose_raw([400, 100, None, 100, 900], ["e", "d", "c", "b", "a"], 0.5)
    [False, True, False, True, False]
    >>> held_pixels(20000, 20000, jpeg=True, field="jpg", raw=False, max_side=4096)   # decoded at 1/4
    25000000
    >>> held_pixels(20000, 20000, jpeg=True, field="jpg", raw=True, max_side=4096)    # decoded whole
    400000000
"""

from __future__ import annotations

import io
import logging
import math
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from fastfeed._util import format_bytes
from fastfeed.decode.imagesize import image_size
from fastfeed.decode.raw import fit_size, raw_bytes
from fastfeed.errors import ConfigError
from fastfeed.formats.images import sniff
from fastfeed.formats.naming import last_ext
from fastfeed.packing.sources.base import Member, SampleSpec, image_member
from fastfeed.packing.sources.reader import read_source
from fastfeed.storage.remote import is_url

__all__ = ["STORES", "Pixels", "choose_raw", "header_size", "held_pixels", "parse_store", "pillow_admits",
           "pixel_problem", "plan_raw", "store_name"]

log = logging.getLogger("fastfeed.pack")

STORES = ("jpeg", "raw", "mixed:P")


class Pixels(NamedTuple):
    """An image decoded for ``--store raw`` on its way from the reader to the shard writer."""

    array: np.ndarray  #: uint8 (h, w, 3), C-contiguous
    encoded: int  #: bytes of the image file it was decoded from (what ``--store jpeg`` would store)


def parse_store(value: str | None) -> tuple[str, float]:
    """``jpeg`` / ``raw`` / ``mixed:P`` -> (mode, share of images stored raw).

    Raises:
        ConfigError: anything else, or a share outside (0, 1).
    """
    if value is None or value == "jpeg":
        return "jpeg", 0.0
    if value == "raw":
        return "raw", 1.0
    text = str(value)
    if text.startswith("mixed:"):
        try:
            share = float(text[len("mixed:"):])
        except ValueError:
            share = math.nan
        if 0 < share < 1:
            return "mixed", share
        raise ConfigError(f"store={value!r}: the share P of mixed:P must be a number between 0 and 1 "
                          "(e.g. mixed:0.5 keeps the smaller half of the images as pixels); use raw for all")
    raise ConfigError(f"store={value!r}: choose jpeg (images as they are, the default), raw (pixels: no decode "
                      "when loading, ~10x the disk) or mixed:P (the share P of smallest images as pixels, e.g. "
                      "mixed:0.5)")


def store_name(mode: str, share: float) -> str:
    """The canonical spelling of a store (``mixed:0.5``).

    Example:
        >>> store_name("mixed", 0.50), store_name("raw", 1.0)
        ('mixed:0.5', 'raw')
    """
    return f"mixed:{share:g}" if mode == "mixed" else mode


# ---------------------------------------------------------------- the pixel limit
#: Field extensions whose images ``max_side`` re-encodes (the others are stored as they are).
_REENCODED = frozenset({"jpg", "png", "webp"})


def header_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) of an encoded image from its header (:func:`fastfeed.decode.imagesize.image_size`),
    whatever its size: Pillow's decompression-bomb warning and refusal do not apply to a header
    read; None when the header cannot be read.

    Example:
        >>> header_size(b"\\xff\\xd8\\xff\\xc0\\x00\\x11\\x08\\x4e\\x20\\x4e\\x20\\x03" + bytes(9))
        (20000, 20000)
    """
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        hw = image_size(data)
    if hw is None and sniff(data[:32]) not in (None, "jpeg", "png"):  # Pillow refused a header: how large?
        with pillow_admits(sys.maxsize):
            hw = image_size(data)
    return hw


def held_pixels(height: int, width: int, *, jpeg: bool, field: str, raw: bool, max_side: int | None) -> int:
    """The most pixels pack and the loader hold at once for an image of that size (see the module doc).

    Args:
        height, width: from the image's header.
        jpeg: the bytes are a JPEG (decoded DCT-scaled when ``max_side`` resizes it).
        field: the member's field (``max_side`` re-encodes ``jpg``, ``png`` and ``webp`` fields only).
        raw: stored as pixels (decoded whole, then resized to ``max_side``).
        max_side: ``pack --max-side``.

    Example:
        >>> held_pixels(375, 500, jpeg=True, field="jpg", raw=False, max_side=None)
        187500
    """
    whole = height * width
    if raw or max_side is None or max(height, width) <= max_side or last_ext(field) not in _REENCODED:
        return whole  # decoded whole: now (raw), or by the loader (stored as it is)
    th, tw = fit_size(height, width, max_side)
    if not jpeg:
        return whole  # PNG, WebP: decoded whole, then resized
    ratio = min(height // th, width // tw)  # as Pillow's draft() picks the DCT scale
    scale = next(d for d in (8, 4, 2, 1) if ratio >= d)
    return max(-(-height // scale) * -(-width // scale), th * tw)


def pixel_problem(size: tuple[int, int], *, jpeg: bool, field: str, raw: bool, max_side: int | None,
                  limit: int) -> tuple[str, str] | None:
    """``(reason, fix)`` when an image of ``size`` (height, width, from its :func:`header_size`) is
    over the pixel ``limit`` as pack would hold it (:func:`held_pixels`), else None.

    Example:
        >>> pixel_problem((20000, 20000), jpeg=True, field="jpg", raw=False, max_side=None, limit=89_478_485)[0]
        '20000 x 20000 image (400.0 megapixels) is over the pixel limit of 89,478,485 (max_pixels)'
        >>> pixel_problem((20000, 20000), jpeg=True, field="jpg", raw=False, max_side=5000, limit=89_478_485)
    """
    h, w = size
    held = held_pixels(h, w, jpeg=jpeg, field=field, raw=raw, max_side=max_side)
    if held <= limit:
        return None
    what = f"{w} x {h} image ({_count(h * w)})"
    if held != h * w:
        what += f", decoded for --max-side {max_side} at {_count(held)},"
    reason = f"{what} is over the pixel limit of {limit:,} (max_pixels)"
    fixes = []
    side = _fitting_side(h, w, limit) if jpeg and last_ext(field) in _REENCODED else None
    if side is not None:
        fixes.append(f"pass {'--store jpeg ' if raw else ''}--max-side {side} to store it smaller (a JPEG is then "
                     "decoded at 1/2 to 1/8 scale)")
    fixes += [f"pass --max-pixels {held} to allow it (decoding it then takes ~{format_bytes(3 * held)} of memory)",
              "shrink the file first", "pass --on-error skip"]
    return reason, ", ".join(fixes[:-1]) + ", or " + fixes[-1]


def _count(pixels: int) -> str:
    """``400.0 megapixels``, or ``40,000 pixels`` below a million."""
    return f"{pixels / 1e6:.1f} megapixels" if pixels >= 1_000_000 else f"{pixels:,} pixels"


def _fitting_side(height: int, width: int, limit: int) -> int | None:
    """The largest ``max_side`` (of the longer side halved, quartered or divided by 8) that brings a
    JPEG of that size within ``limit``, or None."""
    for d in (2, 4, 8):
        side = max(height, width) // d
        if side >= 8 and held_pixels(height, width, jpeg=True, field="jpg", raw=False, max_side=side) <= limit:
            return side
    return None


class _Lift:
    """How many of this process's threads decode with Pillow's check lifted, and the limit to restore."""

    lock = threading.Lock()
    depth = 0
    saved: int | None = None


@contextmanager
def pillow_admits(pixels: int) -> Iterator[None]:
    """Lift Pillow's decompression-bomb check (``PIL.Image.MAX_IMAGE_PIXELS``) while pack decodes an
    image of ``pixels`` that ``max_pixels`` admitted and that Pillow would warn about or refuse.

    Nothing changes for an image within Pillow's limit (every image, with the default
    ``max_pixels``, unless ``max_side`` lets a larger JPEG be decoded DCT-scaled). Pack's reader
    threads share the lift: the limit is restored when the last of them is done. The limit is
    process-wide: for that time it is also off for any other thread of the process that uses
    Pillow (pack runs in-process only for small jobs).

    Example:
        >>> from PIL import Image
        >>> with pillow_admits(10**12):
        ...     Image.MAX_IMAGE_PIXELS is None
        True
        >>> Image.MAX_IMAGE_PIXELS is not None
        True
    """
    from PIL import Image

    with _Lift.lock:
        limit = _Lift.saved if _Lift.depth else Image.MAX_IMAGE_PIXELS
        lift = limit is not None and pixels > limit
        if lift:
            if _Lift.depth == 0:
                _Lift.saved = Image.MAX_IMAGE_PIXELS
                Image.MAX_IMAGE_PIXELS = None
            _Lift.depth += 1
    try:
        yield
    finally:
        if lift:
            with _Lift.lock:
                _Lift.depth -= 1
                if _Lift.depth == 0:
                    Image.MAX_IMAGE_PIXELS = _Lift.saved


# ---------------------------------------------------------------- raw pixels
def _header_size(root: str, m: Member) -> tuple[int, int] | None:
    """Upright (height, width) of the image member, from its header (not decoded); None if unreadable."""
    from PIL import Image

    path = os.path.join(root, m.path or "")
    try:
        if is_url(path):
            src: Any = io.BytesIO(read_source(path, m.size, m.offset))
        elif m.offset is not None:  # a member of a WebDataset tar
            with open(path, "rb") as f:
                f.seek(m.offset)
                src = io.BytesIO(f.read(m.size))
        else:
            src = path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the writer applies max_pixels
            with Image.open(src) as im:
                w, h = im.size
                orient = int(im.getexif().get(0x0112, 1) or 1)
    except Exception:  # noqa: BLE001 - Pillow raises many kinds on damaged headers; the writer reports it
        return None
    return (w, h) if orient in (5, 6, 7, 8) else (h, w)


def choose_raw(pixels: Sequence[int | None], keys: Sequence[str], share: float) -> list[bool]:
    """Which samples ``mixed:share`` stores raw: the ``round(share x M)`` with the fewest ``pixels``
    (``M``: the samples with an image, ``None`` meaning none; ties to the smaller key); see the module doc."""
    have = [i for i, p in enumerate(pixels) if p is not None]
    k = int(math.floor(share * len(have) + 0.5))
    order = sorted((i for i in have if pixels[i] >= 0), key=lambda i: (pixels[i], keys[i]))  # type: ignore[operator]
    out = [False] * len(pixels)
    for i in order[:k]:
        out[i] = True
    return out


def plan_raw(root: str, samples: Sequence[SampleSpec], mode: str, share: float,
             max_side: int | None) -> tuple[list[bool], list[int]]:
    """Per sample: stored raw?, and its estimated bytes of pixels (0 when stored encoded).

    Reads every image header once (``raw`` too: shards are cut by the size of the pixels,
    about ten times the JPEGs').
    """
    shapes: list[tuple[int, int] | None] = []
    pixels: list[int | None] = []  # None: no image; -1: header unreadable
    for spec in samples:
        m = image_member(spec)
        hw = _header_size(root, m) if m is not None else None
        hw = None if hw is None else fit_size(hw[0], hw[1], max_side)
        shapes.append(hw)
        pixels.append(None if m is None else -1 if hw is None else hw[0] * hw[1])
    if mode == "raw":
        flags = [p is not None for p in pixels]
    else:
        flags = choose_raw(pixels, [s.key for s in samples], share)
    est = [raw_bytes(*hw) if f and hw is not None else 0 for f, hw in zip(flags, shapes)]
    unknown = sum(1 for p in pixels if p == -1)
    if unknown:
        log.info("pack --store %s: %d image header(s) unreadable while planning (stored as they are%s)",
                 store_name(mode, share), unknown, "" if mode == "mixed" else " unless they decode")
    return flags, est


def share_of(flags: Sequence[bool]) -> float:
    """The share of samples stored raw."""
    return float(np.mean(flags)) if len(flags) else 0.0


def summary(mode: str, share: float, results: Sequence[Any]) -> dict[str, Any]:
    """The ``"store"`` entry of ``index.json`` from the shard results."""
    return {
        "mode": mode, "share": share, "field": "rgb8",
        "raw_samples": int(sum(sum(1 for hw in r.shapes if hw[0]) for r in results)),
        "raw_bytes": int(sum(r.raw_bytes for r in results)),
        "encoded_bytes": int(sum(r.encoded_bytes for r in results)),
    }
