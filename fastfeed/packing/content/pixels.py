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

Example:
    >>> parse_store("mixed:0.25"), parse_store("raw"), parse_store(None)
    (('mixed', 0.25), ('raw', 1.0), ('jpeg', 0.0))
    >>> choose_raw([400, 100, None, 100, 900], ["e", "d", "c", "b", "a"], 0.5)
    [False, True, False, True, False]
"""

from __future__ import annotations

import io
import logging
import math
import os
from typing import Any, NamedTuple, Sequence

import numpy as np

from fastfeed.decode.raw import fit_size, raw_bytes
from fastfeed.errors import ConfigError
from fastfeed.packing.sources.base import Member, SampleSpec, image_member
from fastfeed.packing.sources.reader import read_source
from fastfeed.storage.remote import is_url

__all__ = ["STORES", "Pixels", "choose_raw", "parse_store", "plan_raw", "store_name"]

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
