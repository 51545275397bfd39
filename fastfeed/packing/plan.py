"""Step 1 of packing: :func:`plan_pack` decides everything before any shard is written.

``plan_pack`` checks the options (:class:`~fastfeed.packing.options.PackOptions`), opens the source
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
from typing import Any, Sequence

import numpy as np

from fastfeed import __version__
from fastfeed._util import format_bytes
from fastfeed.errors import ConfigError
from fastfeed.formats import FORMATS
from fastfeed.packed.layout import dali_index_name, shard_name
from fastfeed.packing.content.pixels import plan_raw
from fastfeed.packing.content.tokenize import Tokenizer, load_tokenizer
from fastfeed.packing.content.tokens import TokenPlan, check_length_field, token_plan
from fastfeed.packing.dest import check_destination, check_not_inside, prepare_destination
from fastfeed.packing.options import PackOptions
from fastfeed.packing.sources.base import Source, image_member
from fastfeed.packing.sources.detect import open_source
from fastfeed.storage.remote import is_url

__all__ = ["PackPlan", "ShardPlan", "group_units", "plan_pack", "plan_source", "shard_counts"]

log = logging.getLogger("fastfeed.pack")

#: Bytes of the sidecars per sample, at most (offsets 16, labels, lengths, checksums 8 each, shapes, sizes 8 each).
_SIDECAR_BYTES = 56


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its number, file name and units in file order (samples, or blocks of rows).

    Attributes:
        number: the shard's number.
        name: the shard's file name.
        units: the source's units it holds, in file order.
        rows: samples planned (a block holds many).
        raw: per sample, whether its image is stored as pixels (``--store raw|mixed:P``); empty: none is.
        files: source files its units read (progress).
        nbytes: source bytes its units read (progress).
        size: the shard file's expected bytes, estimated from its units (a full disk's message).
    """

    number: int
    name: str
    units: tuple[Any, ...]
    rows: int
    raw: tuple[bool, ...] = ()
    files: int = 0
    nbytes: int = 0
    size: int = 0

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

    def bytes_to_write(self) -> int:
        """Bytes this pack still writes into DST, estimated: the planned shards not there yet, the
        sidecars and ``index.json`` (what a full disk's message says is still needed)."""
        dst = Path(self.dst)
        shards = sum(s.size for s in self.shards if not (dst / s.name).is_file())
        return shards + _SIDECAR_BYTES * self.num_samples + 300 * len(self.shards) + 4096

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
                         columns=opts.columns, key=opts.key, store=opts.store, allow_outside=opts.allow_outside)
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
                             sum(m.files for m in measures[a:b]), sum(m.nbytes for m in measures[a:b]),
                             sum(sizes[a:b]))
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
    prepare_destination(Path(plan.dst), overwrite=plan.options.overwrite, record=record,
                        needed=plan.bytes_to_write)
