"""Step 1 of packing: :func:`plan_pack` decides everything before any shard is written.

``plan_pack`` walks and validates the source (:mod:`fastfeed.packing.walk`), orders the samples
(sorted by key, then a seeded permutation with ``shuffle``), cuts them into balanced
shards (counts differ by at most one), checks the destination, and returns a frozen,
picklable :class:`PackPlan`. Steps 2 and 3 (:func:`fastfeed.packing.write.write_shard`,
:func:`fastfeed.packing.api.finalize`) only execute it, so any engine (the local process pool,
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
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastfeed import __version__
from fastfeed._util import format_bytes, parse_size
from fastfeed.decode import roi
from fastfeed.errors import ConfigError, DestinationError
from fastfeed.formats import FORMATS
from fastfeed.packed.index import INDEX_NAME, atomic_write_bytes
from fastfeed.storage.remote import is_url
from fastfeed.packing.walk import INPUTS, SampleSpec, Source, parse_length, scan, show

__all__ = ["RESUME_DIR", "PackOptions", "PackPlan", "ShardPlan", "plan_pack"]

log = logging.getLogger("fastfeed.pack")

RESUME_DIR = ".fastfeed-pack"
SKIPPED_NAME = "skipped.txt"
SIDECARS = ("offsets.npy", "labels.npy", "lengths.npy")
#: Files fastfeed writes into DST (``--overwrite`` removes these and nothing else).
OWN_FILE = re.compile(
    r"^(shard-\d{6,}\.(tar|lmdb|idx)(\.\d+\.tmp)?|index\.json|offsets\.npy|labels\.npy|"
    r"lengths\.npy|skipped\.txt|\.[a-z]+\.(json|npy|txt)\.tmp-\d+)$"
)
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
    on_error: str = "fail"
    overwrite: bool = False
    jpeg_restarts: bool = False  # create() resolves the default (on when fastfeed._jpegroi is built)

    @classmethod
    def create(cls, *, input: str | None = None, format: str = "tar",
               shard_size: str | int = "256MB", samples_per_shard: int | None = None,
               workers: int | str = 1, shuffle: bool = True, seed: int = 0,
               max_side: int | None = None, quality: int = 90, length: str | None = None,
               on_error: str = "fail", overwrite: bool = False, jpeg_restarts: bool | None = None) -> "PackOptions":
        """Check every option once, at the boundary; raises ConfigError naming the fix."""
        if input in ("auto", ""):
            input = None
        if input is not None and input not in INPUTS:
            raise ConfigError(f"input={input!r}: choose one of {', '.join(INPUTS)} (or leave it out to detect)")
        if format not in FORMATS:
            raise ConfigError(f"format={format!r}: choose one of {', '.join(sorted(FORMATS))}")
        size = parse_size(shard_size, "shard_size")
        if samples_per_shard is not None and (not _is_int(samples_per_shard) or samples_per_shard < 1):
            raise ConfigError(f"samples_per_shard={samples_per_shard!r}: must be an integer >= 1")
        if workers in ("auto", 0, None):
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
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
        if on_error not in ("fail", "skip"):
            raise ConfigError(f"on_error={on_error!r}: choose fail or skip")
        jpeg_restarts = _jpeg_restarts(jpeg_restarts)
        return cls(input, format, size, None if samples_per_shard is None else int(samples_per_shard),
                   int(workers), bool(shuffle), int(seed), None if max_side is None else int(max_side),
                   int(quality), length, on_error, bool(overwrite), bool(jpeg_restarts))

    def output_options(self) -> dict[str, Any]:
        """The options that shape the output (not ``workers`` or ``overwrite``)."""
        return {
            "format": self.format, "shard_size": self.shard_size,
            "samples_per_shard": self.samples_per_shard, "shuffle": self.shuffle,
            "seed": self.seed, "max_side": self.max_side, "quality": self.quality,
            "length": self.length, "on_error": self.on_error,
            **({"jpeg_restarts": True} if self.jpeg_restarts else {}),
        }


_RESTARTS_FIX = ("reinstall fastfeed from source with a C compiler and libjpeg-turbo's headers (Debian/Ubuntu: "
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
                    "image; %s", _RESTARTS_FIX)
        return False
    if asked and not roi.built():
        raise ConfigError(f"jpeg_restarts=True needs fastfeed's C extension fastfeed._jpegroi, which is not built "
                          f"here: {_RESTARTS_FIX}; or pass jpeg_restarts=False (--no-jpeg-restarts)")
    return bool(asked)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its number, file name and samples in file order."""

    number: int
    name: str
    samples: tuple[SampleSpec, ...]

    @property
    def dali_index_name(self) -> str:
        """DALI index file name next to a tar shard (``shard-000003.idx``)."""
        return self.name.rsplit(".", 1)[0] + ".idx"


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

    @property
    def num_samples(self) -> int:
        return sum(len(s.samples) for s in self.shards)

    @property
    def total_files(self) -> int:
        """Source files the shards read (inline fields not counted)."""
        return sum(1 for s in self.shards for x in s.samples for m in x.members if m.path is not None)

    @property
    def total_bytes(self) -> int:
        """Bytes of source files the shards read."""
        return sum(m.size for s in self.shards for x in s.samples for m in x.members if m.path is not None)

    def index_options(self) -> dict[str, Any]:
        """Options recorded in ``index.json``: what shaped the output, and its content id."""
        opts = self.options.output_options()
        opts["content"] = self.content
        if self.pillow is not None:
            opts["pillow"] = self.pillow
        return opts


# ---------------------------------------------------------------- planning
def plan_pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], **options: Any) -> PackPlan:
    """Walk, validate, order and cut ``src`` into shards; check and prepare ``dst``.

    Deterministic: the same source and options give an equal plan. Accepts the keyword
    options of :func:`fastfeed.packing.api.pack`.

    Raises:
        ConfigError: an invalid option.
        SourceError: bad input (``on_error="fail"``), or nothing to pack.
        DestinationError: DST inside SRC, or a non-empty DST that is not an unfinished
            run of this job (without ``overwrite=True``).

    Example:
        >>> plan = plan_pack("train", "train-ff", samples_per_shard=500, shuffle=True)  # doctest: +SKIP
    """
    opts = PackOptions.create(**options)
    url_src = is_url(src)  # SRC on object storage: see fastfeed.packing.srcurl
    src_path: Any = str(src).rstrip("/") if url_src else Path(src).absolute()
    dst_path = Path(dst).absolute()
    if not url_src:
        _check_not_inside(src_path, dst_path)
    source = scan(src_path, input=opts.input, on_error=opts.on_error, length=opts.length)
    pillow = _pillow_version() if opts.max_side is not None else None
    samples = list(source.samples)
    if opts.shuffle:
        perm = np.random.default_rng(opts.seed).permutation(len(samples))
        samples = [samples[i] for i in perm]
    counts = shard_counts(len(samples), [_estimate(s, opts.format) for s in samples], opts)
    suffix = FORMATS[opts.format][2]
    width = max(6, len(str(len(counts) - 1)))
    shards, start = [], 0
    for n, c in enumerate(counts):
        shards.append(ShardPlan(n, f"shard-{n:0{width}d}{suffix}", tuple(samples[start:start + c])))
        start += c
    job = _digest({"fastfeed": __version__, "kind": source.kind,
                   "src": src_path if url_src else os.path.realpath(src_path),
                   "options": opts.output_options(), "pillow": pillow})
    content = _content_id(source, shards, opts, pillow)
    complete = _check_destination(dst_path, source.kind, job, content, opts)
    plan = PackPlan(
        src=str(src_path), dst=str(dst_path), root=source.root, kind=source.kind, options=opts,
        shards=tuple(shards), classes=source.classes, has_labels=source.has_labels,
        skipped=tuple(source.skipped), manifest=source.manifest,
        manifest_sha256=source.manifest_sha256, job=job, content=content, complete=complete,
        pillow=pillow,
    )
    if not complete:
        _prepare(plan)
    log.info("%s: %d samples in %d shard(s) of %d-%d samples (%s of source files, %d skipped)",
             show(str(src_path)), plan.num_samples, len(counts), min(counts), max(counts),
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


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _content_id(source: Source, shards: list[ShardPlan], opts: PackOptions, pillow: str | None) -> str:
    """Hash of what the output is made of: options, sample keys, fields, paths, sizes."""
    h = hashlib.sha256()
    h.update(json.dumps([__version__, source.kind, opts.output_options(), pillow, source.classes,
                         source.manifest_sha256], default=str).encode())
    for sh in shards:
        h.update(b"|shard")
        for s in sh.samples:
            h.update(repr((s.key, s.label, [(m.field, m.path, m.size, m.data, m.json_key)
                                            for m in s.members])).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:32]


def _pillow_version() -> str:
    import PIL

    return str(PIL.__version__)


# ---------------------------------------------------------------- destination
def _check_not_inside(src: Path, dst: Path) -> None:
    if src.is_file():
        return
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if d == s or d.startswith(s.rstrip(os.sep) + os.sep):
        raise DestinationError(
            f"{show(str(dst))}: the destination is inside the source {show(str(src))}; its shards "
            "would be packed again on the next run. Choose a DST outside SRC"
        )


def _check_destination(dst: Path, kind: str, job: str, content: str, opts: PackOptions) -> bool:
    """Decide what DST is: new, resumable, already complete (True), or refused."""
    if dst.exists() and not dst.is_dir():
        raise DestinationError(f"{show(str(dst))}: exists and is not a folder; choose another DST")
    if not dst.exists():
        return False
    names = sorted(os.listdir(dst))
    if not names:
        return False
    if INDEX_NAME in names:
        try:
            d = json.loads((dst / INDEX_NAME).read_text("utf-8"))
            same = d.get("input") == kind and (d.get("options") or {}).get("content") == content
        except (OSError, ValueError):
            same = False
        if same and not opts.overwrite:
            if _shards_present(dst, d):
                return True
            log.warning("%s: index.json is there but shards are missing or truncated; packing again",
                        show(str(dst)))
            return False
        if not opts.overwrite:
            raise DestinationError(
                f"{show(str(dst))}: already holds a complete dataset packed from other input or "
                "options; pass --overwrite to replace it, or choose another DST"
            )
        return False
    if RESUME_DIR in names:
        try:
            previous = json.loads((dst / RESUME_DIR / "job.json").read_text("utf-8")).get("job")
        except (OSError, ValueError):
            previous = None
        if previous == job:
            log.info("%s: resuming an unfinished run of this job", show(str(dst)))
            return False
    if opts.overwrite:
        return False
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    what = "an unfinished run of another job (other source or options)" if RESUME_DIR in names else \
        f"not empty ({shown})"
    raise DestinationError(
        f"{show(str(dst))}: {what}; choose an empty or new DST, or pass --overwrite to replace "
        "fastfeed's files there (other files are left alone)"
    )


def _shards_present(dst: Path, index_json: dict[str, Any]) -> bool:
    for s in index_json.get("shards", []):
        p = dst / str(s.get("name", ""))
        if not p.is_file() or p.stat().st_size != int(s.get("bytes", -1)):
            return False
    return True


def _prepare(plan: PackPlan) -> None:
    dst = Path(plan.dst)
    if plan.options.overwrite and dst.is_dir():
        remove_own_files(dst, keep=())
        shutil.rmtree(dst / RESUME_DIR, ignore_errors=True)
    (dst / RESUME_DIR).mkdir(parents=True, exist_ok=True)
    job_path = dst / RESUME_DIR / "job.json"
    record = {"job": plan.job, "fastfeed": __version__, "src": plan.src, "content": plan.content}
    try:
        previous = json.loads(job_path.read_text("utf-8"))
    except (OSError, ValueError):
        previous = None
    if previous != record:
        atomic_write_bytes(job_path, (json.dumps(record, indent=1) + "\n").encode())


def remove_own_files(dst: Path, keep: tuple[str, ...]) -> list[str]:
    """Delete fastfeed's files in ``dst`` (shards, temporaries, sidecars, index) except ``keep``."""
    removed = []
    for name in sorted(os.listdir(dst)):
        if name in keep or not OWN_FILE.match(name):
            continue
        try:
            (dst / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed
