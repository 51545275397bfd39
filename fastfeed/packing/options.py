"""``pack()``'s options: each defined once, checked once, when :class:`PackOptions` is built.

Every option is a field made by :func:`fastfeed._options.option`: its default (the one
``pack()``'s signature shows), its doc line, its check and its ``fastfeed pack`` flag come from
that one place. ``pack()``'s ``Args:`` lines (:func:`fastfeed._options.fill_doc`) and the
command's flags (:func:`fastfeed.cli.args.add_option_flags`) are written from it;
``tests/packing/test_pack_options.py`` checks that ``pack()``'s signature agrees.

The rules between options (``columns`` / ``key`` only for tables; ``tokenizer`` with
``tokenize`` or ``length``; ``store`` for images only; ``jpeg_restarts`` resolved against
``store``) live in :meth:`PackOptions._check_together`. ``shard_size`` and
``samples_per_shard`` exclude each other on the command line only (``exclusive``): the
library takes both (a table's shards keep within both bounds).

This module imports nothing that loads numpy at import time: ``fastfeed --help`` builds the
flags of ``pack`` from these definitions. A check imports its helpers when it runs.

Example:
    >>> o = PackOptions.create(shard_size="64MB", workers=2, store="mixed:0.50", jpeg_restarts=False)
    >>> o.shard_size, o.workers, o.store
    (64000000, 2, 'mixed:0.5')
    >>> PackOptions.create(samples_per_shard=0)
    Traceback (most recent call last):
    ...
    fastfeed.errors.ConfigError: samples_per_shard=0: must be an integer >= 1
"""

from __future__ import annotations

import logging
import numbers
import os
from typing import Any, Callable, Mapping

from fastfeed._options import as_bool, auto_or_int, group, option, parse_int, specs
from fastfeed._util import check_on_error, format_bytes, parse_size
from fastfeed.errors import ConfigError
from fastfeed.formats import FORMATS
from fastfeed.host import cpu_count
from fastfeed.packing.sources.base import INPUTS, TABLE_INPUTS, check_input, parse_length

__all__ = ["MAX_PIXELS", "MIN_SHARD_SIZE", "OPTIONS", "PackOptions", "RESTARTS_FIX"]

log = logging.getLogger("fastfeed.pack")

#: The largest ``seed`` (numpy's generators take any integer >= 0; this bounds a typo).
MAX_SEED = (1 << 64) - 1

#: Shard sizes below this are almost always a missing unit (``--shard-size 256``).
MIN_SHARD_SIZE = 1_000_000

#: The default of ``max_pixels``: Pillow's decompression-bomb limit (the default of
#: ``PIL.Image.MAX_IMAGE_PIXELS``), a 9459 x 9459 image, 268 MB of RGB pixels.
MAX_PIXELS = 89_478_485

#: How to get ``fastfeed._jpegroi`` built (for the messages of every engine): ``jpeglib.h`` is in
#: libjpeg62-turbo-dev (Debian) or libjpeg-turbo8-dev (Ubuntu), not libturbojpeg0-dev; fastfeed is
#: on no index, so the rebuild is from the clone (as fastfeed/decode/path.py's advice says).
RESTARTS_FIX = ("install a C compiler and libjpeg-turbo's headers (Debian: apt-get install gcc libjpeg62-turbo-dev; "
                "Ubuntu: apt-get install gcc libjpeg-turbo8-dev; libturbojpeg0-dev has no jpeglib.h), then "
                "reinstall from the fastfeed clone: pip install --no-deps --force-reinstall . "
                "(pip install --no-deps -e . for an editable install)")


# ---------------------------------------------------------------------- checks of single options
def _integral(value: Any) -> bool:
    """An integer, numpy's included, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(low: int | None = None, high: int | None = None, *, none: bool = False,
             hint: str = "") -> Callable[[Any, str], Any]:
    """A check: an integer (within ``[low, high]``), stored as an int; None kept when ``none``."""
    if low is None:
        rule = "an integer"
    else:
        rule = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def check(value: Any, name: str) -> int | None:
        if value is None and none:
            return None
        if _integral(value) and (low is None or value >= low) and (high is None or value <= high):
            return int(value)
        raise ConfigError(f"{name}={value!r}: must be {rule}{hint}")
    return check


def _shard_size(value: str | int, name: str) -> int:
    """``shard_size`` in bytes; a unit-less string below :data:`MIN_SHARD_SIZE` is refused
    (``256`` is 256 bytes: one sample per shard), an int below it is taken as bytes, logged."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and not -(2**62) < value < 2**62:
        raise ConfigError(f"{name}={value!r}: must be a size such as 256MB or 1GiB (a number: bytes)")
    size = parse_size(value, name)
    if size >= MIN_SHARD_SIZE:
        return size
    if isinstance(value, str):
        if not value.strip().isdigit():
            return size  # a unit written out: small on purpose
        raise ConfigError(f"{name}={value!r} has no unit, so it means {size} bytes (about one sample per "
                          f"shard); write {value.strip()}MB if you meant megabytes (a size below "
                          f"{format_bytes(MIN_SHARD_SIZE)} needs its unit, e.g. {value.strip()}KB)")
    log.warning("%s=%r: %s per shard is very small (one or a few samples per shard, one file open "
                "per sample when reading); the usual size is 256MB", name, value, format_bytes(size))
    return size


def _format(value: Any, name: str) -> str:
    if not isinstance(value, str) or value not in FORMATS:
        raise ConfigError(f"{name}={value!r}: choose one of {', '.join(sorted(FORMATS))}")
    return str(value)


def _workers(value: Any, name: str) -> int:
    if value in ("auto", 0, None):
        return cpu_count()
    if not _integral(value) or value < 1:
        raise ConfigError(f"{name}={value!r}: must be an integer >= 1 or 'auto'")
    return int(value)


def _length(value: Any, name: str) -> str | None:
    if value is not None:
        if not isinstance(value, str):
            raise ConfigError(f"{name}={value!r}: name the field that holds each sample's length, e.g. txt or "
                              "json:num_tokens")
        parse_length(value)
    return value


def _columns(value: str | Mapping[str, str] | None, name: str) -> str | None:
    """``columns`` as a canonical ``"col=field,..."`` string."""
    if value is None:
        return None
    from fastfeed.packing.sources.columns import parse_columns  # numpy: not at import (see the imports)

    mapping = parse_columns(value)  # type: ignore[arg-type]
    return ",".join(f"{c}={f}" if f else c for c, f in (mapping or {}).items())


def _key(value: Any, name: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name}={value!r}: name the column that holds each row's key (or leave it out: row "
                          "numbers)")
    return value


def _tokenizer(value: str | os.PathLike[str] | None, name: str) -> str | None:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name}={value!r}: give the path of a tokenizers JSON file, or of a folder holding "
                          "tokenizer.json")
    return None if value is None else os.fspath(value)


def _tokenize(value: Any, name: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name}={value!r}: name the text field to tokenize, e.g. txt")
    return value


def _restarts(value: Any, name: str) -> bool | None:
    return None if value is None else as_bool(value, name)


def _store(value: Any, name: str) -> str:
    """The canonical spelling (``mixed:0.50`` -> ``mixed:0.5``)."""
    from fastfeed.packing.content.pixels import parse_store, store_name  # numpy: not at import

    return store_name(*parse_store(value))


def _jpeg_restarts(asked: bool | None) -> bool:
    """``None`` (the default): restart markers when ``fastfeed._jpegroi`` is built, else
    none and one warning; ``True`` without the extension is an error."""
    from fastfeed.decode import roi  # numpy: not at import

    if asked is None:
        if roi.built():
            return True
        log.warning("pack: JPEGs stored as they are, without restart markers (fastfeed._jpegroi is not built); "
                    "random crops of these shards then decode the whole JPEG, about 1.6x the loader's CPU per "
                    "image; %s", RESTARTS_FIX)
        return False
    if asked and not roi.built():
        raise ConfigError(f"jpeg_restarts=True needs fastfeed's C extension fastfeed._jpegroi, which is not built "
                          f"here: {RESTARTS_FIX}; or pass jpeg_restarts=False (--no-jpeg-restarts)")
    return bool(asked)


# ---------------------------------------------------------------------- the options
@group(qualified=False)
class PackOptions:
    """``pack()``'s options, validated (``PackOptions(...)`` and ``PackOptions.create(...)`` check alike).

    Stored normalised (the types of the fields; ``pack()``'s signature shows what each accepts):
    ``shard_size`` in bytes, ``workers`` as a count, ``columns`` and ``store`` in their canonical
    spelling, ``jpeg_restarts`` resolved to True or False.
    """

    input: str | None = option(
        None, "how to read SRC: imagefolder, files (grouped by key), jsonl (a manifest), parquet (one sample per "
              "row), hf (a Dataset.save_to_disk folder) or webdataset (a folder of tars, converted member by "
              "member); 'auto' or None: detect it", check=lambda v, name: check_input(v), flag="--input",
        choices=("auto", *INPUTS), flag_default="auto")
    format: str = option("tar", "the shard format: tar (WebDataset, with DALI index files) or lmdb", check=_format,
                         flag="--format", choices=tuple(FORMATS))
    shard_size: int = option(
        "256MB", "target shard size, e.g. 256MB or 1GiB (a number: bytes), estimated from the source sizes; "
                 "samples_per_shard, when given, decides instead (a table's shards keep within both)", check=_shard_size,
        flag="--shard-size", metavar="SIZE", exclusive="shard size")
    samples_per_shard: int | None = option(None, "at most this many samples per shard, instead of shard_size",
                                           check=_integer(1, none=True), flag="--samples-per-shard", parse=parse_int,
                                           metavar="N", exclusive="shard size")
    workers: int = option(
        1, "processes writing shards in parallel; 'auto': one per usable core (a container's CPU quota "
           "honoured)", check=_workers, flag="--workers", parse=auto_or_int, metavar="N",
        flag_default="auto")
    shuffle: bool = option(True, "store samples in a seeded random order, so every shard mixes classes (parquet: "
                           "whole row groups, not rows); off: in key order", check=as_bool, flag="--shuffle",
                           switch="negatable")
    seed: int = option(0, "the shuffle seed", check=_integer(0, MAX_SEED), flag="--seed", parse=parse_int)
    max_side: int | None = option(
        None, "resize images whose longer side is larger than this many pixels, re-encoding them (EXIF "
              "orientation applied; the source files are never touched); with store raw, the pixels stored, "
              "resized with INTER_AREA",
        check=_integer(8, none=True, hint=" (pixels of the longer side)"), flag="--max-side", parse=parse_int,
        metavar="PX")
    quality: int = option(90, "JPEG/WebP quality of the images max_side re-encodes",
                          check=_integer(1, 100, hint=" (90 is a good default)"), flag="--quality", parse=parse_int,
                          metavar="Q")
    length: str | None = option(
        None, "record per-sample lengths (for length-bucketed samplers): a field holding a number (or a list: its "
              "size), a text field (its whitespace-separated token count; with tokenizer: its exact token count), "
              "or FIELD:KEY for a key inside a JSON field", check=_length, flag="--length", metavar="FIELD")
    columns: str | None = option(
        None, "parquet/hf input: the columns to pack and their fields, e.g. image=jpg,caption=txt (or a dict); "
              "None: every column, fields by type", check=_columns, flag="--columns", metavar="COL=FIELD,...")
    key: str | None = option(None, "parquet/hf input: the column holding each row's key; None: the row number",
                             check=_key, flag="--key", metavar="COLUMN")
    tokenizer: str | None = option(
        None, "a local tokenizers JSON file, or a folder holding tokenizer.json, with tokenize or length (exact "
              "token counts); its pad id is recorded in the index", check=_tokenizer, flag="--tokenizer",
        metavar="PATH")
    tokenize: str | None = option(
        None, "with tokenizer: store the token ids of this text field (a column for parquet/hf) in the field "
              "tokens.npy (uint16 when the vocabulary fits, else uint32) and their counts in lengths.npy",
        check=_tokenize, flag="--tokenize", metavar="FIELD")
    on_error: str = option(
        "raise", "a bad input: 'raise' stops with an error naming the file and the fix; 'skip' leaves it out, "
                 "listed in DST/skipped.txt and the index ('fail' is the old spelling of 'raise')",
        check=check_on_error, flag="--on-error", choices=("raise", "skip", "fail"), metavar="{raise,skip}")
    overwrite: bool = option(False, "replace fastfeed's files in a non-empty DST", check=as_bool,
                             flag="--overwrite", switch="on")
    jpeg_restarts: bool = option(
        None, "store JPEGs losslessly with a restart marker after every 16x16 block (the same DCT coefficients, "
              "so the same pixels; files usually no larger), so the CPU loader decodes only the blocks of each "
              "random crop, 1.5-2x less work per image; the stored bytes differ from the source files and pack "
              "takes longer. Needs fastfeed's C extension fastfeed._jpegroi; default: on when it is built, else off "
              "with one warning; off: the source bytes, unchanged",
        check=_restarts, flag="--jpeg-restarts", switch="negatable")
    store: str = option(
        "jpeg", "jpeg: images as they are; raw: each image decoded now and stored as uint8 pixels (the field "
                "rgb8, shapes in shapes.npy), so loading does no decode, for ~10x the disk of ImageNet-sized "
                "JPEGs (bound it with max_side); mixed:P: the share P of the images with the fewest pixels raw, "
                "the rest JPEG (e.g. mixed:0.5). Folders, manifests and WebDataset tars only",
        check=_store, flag="--store", metavar="{jpeg,raw,mixed:P}")
    max_pixels: int = option(
        MAX_PIXELS, "the most pixels (width x height) an image may have, read from its header before anything "
                    "decodes it, in every format and store mode: what pack decodes (a JPEG resized by max_side is "
                    "decoded DCT-scaled, at 1/2 to 1/8 of its sides) and what it stores for the loader to decode; "
                    "a larger image is an error naming it, or a skip (default: Pillow's decompression-bomb limit)",
        check=_integer(1, hint=" (pixels, width x height)"), flag="--max-pixels", parse=parse_int, metavar="N")
    allow_outside: bool = option(
        False, "pack files that resolve outside SRC: symlinks whose target lies outside the folder, absolute or "
               "../ paths of a JSONL manifest (SRC: the manifest's folder); they are counted in the pack summary "
               "and the index (outside: the count and their folders). Off: each is an error naming it, or a skip",
        check=as_bool, flag="--allow-outside", switch="on")

    def _check_together(self) -> dict[str, Any]:
        """The rules between options; resolves ``jpeg_restarts``."""
        from fastfeed.packing.content.tokens import check_token_options  # numpy: not at import

        table = self.columns is not None or self.key is not None
        if table and self.input is not None and self.input not in TABLE_INPUTS:
            raise ConfigError(f"columns/key (--columns, --key) are for parquet and HF datasets input, not "
                              f"input={self.input!r}; leave them out")
        check_token_options(self.tokenizer, self.tokenize, self.length)
        mode = self.store_mode[0]
        if mode != "jpeg" and (table or self.tokenize is not None):
            raise ConfigError(f"store={self.store!r} is for image folders, manifests and WebDataset tars; "
                              "parquet/HF input (--columns/--key, --tokenize) stores its images encoded: drop --store")
        # --store raw stores no JPEG (but a sample's other image fields): restart markers only when asked
        asked = self.jpeg_restarts
        return {"jpeg_restarts": _jpeg_restarts(asked) if mode != "raw" or asked else False}

    @classmethod
    def create(cls, **options: Any) -> PackOptions:
        """Check every option once, at the boundary (the same as ``PackOptions(**options)``).

        Raises:
            ConfigError: an invalid option or combination, naming it and the fix.

        Example:
            >>> PackOptions.create(quality=101)
            Traceback (most recent call last):
            ...
            fastfeed.errors.ConfigError: quality=101: must be an integer from 1 to 100 (90 is a good default)
        """
        return cls(**options)

    @property
    def store_mode(self) -> tuple[str, float]:
        """(``jpeg``/``raw``/``mixed``, share of images stored raw)."""
        from fastfeed.packing.content.pixels import parse_store  # numpy: not at import

        return parse_store(self.store)

    def output_options(self) -> dict[str, Any]:
        """The options that shape the output (not ``workers`` or ``overwrite``)."""
        return {
            "format": self.format, "shard_size": self.shard_size,
            "samples_per_shard": self.samples_per_shard, "shuffle": self.shuffle,
            "seed": self.seed, "max_side": self.max_side, "quality": self.quality,
            "length": self.length, "on_error": self.on_error,
            **({"jpeg_restarts": True} if self.jpeg_restarts else {}),
            **({"store": self.store} if self.store != "jpeg" else {}),
            **({"max_pixels": self.max_pixels} if self.max_pixels != MAX_PIXELS else {}),
            **({"allow_outside": True} if self.allow_outside else {}),
            **{k: v for k, v in (("columns", self.columns), ("key", self.key), ("tokenize", self.tokenize))
               if v is not None},
        }


#: ``pack()``'s options, in the order of its signature (the fields of :class:`PackOptions`).
OPTIONS: tuple[str, ...] = tuple(f.name for f, _ in specs(PackOptions))
