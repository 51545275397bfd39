"""Step 1 of packing: :func:`plan_pack` decides everything before any shard is written.

``plan_pack`` checks the options, opens the source
(:func:`~fastfeed.packing.sources.detect.open_source`: detect, list and validate it) and plans it
(:func:`plan_source`): orders its units (key order, or a seeded permutation with ``shuffle``),
cuts them into shards (samples dealt out evenly, counts within one of each other; blocks of
rows kept whole, consecutive ones up to the limits), checks the destination, and returns a
frozen, picklable :class:`PackPlan`. Steps 2 and 3 (:func:`fastfeed.packing.write.write_shard`,
:func:`fastfeed.packing.finish.finalize`) only execute it, so any engine (the local process pool,
Ray) that runs ``write_shard`` for every shard number produces the same bytes.

The only side effects are on DST: it is created, ``overwrite=True`` removes fastfeed's
own files from it (shards, sidecars, index, resume records; nothing else), and the
resume identity of the job is recorded in ``DST/.fastfeed-pack/job.json``.

Example:
    >>> plan = plan_pack("imagenet/train", "/data/in-ff", samples_per_shard=1000)  # doctest: +SKIP
    >>> len(plan.shards), plan.shards[0].name, plan.shards[0].rows                # doctest: +SKIP
    (1282, 'shard-000000.tar', 1000)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fastfeed import __version__
from fastfeed._util import check_on_error, format_bytes, parse_size
from fastfeed.decode import roi
from fastfeed.errors import ConfigError
from fastfeed.formats import FORMATS
from fastfeed.host import cpu_count
from fastfeed.packed.layout import dali_index_name, shard_name
from fastfeed.packing.content.pixels import parse_store, plan_raw, store_name
from fastfeed.packing.content.tokenize import Tokenizer, load_tokenizer
from fastfeed.packing.content.tokens import TokenPlan, check_length_field, check_token_options, token_plan
from fastfeed.packing.dest import check_destination, check_not_inside, prepare_destination
from fastfeed.packing.sources.base import TABLE_INPUTS, Source, check_input, image_member, parse_length
from fastfeed.packing.sources.columns import parse_columns
from fastfeed.packing.sources.detect import open_source
from fastfeed.storage.remote import is_url

__all__ = ["PackOptions", "PackPlan", "ShardPlan", "group_units", "plan_pack", "plan_source", "shard_counts"]

log = logging.getLogger("fastfeed.pack")


@dataclass(frozen=True)
class PackOptions:
    """Validated ``pack`` options (see :func:`fastfeed.packing.api.pack` for their meaning)."""

    input: str | None = None
    format: str = "tar"
    shard_size: int = 256_000_000
    samples_per_shard: int | None = None
    workers: int = 1
    shuffle: bool = True
    seed: int = 0
    max_side: int | None = None
    quality: int = 90
    length: str | None = None
    columns: str | None = None
    key: str | None = None
    tokenizer: str | None = None
    tokenize: str | None = None
    on_error: str = "raise"
    overwrite: bool = False
    jpeg_restarts: bool = False  # create() resolves the default (on when fastfeed._jpegroi is built)
    #: ``jpeg``, ``raw`` or ``mixed:P`` (canonical spelling; see :mod:`fastfeed.packing.content.pixels`)
    store: str = "jpeg"

    @property
    def store_mode(self) -> tuple[str, float]:
        """(``jpeg``/``raw``/``mixed``, share of images stored raw)."""
        return parse_store(self.store)

    @classmethod
    def create(cls, *, input: str | None = None, format: str = "tar",
               shard_size: str | int = "256MB", samples_per_shard: int | None = None,
               workers: int | str = 1, shuffle: bool = True, seed: int = 0,
               columns: str | Mapping[str, str] | None = None, key: str | None = None,
               tokenizer: str | os.PathLike[str] | None = None, tokenize: str | None = None,
               max_side: int | None = None, quality: int = 90, length: str | None = None,
               on_error: str = "raise", overwrite: bool = False, jpeg_restarts: bool | None = None,
               store: str = "jpeg") -> "PackOptions":
        """Check every option once, at the boundary; raises ConfigError naming the fix."""
        input = check_input(input)
        if format not in FORMATS:
            raise ConfigError(f"format={format!r}: choose one of {', '.join(sorted(FORMATS))}")
        size = _shard_size(shard_size)
        if samples_per_shard is not None and (not _is_int(samples_per_shard) or samples_per_shard < 1):
            raise ConfigError(f"samples_per_shard={samples_per_shard!r}: must be an integer >= 1")
        if workers in ("auto", 0, None):
            workers = cpu_count()
        if not _is_int(workers) or int(workers) < 1:
            raise ConfigError(f"workers={workers!r}: must be an integer >= 1 or 'auto'")
        if not _is_int(seed):
            raise ConfigError(f"seed={seed!r}: must be an integer")
        if max_side is not None and (not _is_int(max_side) or max_side < 8):
            raise ConfigError(f"max_side={max_side!r}: must be an integer >= 8 (pixels of the longer side)")
        if not _is_int(quality) or not 1 <= quality <= 100:
            raise ConfigError(f"quality={quality!r}: must be an integer from 1 to 100 (90 is a good default)")
        if length is not None:
            parse_length(length)
        on_error = check_on_error(on_error)
        table = _table_options(input, columns, key)
        if tokenize is not None and (not isinstance(tokenize, str) or not tokenize):
            raise ConfigError(f"tokenize={tokenize!r}: name the text field to tokenize, e.g. txt")
        check_token_options(None if tokenizer is None else os.fspath(tokenizer), tokenize, length)
        mode, share = parse_store(store)
        if mode != "jpeg" and (table[0] is not None or table[1] is not None or tokenize is not None):
            raise ConfigError(f"store={store!r} is for image folders, manifests and WebDataset tars; parquet/HF "
                              "input (--columns/--key, --tokenize) stores its images encoded: drop --store")
        # --store raw stores no JPEG (but a sample's other image fields): restart markers only when asked
        jpeg_restarts = _jpeg_restarts(jpeg_restarts) if mode != "raw" or jpeg_restarts else False
        return cls(
            input=input, format=format, shard_size=size,
            samples_per_shard=None if samples_per_shard is None else int(samples_per_shard),
            workers=int(workers), shuffle=bool(shuffle), seed=int(seed),
            max_side=None if max_side is None else int(max_side), quality=int(quality), length=length,
            columns=table[0], key=table[1], tokenizer=None if tokenizer is None else os.fspath(tokenizer),
            tokenize=tokenize, on_error=on_error, overwrite=bool(overwrite), jpeg_restarts=bool(jpeg_restarts),
            store=store_name(mode, share),
        )

    def output_options(self) -> dict[str, Any]:
        """The options that shape the output (not ``workers`` or ``overwrite``)."""
        return {
            "format": self.format, "shard_size": self.shard_size,
            "samples_per_shard": self.samples_per_shard, "shuffle": self.shuffle,
            "seed": self.seed, "max_side": self.max_side, "quality": self.quality,
            "length": self.length, "on_error": self.on_error,
            **({"jpeg_restarts": True} if self.jpeg_restarts else {}),
            **({"store": self.store} if self.store != "jpeg" else {}),
            **{k: v for k, v in (("columns", self.columns), ("key", self.key), ("tokenize", self.tokenize))
               if v is not None},
        }


def _table_options(input: str | None, columns: str | Mapping[str, str] | None,
                   key: str | None) -> tuple[str | None, str | None]:
    """``columns`` as a canonical ``"col=field,..."`` string, and ``key``; only for table inputs."""
    if columns is None and key is None:
        return None, None
    if input is not None and input not in TABLE_INPUTS:
        raise ConfigError(f"columns/key (--columns, --key) are for parquet and HF datasets input, not "
                          f"input={input!r}; leave them out")
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError(f"key={key!r}: name the column that holds each row's key (or leave it out: row numbers)")
    if columns is None:
        return None, key
    mapping = parse_columns(columns)
    return ",".join(f"{c}={f}" if f else c for c, f in (mapping or {}).items()), key


#: Shard sizes below this are almost always a missing unit (``--shard-size 256``).
MIN_SHARD_SIZE = 1_000_000


def _shard_size(value: str | int) -> int:
    """``shard_size`` in bytes; a unit-less string below :data:`MIN_SHARD_SIZE` is refused
    (``256`` is 256 bytes: one sample per shard), an int below it is taken as bytes, logged."""
    size = parse_size(value, "shard_size")
    if size >= MIN_SHARD_SIZE:
        return size
    if isinstance(value, str):
        if not value.strip().isdigit():
            return size  # a unit written out: small on purpose
        raise ConfigError(f"shard_size={value!r} has no unit, so it means {size} bytes (about one sample per "
                          f"shard); write {value.strip()}MB if you meant megabytes (a size below "
                          f"{format_bytes(MIN_SHARD_SIZE)} needs its unit, e.g. {value.strip()}KB)")
    log.warning("shard_size=%r: %s per shard is very small (one or a few samples per shard, one file open "
                "per sample when reading); the usual size is 256MB", value, format_bytes(size))
    return size


#: How to get ``fastfeed._jpegroi`` built (for the messages of every engine).
RESTARTS_FIX = ("reinstall fastfeed from source with a C compiler and libjpeg-turbo's headers (Debian/Ubuntu: "
                 "apt-get install gcc libturbojpeg0-dev; pip install --force-reinstall --no-deps --no-binary fastfeed "
                 "fastfeed)")


def _jpeg_restarts(asked: bool | None) -> bool:
    """``None`` (the default): restart markers when ``fastfeed._jpegroi`` is built, else
    none and one warning; ``True`` without the extension is an error."""
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


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its number, file name and units in file order (samples, or blocks of rows).

    Attributes:
        number, name: the shard.
        units: the source's units it holds, in file order.
        rows: samples planned (a block holds many).
        raw: per sample, whether its image is stored as pixels (``--store raw|mixed:P``); empty: none is.
        files, nbytes: source files and bytes its units read (progress).
    """

    number: int
    name: str
    units: tuple[Any, ...]
    rows: int
    raw: tuple[bool, ...] = ()
    files: int = 0
    nbytes: int = 0

    @property
    def planned(self) -> int:
        """Samples planned."""
        return self.rows

    @property
    def dali_index_name(self) -> str:
        """DALI index file name next to a tar shard (``shard-000003.idx``)."""
        return dali_index_name(self.name)


@dataclass(frozen=True)
class PackPlan:
    """Everything ``write_shard`` and ``finalize`` need; plain data, picklable.

    Attributes:
        src: the source as given, absolute (``datasets.Dataset`` for an object).
        dst: the destination folder, absolute.
        options: the validated options.
        shards: the shards in order.
        skipped: inputs left out while planning (``on_error="skip"``).
        job: resume identity (source location + options + versions).
        content: location-independent id of the planned output, stored in the index.
        source: the source, as every writer reads it (:meth:`~fastfeed.packing.sources.base.Source.for_writer`).
        complete: DST already holds exactly this dataset; nothing to write.
        pillow: Pillow version when images are re-encoded (part of both ids).
        tokens: the pack-time tokenizer and the field it reads, else None.
    """

    src: str
    dst: str
    options: PackOptions
    shards: tuple[ShardPlan, ...]
    skipped: tuple[dict[str, str], ...]
    job: str
    content: str
    source: Source
    complete: bool = False
    pillow: str | None = None
    tokens: TokenPlan | None = None

    @property
    def kind(self) -> str:
        """The input kind (one of :data:`~fastfeed.packing.sources.base.INPUTS`)."""
        return self.source.kind

    @property
    def root(self) -> str:
        """What the source's member paths are relative to."""
        return self.source.root

    @property
    def classes(self) -> tuple[str, ...] | None:
        """Class names (ImageFolder), else None."""
        return self.source.classes

    @property
    def has_labels(self) -> bool:
        """Whether the index gets ``labels.npy``."""
        return self.source.has_labels

    @property
    def num_samples(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def total_files(self) -> int:
        """Source files the shards read (inline fields not counted); rows of a table."""
        return sum(s.files for s in self.shards)

    @property
    def total_bytes(self) -> int:
        """Bytes of source files the shards read (a table: uncompressed bytes of its units)."""
        return sum(s.nbytes for s in self.shards)

    @property
    def lengths_field(self) -> str | None:
        """The field ``lengths.npy`` describes: the tokenized field, else ``--length``, else None."""
        return self.tokens.field if self.tokens is not None else self.options.length

    def index_options(self) -> dict[str, Any]:
        """Options recorded in ``index.json``: what shaped the output, and its content id."""
        opts = self.options.output_options()
        opts["content"] = self.content
        if self.pillow is not None:
            opts["pillow"] = self.pillow
        if self.tokens is not None:
            opts["tokenizer"] = self.tokens.tokenizer.sha256
        return opts


# ---------------------------------------------------------------- planning
def plan_pack(src: str | os.PathLike[str] | Any, dst: str | os.PathLike[str], **options: Any) -> PackPlan:
    """Check the options, open ``src`` and plan it into shards; check and prepare ``dst``.

    Deterministic: the same source and options give an equal plan. Accepts the keyword
    options of :func:`fastfeed.packing.api.pack`.

    Raises:
        ConfigError: an invalid option.
        SourceError: bad input (``on_error="raise"``), or nothing to pack.
        DestinationError: DST inside SRC, or a non-empty DST that is not an unfinished
            run of this job (without ``overwrite=True``).

    Example:
        >>> plan = plan_pack("train", "train-ff", samples_per_shard=500, shuffle=True)  # doctest: +SKIP
    """
    opts = PackOptions.create(**options)
    tok = load_tokenizer(opts.tokenizer) if opts.tokenizer is not None else None  # fail before a long scan
    dst_path = Path(dst).absolute()
    if isinstance(src, (str, os.PathLike)) and not is_url(src):
        check_not_inside(Path(src).absolute(), dst_path)
    source = open_source(src, input=opts.input, on_error=opts.on_error, length=opts.length,
                         columns=opts.columns, key=opts.key, store=opts.store)
    return plan_source(source, dst_path, opts, tok)


def plan_source(source: Source, dst: Path, opts: PackOptions, tok: Tokenizer | None = None) -> PackPlan:
    """Plan an opened ``source`` into ``dst``: order, cut, the ids; check and prepare ``dst``.

    Example:
        >>> plan = plan_source(open_source("train"), Path("train-ff"), PackOptions.create())  # doctest: +SKIP
    """
    tokens = None
    if tok is not None or opts.length is not None:
        fields = source.fields
        tokens = token_plan(tok, opts.tokenize, opts.length, fields, source.shown)
        if opts.length is not None and tokens is None:
            check_length_field(opts.length, fields, source.shown)
    source = source.split(opts.shard_size, opts.samples_per_shard)
    units = list(source.units)
    if opts.shuffle:
        perm = np.random.default_rng(opts.seed).permutation(len(units))
        units = [units[i] for i in perm]
    measures = [source.measure(u, opts.format) for u in units]
    sizes = [m.size for m in measures]
    mode, share = opts.store_mode
    raw: list[bool] = []
    if mode != "jpeg":  # which images are stored as pixels, and what they take (pixels.py); a table refuses --store
        raw, pixel_bytes = plan_raw(source.root, units, mode, share, opts.max_side)
        sizes = [n + _pixel_delta(u, b) if b else n for n, u, b in zip(sizes, units, pixel_bytes)]
    if source.blocks:
        groups = group_units(sizes, [m.rows for m in measures], opts.shard_size, opts.samples_per_shard)
    else:
        groups = _runs(shard_counts(len(units), sizes, opts))
    suffix = FORMATS[opts.format][2]
    shards = tuple(ShardPlan(n, shard_name(n, len(groups), suffix), tuple(units[a:b]),
                             sum(m.rows for m in measures[a:b]), tuple(raw[a:b]),
                             sum(m.files for m in measures[a:b]), sum(m.nbytes for m in measures[a:b]))
                   for n, (a, b) in enumerate(groups))
    content = source.content([(s.units, s.raw) for s in shards], opts.output_options(),
                             tok.sha256 if tok is not None else None)
    job = _digest({"fastfeed": __version__, "kind": source.kind, "src": source.location,
                   "options": opts.output_options(), "pillow": content.pillow,
                   **({"tokenizer": tok.sha256} if tok is not None else {})})
    complete = check_destination(dst, source.kind, job, content.id, overwrite=opts.overwrite)
    plan = PackPlan(src=source.src, dst=str(dst), options=opts, shards=shards, skipped=tuple(source.skipped),
                    job=job, content=content.id, source=source.for_writer(), complete=complete,
                    pillow=content.pillow, tokens=tokens)
    if not complete:
        _prepare(plan)
    counts = [s.rows for s in shards]
    log.info("%s: %d samples (%s) in %d shard(s) of %d-%d samples (%s of source data, %d skipped)",
             source.shown, plan.num_samples, source.kind, len(shards), min(counts), max(counts),
             format_bytes(plan.total_bytes), len(source.skipped))
    return plan


def shard_counts(n: int, sizes: list[int], opts: PackOptions) -> list[int]:
    """Balanced samples per shard: as few shards as the size limit allows, counts within one.

    Example:
        >>> shard_counts(10, [1] * 10, PackOptions(samples_per_shard=4))
        [4, 3, 3]
    """
    if opts.samples_per_shard is not None:
        num = math.ceil(n / opts.samples_per_shard)
    else:
        num = math.ceil(sum(sizes) / opts.shard_size)
    num = max(1, min(num, n))
    base, extra = divmod(n, num)
    return [base + (1 if i < extra else 0) for i in range(num)]


def group_units(sizes: Sequence[int], rows: Sequence[int], shard_bytes: int,
                shard_rows: int | None = None) -> list[tuple[int, int]]:
    """Consecutive blocks per shard, as ``(start, stop)``: a new shard starts when adding a block would
    pass ``shard_bytes`` or ``shard_rows``; a block larger than that is a shard alone.

    Deterministic: the same blocks and limits give the same shards (resume after a crash).

    Example:
        >>> group_units([100, 100, 100, 100], [3, 3, 3, 1], 250)
        [(0, 2), (2, 4)]
        >>> group_units([100, 100, 100, 100], [3, 3, 3, 1], 10**9, shard_rows=6)
        [(0, 2), (2, 4)]
    """
    if shard_bytes <= 0 or (shard_rows is not None and shard_rows <= 0):
        raise ConfigError(f"shard_bytes={shard_bytes}, shard_rows={shard_rows}: must be positive")
    shards: list[tuple[int, int]] = []
    start = nbytes = count = 0
    for i, (size, n) in enumerate(zip(sizes, rows)):
        over = nbytes + size > shard_bytes or (shard_rows is not None and count + n > shard_rows)
        if i > start and over:
            shards.append((start, i))
            start, nbytes, count = i, 0, 0
        nbytes += size
        count += n
    if len(sizes) > start:
        shards.append((start, len(sizes)))
    return shards


def _runs(counts: list[int]) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive runs of ``counts`` items."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def _pixel_delta(s: Any, pixel_bytes: int) -> int:
    """How much a sample grows when its image is stored as ``pixel_bytes`` of pixels."""
    m = image_member(s)
    return pixel_bytes - (m.size if m is not None else 0)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _prepare(plan: PackPlan) -> None:
    record = {"job": plan.job, "fastfeed": __version__, "src": plan.src, "content": plan.content}
    prepare_destination(Path(plan.dst), overwrite=plan.options.overwrite, record=record)
