"""Reading a planned shard for :mod:`fastfeed.packing.write`: the source reads, images are checked here.

:func:`shard_items` asks the plan's source (:meth:`~fastfeed.packing.sources.base.Source.read`)
for the samples of one shard, with what the options ask of their images: every image is
checked and re-encoded for ``max_side`` / ``jpeg_restarts`` by :func:`check_image`; an image
stored as pixels (``--store raw``) is decoded by :func:`raw_image` instead. Both first hold the
image's header against the pixel limit (``max_pixels``, :func:`~fastfeed.packing.content.pixels.pixel_problem`),
before anything decodes it. A bad image is a :class:`~fastfeed.packing.sources.base.Problem` that the
source raises or records (``on_error``).

Example:
    >>> items = list(shard_items(plan, plan.shards[0], skipped=[]))   # doctest: +SKIP
    >>> items[0].key, sorted(items[0].fields)                         # doctest: +SKIP
    ('cat/0001', ['cls', 'jpg'])
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterator

from fastfeed.decode import roi
from fastfeed.decode.raw import to_pixels
from fastfeed.errors import BadFileError, SampleError
from fastfeed.formats.images import (
    corrupt_jpeg_message,
    decode_errors,
    jpeg_damage,
    jpeg_truncated,
    looks_like_image,
    reencode,
)
from fastfeed.packing.content.pixels import Pixels, header_size, pillow_admits, pixel_problem
from fastfeed.packing.options import PackOptions
from fastfeed.packing.plan import PackPlan, ShardPlan
from fastfeed.packing.sources.base import Item, Member, Problem, Reading

__all__ = ["check_image", "raw_image", "shard_items"]


def shard_items(plan: PackPlan, shard: ShardPlan, skipped: list[dict[str, str]]) -> Iterator[Item]:
    """The samples of ``shard`` in file order, read by ``plan.source`` (bad ones raised or appended to ``skipped``)."""
    opts = plan.options
    reading = Reading(on_error=opts.on_error, skipped=skipped,
                      length=opts.length if plan.tokens is None else None,  # a tokenizer counts them later
                      image=partial(_image, opts), reencodes=opts.max_side is not None or opts.jpeg_restarts)
    return plan.source.read(shard.units, shard.raw, reading)


def _image(opts: PackOptions, m: Member, data: bytes, pixels: bool) -> Any:
    return raw_image(opts, m, data) if pixels else check_image(opts, m, data)


#: What to do about a damaged image file.
_REFETCH = "copy or download the file again, remove it, or pass --on-error skip"


def _within_limit(opts: PackOptions, m: Member, data: bytes, raw: bool) -> int:
    """Check an image file against the pixel limit from its header (nothing decoded); returns its
    pixels (0: the header is unreadable, and decoding it will say what is wrong).

    Raises:
        Problem: not an image, or over ``max_pixels``.
    """
    if not looks_like_image(data[:32], m.field):
        raise Problem(BadFileError, m.path or "", f"has an image extension but is not an image "
                       f"(starts with {data[:8]!r})", "fix or remove the file, or pass --on-error skip")
    hw = header_size(data)
    if hw is None:
        return 0
    found = pixel_problem(hw, jpeg=data[:3] == b"\xff\xd8\xff", field=m.field, raw=raw, max_side=opts.max_side,
                          limit=opts.max_pixels)
    if found is not None:
        raise Problem(BadFileError, m.path or "", *found)
    return hw[0] * hw[1]


def check_image(opts: PackOptions, m: Member, data: bytes) -> bytes:
    """An image member's bytes as stored: checked (an image within the pixel limit, not truncated,
    no JPEG data libjpeg finds corrupt), re-encoded for ``max_side``, with restart markers for
    ``jpeg_restarts``.

    A JPEG is decoded once to check it: by the lossless re-coding of ``jpeg_restarts`` when it
    runs (it reads every block), else strictly at 1/8 scale (:func:`jpeg_damage`, ~1.5 ms).

    Raises:
        Problem: not an image, over ``max_pixels``, an image that does not decode, a truncated or
            corrupt JPEG.
    """
    with pillow_admits(_within_limit(opts, m, data, raw=False)):
        return _checked(opts, m, data)


def _checked(opts: PackOptions, m: Member, data: bytes) -> bytes:
    """:func:`check_image` once the image is within the limit."""
    restarts = opts.jpeg_restarts and data[:3] == b"\xff\xd8\xff"
    if opts.max_side is not None or not restarts:  # (re-encoding decodes leniently: check the source)
        if (why := jpeg_damage(data)) is not None:
            raise Problem(BadFileError, m.path or "", why, _REFETCH)
    if opts.max_side is not None:
        try:
            data = reencode(data, m.field, opts.max_side, opts.quality)
        except decode_errors() as e:
            raise Problem(BadFileError, m.path or "", f"cannot decode image for --max-side "
                           f"({type(e).__name__}: {e})", "fix or remove the file, or pass --on-error skip") from None
    if (why := jpeg_truncated(data)) is not None:  # the loader would fail on it hours into training
        raise Problem(BadFileError, m.path or "", why, _REFETCH)
    if opts.jpeg_restarts and data[:3] == b"\xff\xd8\xff":
        data = _with_restarts(data, m)
    return data


def raw_image(opts: PackOptions, m: Member, data: bytes) -> Pixels:
    """An image file decoded for ``--store raw`` (:func:`fastfeed.decode.raw.to_pixels`, ``max_side`` applied).

    Raises:
        Problem: not an image, over ``max_pixels`` (it is decoded whole), a truncated JPEG, or an
            image that does not decode.
    """
    pixels = _within_limit(opts, m, data, raw=True)
    if (why := jpeg_truncated(data) or jpeg_damage(data)) is not None:
        raise Problem(BadFileError, m.path or "", why, _REFETCH)
    try:
        with pillow_admits(pixels):
            arr = to_pixels(data, opts.max_side)
    except SampleError as e:
        raise Problem(BadFileError, m.path or "", f"{e} for --store {opts.store}",
                      "fix or remove the file, or pass --on-error skip") from None
    return Pixels(arr, len(data))


def _with_restarts(data: bytes, m: Member) -> bytes:
    """The JPEG with a restart marker after every MCU, losslessly (same DCT coefficients,
    re-optimised Huffman tables), so the loader decodes a crop's MCUs only; a JPEG libjpeg
    cannot transcode (CMYK, a harmless warning) is stored as it was, one whose data libjpeg
    finds corrupt is a Problem.

    Raises:
        Problem: libjpeg warns of corrupt data (a JPEG cut short, even one that still ends in
            an end-of-image marker; damaged entropy-coded data).
    """
    head = roi.header(data)
    if head is None or not head[2]:  # unreadable header, CMYK/YCCK: stored as it was, once checked
        if (why := jpeg_damage(data)) is not None:
            raise Problem(BadFileError, m.path or "", why, _REFETCH)
        return data
    try:
        return roi.add_restarts(data)
    except ValueError as e:
        if corrupt_jpeg_message(str(e)):
            why = f"damaged JPEG data (libjpeg: {str(e).removeprefix('JPEG: ')})"
            raise Problem(BadFileError, m.path or "", why, _REFETCH) from None
        return data
