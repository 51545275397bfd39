"""Step 1 of packing: :func:`plan_pack` decides everything before any shard is written.

``plan_pack`` walks and validates the source (:mod:`fastfeed.packing.sources.scan`), orders the samples
(sorted by key, then a seeded permutation with ``shuffle``), cuts them into balanced
shards (counts differ by at most one), checks the destination, and returns a frozen,
picklable :class:`PackPlan`. Steps 2 and 3 (:func:`fastfeed.packing.write.write_shard`,
:func:`fastfeed.packing.finish.finalize`) only execute it, so any engine (the local process pool,
Ray) that runs ``write_shard`` for every shard number produces the same bytes.

The only side effects are on DST: it is created, ``overwrite=True`` removes fastfeed's
own files from it (shards, sidecars, index, resume records; nothing else), and the
resume identity of the job is recorded in ``DST/.fastfeed-pack/job.json``.

Example:
    >>> plan = plan_pack("imagenet/train", "/data/in-ff", samples_per_shard=1000)  # doctest: +SKIP
    >>> len(plan.shards), plan.shards[0].name, len(plan.shards[0].samples)        # doctest: +SKIP
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
from typing import Any, Mapping

import numpy as np

from fastfeed import __version__
from fastfeed._util import check_on_error, format_bytes, parse_size
from fastfeed.decode import roi
from fastfeed.errors import ConfigError
from fastfeed.formats import FORMATS
from fastfeed.host import cpu_count
from fastfeed.packed.layout import dali_index_name, shard_name
from fastfeed.packing.sources.columns import LABEL_COLUMNS, parse_columns
from fastfeed.packing.dest import check_destination, check_not_inside, prepare_destination
from fastfeed.packing.sources.parquet import TableSource, scan_parquet
from fastfeed.packing.content.pixels import image_member, parse_store, plan_raw, store_name
from fastfeed.packing.sources.base import INPUTS, TABLE_INPUTS, SampleSpec, Source, parse_length, show
from fastfeed.packing.content.tables import (
    TokenPlan,
    check_length_column,
    check_token_options,
    split_units,
    table_content,
    table_shards,
    token_plan,
    wants_table,
)
from fastfeed.packing.content.tokenize import Tokenizer, load_tokenizer
from fastfeed.packing.sources.scan import scan
from fastfeed.storage.remote import is_url

__all__ = ["PackOptions", "PackPlan", "ShardPlan", "plan_pack", "shard_counts"]

log = logging.getLogger("fastfeed.pack")

_TAR_MEMBER_OVERHEAD = 512


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
        if input in ("auto", ""):
            input = None
        if input is not None and input not in INPUTS:
            raise ConfigError(f"input={input!r}: choose one of {', '.join(INPUTS)} (or leave it out to detect)")
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
    """One shard to write: its number, file name and samples in file order; for a table
    source, the indices of its units (into ``PackPlan.table.units``) and their rows instead."""

    number: int
    name: str
    samples: tuple[SampleSpec, ...]
    units: tuple[int, ...] = ()
    rows: int = 0
    #: per sample, whether its image is stored as pixels (``--store raw|mixed:P``); empty: none is
    raw: tuple[bool, ...] = ()

    @property
    def planned(self) -> int:
        """Samples planned: the sample specs, or the rows of the units."""
        return len(self.samples) + self.rows

    @property
    def dali_index_name(self) -> str:
        """DALI index file name next to a tar shard (``shard-000003.idx``)."""
        return dali_index_name(self.name)


@dataclass(frozen=True)
class PackPlan:
    """Everything ``write_shard`` and ``finalize`` need; plain data, picklable.

    Attributes:
        src: the source as given, absolute.
        dst: the destination folder, absolute.
        root: folder that sample member paths are relative to.
        kind: ``imagefolder``, ``files`` or ``jsonl``.
        options: the validated options.
        shards: the shards in order.
        classes: class names (ImageFolder), else None.
        has_labels: whether the index gets ``labels.npy``.
        skipped: inputs left out while planning (``on_error="skip"``).
        manifest: JSONL manifest file name inside ``root``, else None.
        manifest_sha256: its checksum (part of the content id).
        job: resume identity (source location + options + versions).
        content: location-independent id of the planned output, stored in the index.
        complete: DST already holds exactly this dataset; nothing to write.
        pillow: Pillow version when images are re-encoded (part of both ids).
        table: a parquet / HF datasets source (``kind`` ``parquet`` or ``hf``), else None.
        tokens: the pack-time tokenizer and the field it reads, else None.
    """

    src: str
    dst: str
    root: str
    kind: str
    options: PackOptions
    shards: tuple[ShardPlan, ...]
    classes: tuple[str, ...] | None
    has_labels: bool
    skipped: tuple[dict[str, str], ...]
    manifest: str | None
    manifest_sha256: str | None
    job: str
    content: str
    complete: bool = False
    pillow: str | None = None
    table: TableSource | None = None
    tokens: TokenPlan | None = None

    @property
    def num_samples(self) -> int:
        return sum(s.planned for s in self.shards)

    @property
    def total_files(self) -> int:
        """Source files the shards read (inline fields not counted); rows of a table."""
        if self.table is not None:
            return sum(s.rows for s in self.shards)
        return sum(1 for s in self.shards for x in s.samples for m in x.members if m.path is not None)

    @property
    def total_bytes(self) -> int:
        """Bytes of source files the shards read (a table: uncompressed bytes of its units)."""
        if self.table is not None:
            return sum(self.table.units[i].nbytes for s in self.shards for i in s.units)
        return sum(m.size for s in self.shards for x in s.samples for m in x.members if m.path is not None)

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
def plan_pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], **options: Any) -> PackPlan:
    """Walk, validate, order and cut ``src`` into shards; check and prepare ``dst``.

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
    if wants_table(src, opts.input):
        return _plan_table(src, Path(dst).absolute(), opts, tok)
    if opts.columns is not None or opts.key is not None:
        raise ConfigError(f"{show(os.fspath(src))}: columns/key (--columns, --key) are for parquet and HF "
                          "datasets input; this SRC is not one (leave them out, or pass --input parquet)")
    url_src = is_url(src)  # SRC on object storage: see fastfeed.packing.sources.remote
    src_path: Any = str(src).rstrip("/") if url_src else Path(src).absolute()
    dst_path = Path(dst).absolute()
    if not url_src:
        check_not_inside(src_path, dst_path)
    source = scan(src_path, input=opts.input, on_error=opts.on_error, length=opts.length)
    pillow = _pillow_version() if opts.max_side is not None else None
    samples = list(source.samples)
    if opts.shuffle:
        perm = np.random.default_rng(opts.seed).permutation(len(samples))
        samples = [samples[i] for i in perm]
    sizes = [_estimate(s, opts.format) for s in samples]
    mode, share = opts.store_mode
    raw: list[bool] = []
    if mode != "jpeg":  # which images are stored as pixels, and what they take (pixels.py)
        raw, pixel_bytes = plan_raw(source.root, samples, mode, share, opts.max_side)
        sizes = [n + _pixel_delta(s, b) if b else n for n, s, b in zip(sizes, samples, pixel_bytes)]
    counts = shard_counts(len(samples), sizes, opts)
    suffix = FORMATS[opts.format][2]
    shards, start = [], 0
    for n, c in enumerate(counts):
        shards.append(ShardPlan(n, shard_name(n, len(counts), suffix), tuple(samples[start:start + c]),
                                raw=tuple(raw[start:start + c])))
        start += c
    tokens = token_plan(tok, opts.tokenize, opts.length, _field_names(source) if tok is not None else {},
                        show(str(src_path)), columns=False)
    job = _digest({"fastfeed": __version__, "kind": source.kind,
                   "src": src_path if url_src else os.path.realpath(src_path),
                   "options": opts.output_options(), "pillow": pillow,
                   **({"tokenizer": tok.sha256} if tok is not None else {})})
    content = _content_id(source, shards, opts, pillow, tok)
    complete = check_destination(dst_path, source.kind, job, content, overwrite=opts.overwrite)
    plan = PackPlan(
        src=str(src_path), dst=str(dst_path), root=source.root, kind=source.kind, options=opts,
        shards=tuple(shards), classes=source.classes, has_labels=source.has_labels,
        skipped=tuple(source.skipped), manifest=source.manifest,
        manifest_sha256=source.manifest_sha256, job=job, content=content, complete=complete,
        pillow=pillow, tokens=tokens,
    )
    if not complete:
        _prepare(plan)
    log.info("%s: %d samples in %d shard(s) of %d-%d samples (%s of source files, %d skipped)",
             show(str(src_path)), plan.num_samples, len(counts), min(counts), max(counts),
             format_bytes(plan.total_bytes), len(source.skipped))
    return plan


def _plan_table(src: Any, dst: Path, opts: PackOptions, tok: Tokenizer | None) -> PackPlan:
    """:func:`plan_pack` for parquet files and HF datasets: shards of whole units (row groups,
    row ranges), in source order or, with ``shuffle``, in a seeded order of units."""
    hf_object = not isinstance(src, (str, os.PathLike))
    shown = "datasets.Dataset" if hf_object else show(os.fspath(src))
    if not hf_object and Path(src).is_dir():
        check_not_inside(Path(src).absolute(), dst)
    if opts.store != "jpeg":
        raise ConfigError(f"{shown}: store={opts.store!r} is for image folders, manifests and WebDataset tars; "
                          "parquet/HF input stores its images encoded: drop --store (or pack the images from a folder)")
    table = scan_parquet(src, columns=opts.columns, key=opts.key, on_error=opts.on_error)
    table = split_units(table, opts.shard_size, opts.samples_per_shard)
    names = {**{cf.field: cf.field for cf in table.fields if cf.field}, **{cf.column: cf.field for cf in table.fields}}
    listed = [cf.column for cf in table.fields]
    tokens = token_plan(tok, opts.tokenize, opts.length, names, shown, columns=True, listed=listed)
    if opts.length is not None and tokens is None:
        check_length_column(opts.length, names, shown, listed)
    cut = table_shards(table, opts.shard_size, opts.samples_per_shard, opts.seed if opts.shuffle else None)
    suffix = FORMATS[opts.format][2]
    shards = tuple(ShardPlan(n, shard_name(n, len(cut), suffix), (), units, rows)
                   for n, (units, rows) in enumerate(cut))
    where = f"datasets.Dataset:{table.fingerprint}" if hf_object else os.path.realpath(os.fspath(src))
    job = _digest({"fastfeed": __version__, "kind": table.kind, "src": where, "options": opts.output_options(),
                   **({"tokenizer": tok.sha256} if tok is not None else {})})
    content = table_content(table, [s.units for s in shards], opts.output_options(),
                            tok.sha256 if tok is not None else None)
    complete = check_destination(dst, table.kind, job, content, overwrite=opts.overwrite)
    plan = PackPlan(
        src=shown if hf_object else str(Path(src).absolute()), dst=str(dst), root=table.root, kind=table.kind,
        options=opts, shards=shards, classes=None,
        has_labels=any(cf.column in LABEL_COLUMNS for cf in table.fields), skipped=table.skipped,
        manifest=None, manifest_sha256=None, job=job, content=content, complete=complete, table=table,
        tokens=tokens,
    )
    if not complete:
        _prepare(plan)
    counts = [s.rows for s in shards]
    log.info("%s: %d rows (%s) in %d shard(s) of %d-%d rows, %d skipped", shown, plan.num_samples, table.kind,
             len(shards), min(counts), max(counts), len(table.skipped))
    return plan


def _field_names(source: Source) -> dict[str, str]:
    """Every name ``--tokenize``/``--length`` may use for a field of the source -> the field."""
    names: dict[str, str] = {}
    for s in source.samples:
        for m in s.members:
            names.setdefault(m.field, m.field)
            if m.json_key is not None:
                names.setdefault(m.json_key, m.field)
    return names


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


def _estimate(s: SampleSpec, fmt: str) -> int:
    """Approximate bytes a sample takes in a shard (source sizes; inline JSON ~ its line)."""
    total = 0
    inline = s.line[1] if s.line is not None else 0
    for m in s.members:
        size = m.size if m.path is not None else len(m.data) if m.data is not None else inline
        if fmt == "tar":
            total += _TAR_MEMBER_OVERHEAD + size + (-size % 512)
        else:
            total += 16 + len(m.field) + size
    if fmt == "lmdb":
        total = 4096 * math.ceil((total + 64) / 4096) if total > 2000 else total + 64
    return total


def _pixel_delta(s: SampleSpec, pixel_bytes: int) -> int:
    """How much a sample grows when its image is stored as ``pixel_bytes`` of pixels."""
    m = image_member(s)
    return pixel_bytes - (m.size if m is not None else 0)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _content_id(source: Source, shards: list[ShardPlan], opts: PackOptions, pillow: str | None,
                tok: Tokenizer | None) -> str:
    """Hash of what the output is made of: options, sample keys, fields, paths, sizes."""
    h = hashlib.sha256()
    h.update(json.dumps([__version__, source.kind, opts.output_options(), pillow, source.classes,
                         source.manifest_sha256, *([tok.sha256] if tok is not None else [])], default=str).encode())
    for sh in shards:
        h.update(b"|shard")
        if sh.raw:
            h.update(bytes(sh.raw))
        for s in sh.samples:
            h.update(repr((s.key, s.label, [(m.field, m.path, m.size, m.data, m.json_key)
                                            + (() if m.offset is None else (m.offset,))
                                            for m in s.members])).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:32]


def _pillow_version() -> str:
    import PIL

    return str(PIL.__version__)


def _prepare(plan: PackPlan) -> None:
    record = {"job": plan.job, "fastfeed": __version__, "src": plan.src, "content": plan.content}
    prepare_destination(Path(plan.dst), overwrite=plan.options.overwrite, record=record)
