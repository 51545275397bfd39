"""``fastfeed info`` and ``fastfeed verify``: what a packed dataset holds, and is it intact.

:func:`info` reads the index and its sidecars (never the shards) into an :class:`InfoReport`;
:func:`verify` checks everything a reader relies on: the index loads, every shard exists
with its recorded size and sha256, every sample parses and its key is unique, every sample's
bytes have the checksum ``checksums.npy`` recorded (:mod:`fastfeed.packed.integrity`), every
sidecar has the sha256 ``index.json`` recorded and integer rows of the right shape, the
offsets in ``offsets.npy`` point at the samples (tar) or records (LMDB), each tar's DALI
index matches its members, labels match the ``cls`` members and lie within ``classes``,
lengths and ``skipped.txt`` agree with the index, every image decodes (a JPEG whose data
libjpeg finds corrupt counts as damaged, :func:`~fastfeed.formats.images.decode_error`), and
every image stored as pixels (``rgb8``, ``pack --store raw``) has the bytes its shape in
``shapes.npy`` says. It collects problems instead of stopping at the first one, and survives
what it finds: a shard whose check kills its worker process is named as a problem.

Both reports print as :meth:`~InfoReport.text` (what ``fastfeed info`` / ``verify`` show) and
:meth:`~InfoReport.to_json` (what they show with ``--json``).

Example:
    >>> info("/data/in-ff").num_samples   # doctest: +SKIP
    1281167
    >>> report = verify("/data/in-ff", workers=4)   # doctest: +SKIP
    >>> report.ok, report.samples, report.problems[:1]  # doctest: +SKIP
    (True, 1281167, [])
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from fastfeed._util import format_bytes
from fastfeed.errors import ConfigError, FastfeedError
from fastfeed.formats import FORMATS
from fastfeed.formats.images import decode_error
from fastfeed.formats.naming import RAW_FIELD, is_image, last_ext, split_key
from fastfeed.formats.wds import scan_tar
from fastfeed.host import cpu_count
from fastfeed.packed.index import DatasetIndex, ShardInfo
from fastfeed.packed.integrity import run_isolated, sample_problems, verify_sidecars
from fastfeed.packed.layout import (
    CHECKSUMS_NAME,
    LABELS_NAME,
    LENGTHS_NAME,
    OFFSETS_NAME,
    SHAPES_NAME,
    SKIPPED_NAME,
)
from fastfeed.packed.reader import resolve_index
from fastfeed.storage.remote import is_gzip_tar, open_shard

__all__ = ["ASPECTS", "InfoReport", "VerifyReport", "aspect_info", "aspect_lines", "encoded_store_line", "image_kinds",
           "info", "store_line", "verify"]

_MAX_PROBLEMS_PER_SHARD = 50
_T = TypeVar("_T")


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        path: the dataset folder.
        ok: True when no problem was found.
        problems: one line per problem, naming the file or shard and what to do.
        shards: shards checked.
        samples: samples read.
        images: encoded images (image files) found; each one decoded unless ``decoded`` is False.
        bytes: bytes of the shards checked.
        pixels: images stored as pixels (``pack --store raw``) whose size was checked against ``shapes.npy``.
        decoded: whether the encoded images were decoded (False: ``verify(decode=False)``, ``--no-decode``).
    """

    path: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    shards: int = 0
    samples: int = 0
    images: int = 0
    bytes: int = 0
    pixels: int = 0
    decoded: bool = True

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the attributes (what ``fastfeed verify --json`` prints)."""
        return asdict(self)

    def text(self) -> str:
        """What ``fastfeed verify`` prints: one ``ok:`` line, or the problems, one a line.

        Example:
            >>> print(VerifyReport("ff", ok=True, shards=2, samples=60, images=60).text())
            ok: 2 shard(s), 60 samples, 60 images decoded
            >>> print(VerifyReport("ff", ok=True, shards=2, samples=60, images=60, decoded=False).text())
            ok: 2 shard(s), 60 samples, 60 images not decoded (--no-decode)
            >>> print(VerifyReport("ff", ok=True, shards=1, samples=8, pixels=8).text())
            ok: 1 shard(s), 8 samples, 8 images as pixels (sizes checked against shapes.npy)
            >>> print(VerifyReport("ff", ok=False, problems=["ff/a.tar: missing"]).text())
            ff: 1 problem(s):
              ff/a.tar: missing
        """
        if self.ok:
            parts = [f"{self.shards} shard(s)", f"{self.samples} samples"]
            if self.images:
                parts.append(f"{self.images} images " + ("decoded" if self.decoded else "not decoded (--no-decode)"))
            if self.pixels:
                parts.append(f"{self.pixels} images as pixels (sizes checked against {SHAPES_NAME})")
            return "ok: " + ", ".join(parts)
        return "\n".join([f"{self.path}: {len(self.problems)} problem(s):", *(f"  {p}" for p in self.problems)])


#: What ``info`` and ``verify`` say about WebDataset tars that have no fastfeed index.
FOREIGN_NOTE = ("WebDataset tars without a fastfeed index (indexed in memory, as fastfeed.loader() reads them); "
                "`fastfeed pack {src} DST` converts them once into a packed dataset with an index (checksums, "
                "labels, DALI index files, a faster start)")


def open_checked(dst: str | os.PathLike[str], *, on_error: str = "raise") -> DatasetIndex:
    """The index of ``dst``: a packed dataset's, or, for a folder of WebDataset tars without
    one, the in-memory index the loader builds (:func:`~fastfeed.packed.reader.resolve_index`).

    Raises:
        FastfeedError: neither (the error of the missing index), or a damaged tar (``raise``).
    """
    if DatasetIndex.exists(dst):
        return DatasetIndex.load(dst)
    try:
        return resolve_index(dst, on_error=on_error)
    except ConfigError:  # no tars there either: say what a packed dataset lacks
        return DatasetIndex.load(dst)


def is_foreign(idx: DatasetIndex) -> bool:
    """True for the in-memory index of WebDataset tars (no ``index.json``)."""
    return bool(idx.options.get("scanned"))


@dataclass(frozen=True, eq=False)
class InfoReport(Mapping[str, Any]):
    """What :func:`info` says about a dataset: its index and sidecars, summarised.

    It is also a read-only mapping of the :meth:`to_json` keys (what :func:`info` returned
    before it returned a report), so ``report["num_samples"]`` is ``report.num_samples``.

    Attributes:
        path: the dataset, as given.
        format: ``tar`` or ``lmdb``.
        input: what pack read (``imagefolder``, ``files``, ``jsonl``, ``parquet``, ...).
        num_samples, num_shards, bytes: samples, shards, and the bytes of all shards.
        samples_per_shard: ``{"min", "max"}``.
        shard_bytes: ``{"min", "max", "mean"}``.
        fields: the fields of a sample (``jpg``, ``cls``, ...).
        classes: the class names (None without classes).
        has_labels: True when every sample has a class index (``labels.npy``).
        dali_index: True when every tar shard has its DALI index file.
        num_skipped: inputs left out (``pack --on-error skip``; for foreign tars, damaged or hidden members).
        lengths: ``{"field", "min", "max", "mean", "median", "total"}`` of ``lengths.npy`` (None without).
        options: the options pack recorded (``seed``, ``shuffle``, ``max_side``, ...).
        fastfeed_version, index_version, fingerprint: what wrote the index, its version, its identity.
        foreign: True for WebDataset tars without a fastfeed index (indexed in memory).
        store: how images are stored: ``{"mode": "jpeg"}``, or for raw pixels the index's
            ``store`` entry plus ``bytes`` (on disk) and ``bytes_as_jpeg`` (as image files).
        note: for foreign tars, what they are and how to convert them (None otherwise).
        samples_per_class: ``{"min", "max"}`` over the classes that have samples (None when no
            sample has a class); a key of the mapping only when ``has_labels``.
        tokenizer: the index's tokenizer entry plus ``total_tokens`` (``pack --tokenizer``; None without).
        aspect: the images' aspect ratios from ``sizes.npy`` (:func:`aspect_info`; None without sizes).

    Example:
        >>> report = info("/data/in-ff")                    # doctest: +SKIP
        >>> report.num_samples, report["num_classes"]       # doctest: +SKIP
        (1281167, 1000)
        >>> print(report.text().splitlines()[2])            # doctest: +SKIP
          samples    1281167 in 512 shard(s) of 2502-2503, 147.4 GB
    """

    path: str
    format: str
    input: str
    num_samples: int
    num_shards: int
    bytes: int
    samples_per_shard: dict[str, int]
    shard_bytes: dict[str, int]
    fields: tuple[str, ...]
    classes: tuple[str, ...] | None
    has_labels: bool
    dali_index: bool
    num_skipped: int
    lengths: dict[str, Any] | None
    options: dict[str, Any]
    fastfeed_version: str
    index_version: int
    fingerprint: str
    foreign: bool
    store: dict[str, Any]
    note: str | None = None
    samples_per_class: dict[str, int] | None = None
    tokenizer: dict[str, Any] | None = None
    aspect: dict[str, Any] | None = None

    @property
    def num_classes(self) -> int | None:
        """How many classes (None without classes)."""
        return None if self.classes is None else len(self.classes)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``fastfeed info --json`` prints); ``note``, ``samples_per_class`` and
        ``tokenizer`` are keys only where they apply (foreign tars, labels, a tokenizer)."""
        out: dict[str, Any] = {
            "path": self.path, "format": self.format, "input": self.input, "num_samples": self.num_samples,
            "num_shards": self.num_shards, "bytes": self.bytes, "samples_per_shard": dict(self.samples_per_shard),
            "shard_bytes": dict(self.shard_bytes), "fields": list(self.fields), "num_classes": self.num_classes,
            "classes": None if self.classes is None else list(self.classes), "has_labels": self.has_labels,
            "dali_index": self.dali_index, "num_skipped": self.num_skipped,
            "lengths": None if self.lengths is None else dict(self.lengths), "options": dict(self.options),
            "fastfeed_version": self.fastfeed_version, "index_version": self.index_version,
            "fingerprint": self.fingerprint, "foreign": self.foreign, "store": dict(self.store),
        }
        if self.foreign:
            out["note"] = self.note
        if self.has_labels:
            out["samples_per_class"] = None if self.samples_per_class is None else dict(self.samples_per_class)
        if self.tokenizer is not None:
            out["tokenizer"] = dict(self.tokenizer)
        if self.aspect is not None:
            out["aspect"] = dict(self.aspect)
        return out

    def text(self) -> str:
        """What ``fastfeed info`` prints: the path, then one line per aspect (format, samples,
        fields, store, classes, lengths, tokenizer, order, skipped)."""
        sps = self.samples_per_shard
        lines = [self.path, self._format_line(),
                 f"  samples    {self.num_samples} in {self.num_shards} shard(s) of {_span(sps)}, "
                 f"{format_bytes(self.bytes)}",
                 f"  fields     {', '.join(self.fields)}"]
        if self.store.get("mode", "jpeg") != "jpeg":
            lines.append(f"  {store_line(self.store, self.bytes)}")
        elif not self.foreign:
            lines.append(f"  {encoded_store_line(self.fields)}")
        if self.classes is not None:
            shown = ", ".join(self.classes[:4]) + (", ..." if len(self.classes) > 4 else "")
            spc = self.samples_per_class
            per = f"; {_span(spc)} samples per class" if spc else ""
            lines.append(f"  classes    {len(self.classes)} ({shown}){per}")
        if self.lengths is not None:
            ln = self.lengths
            lines.append(f"  lengths    {ln['field']}: min {ln['min']}, median {ln['median']:g}, max {ln['max']}, "
                         f"total {ln['total']}")
        if self.tokenizer:
            t = self.tokenizer
            stored = f"ids in {t['tokens']}" if t.get("tokens") else "counted only"
            lines.append(f"  tokenizer  {t.get('field')} ({stored}): vocab {t.get('vocab_size')}, {t.get('dtype')}, "
                         f"pad id {t.get('pad_id')}, {t.get('total_tokens')} tokens")
        lines += aspect_lines(self.aspect, self.path, self.fields, self.foreign)
        lines.append(self._order_line())
        where = " (hidden or damaged members, see -v)" if self.foreign else " (see skipped.txt)"
        lines.append(f"  skipped    {self.num_skipped}" + (where if self.num_skipped else ""))
        return "\n".join(lines)

    def _format_line(self) -> str:
        if self.foreign:
            return f"  format     {self.format}: {self.note}"
        dali = ", DALI index files" if self.dali_index else ""
        origin = (f"packed from {self.input}" if self.input else "packed") + (
            f" by fastfeed {self.fastfeed_version}" if self.fastfeed_version else "")  # older indexes: no version
        return f"  format     {self.format}{dali} ({origin}, index v{self.index_version})"

    def _order_line(self) -> str:
        o = self.options
        order = f"shuffled (seed {o.get('seed')})" if o.get("shuffle") else "key order"
        if self.foreign:
            order = "as stored in the tars"
        kinds = image_kinds(self.fields)  # what pack did to images, said only where there are images
        resize = (f", images resized to max side {o['max_side']} (quality {o['quality']})"
                  if o.get("max_side") and (kinds or RAW_FIELD in self.fields) else "")
        resize += (", JPEGs with restart markers (crops decode only their blocks)"
                   if o.get("jpeg_restarts") and "jpeg" in kinds else "")
        return f"  order      {order}{resize}"

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


def info(dst: str | os.PathLike[str]) -> InfoReport:
    """Summarise a packed dataset (from its index and sidecars; shards are not read), or a
    folder of WebDataset tars (from their member headers; ``foreign`` is True).

    Args:
        dst: the dataset folder or URL.

    Returns:
        An :class:`InfoReport` (also a read-only mapping of its JSON keys, as before).

    Raises:
        FastfeedError: no dataset there, or an index that does not load (the error says why).

    Example:
        >>> info("/data/in-ff")["num_samples"]   # doctest: +SKIP
        1281167
    """
    idx = open_checked(dst)
    counts = idx.shard_counts
    sizes = np.array([s.bytes for s in idx.shards], dtype=np.int64)
    total = int(sizes.sum())
    foreign = is_foreign(idx)
    return InfoReport(
        path=str(dst), format=idx.format, input=idx.input, num_samples=idx.num_samples, num_shards=len(idx.shards),
        bytes=total, samples_per_shard={"min": int(counts.min()), "max": int(counts.max())},
        shard_bytes={"min": int(sizes.min()), "max": int(sizes.max()), "mean": int(sizes.mean())},
        fields=tuple(idx.fields), classes=None if idx.classes is None else tuple(idx.classes),
        has_labels=idx.has_labels,
        dali_index=all(s.dali_index for s in idx.shards) if idx.format == "tar" else False,
        num_skipped=len(idx.skipped), lengths=_lengths_info(idx), options=dict(idx.options),
        fastfeed_version=idx.fastfeed_version, index_version=idx.version, fingerprint=idx.fingerprint,
        foreign=foreign, store=_store_info(idx, total), note=FOREIGN_NOTE.format(src=dst) if foreign else None,
        samples_per_class=_per_class(idx.labels), tokenizer=_tokenizer_info(idx),
        aspect=aspect_info(idx.image_sizes),
    )


#: The aspect ratios (width:height) ``info`` counts images by, each image at the nearest in log space.
ASPECTS = ("1:4", "1:3", "1:2", "9:16", "2:3", "3:4", "4:5", "1:1", "5:4", "4:3", "3:2", "16:9", "2:1", "3:1", "4:1")


def aspect_info(sizes: np.ndarray | None) -> dict[str, Any] | None:
    """The aspect ratios of images of displayed ``sizes`` ((N, 2) height, width; (0, 0) unknown):
    ``{"images", "unknown", "ratio": {"min", "median", "max"} (width / height), "near": {w:h: count}
    (each image at the nearest of :data:`ASPECTS` in log space, most common first), "pixels":
    {"min", "median", "max"}}``; None without sizes.

    Example:
        >>> a = aspect_info(np.array([[480, 640], [600, 800], [500, 500], [0, 0]]))
        >>> a["images"], a["unknown"], a["near"], a["ratio"]["median"]
        (3, 1, {'4:3': 2, '1:1': 1}, 1.3333)
    """
    if sizes is None:
        return None
    hw = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    known = hw[(hw[:, 0] > 0) & (hw[:, 1] > 0)]
    out: dict[str, Any] = {"images": int(len(known)), "unknown": int(len(hw) - len(known))}
    if not len(known):
        return out
    ratio = known[:, 1] / known[:, 0]
    names = np.array([float(w) / float(h) for w, h in (a.split(":") for a in ASPECTS)])
    nearest = np.argmin(np.abs(np.log(ratio)[:, None] - np.log(names)[None, :]), axis=1)
    counts = np.bincount(nearest, minlength=len(ASPECTS))
    order = sorted(np.flatnonzero(counts).tolist(), key=lambda k: (-counts[k], k))
    pixels = known[:, 0] * known[:, 1]
    out.update(ratio={"min": round(float(ratio.min()), 4), "median": round(float(np.median(ratio)), 4),
                      "max": round(float(ratio.max()), 4)},
               near={ASPECTS[k]: int(counts[k]) for k in order},
               pixels={"min": int(pixels.min()), "median": int(np.median(pixels)), "max": int(pixels.max())})
    return out


def aspect_lines(aspect: Mapping[str, Any] | None, path: str, fields: tuple[str, ...], foreign: bool) -> list[str]:
    """``info``'s ``aspect`` lines: the aspect-ratio distribution of the images, or, for a dataset of
    images packed without sizes, how to add them.

    Example:
        >>> print("\\n".join(aspect_lines(aspect_info(np.array([[480, 640], [600, 800], [500, 500]])), "ff",
        ...                               ("jpg",), False)))
          aspect     3 images, width/height 1.00-1.33 (median 1.33): 4:3 67%, 1:1 33%
          pixels     median 0.31 MP (0.25 MP-0.48 MP)
    """
    if aspect is None:
        if foreign or not any(is_image(f) or f == RAW_FIELD for f in fields):
            return []
        return [f"  aspect     not recorded (packed before image sizes were); `fastfeed shapes {path}` adds them"]
    unknown = f"; {aspect['unknown']} without a readable image" if aspect.get("unknown") else ""
    if not aspect.get("images"):
        return [f"  aspect     no image with a readable size{unknown}"]
    r, n = aspect["ratio"], aspect["images"]
    near = aspect["near"]
    shown = ", ".join(f"{name} {count / n:.0%}" for name, count in list(near.items())[:6])
    more = ", ..." if len(near) > 6 else ""
    px = aspect["pixels"]
    return [f"  aspect     {n} images, width/height {r['min']:.2f}-{r['max']:.2f} (median {r['median']:.2f}): "
            f"{shown}{more}{unknown}",
            f"  pixels     median {_pixels(px['median'])} ({_pixels(px['min'])}-{_pixels(px['max'])})"]


def _pixels(n: int) -> str:
    """A pixel count for ``info``: megapixels from 0.1 MP, else pixels."""
    return f"{n / 1e6:.2f} MP" if n >= 100_000 else f"{n:,} px"


def _per_class(labels: np.ndarray | None) -> dict[str, int] | None:
    """``{"min", "max"}`` samples over the classes that have samples (None: no labelled sample)."""
    if labels is None or not len(labels) or not (labels >= 0).any():
        return None
    per_class = np.bincount(labels[labels >= 0])
    nonzero = per_class[per_class > 0]
    return {"min": int(nonzero.min()), "max": int(nonzero.max())}


def _lengths_info(idx: DatasetIndex) -> dict[str, Any] | None:
    lengths = idx.lengths
    if lengths is None or not len(lengths):
        return None
    return {"field": idx.lengths_field, "min": int(lengths.min()), "max": int(lengths.max()),
            "mean": float(np.mean(lengths)), "median": float(np.median(lengths)), "total": int(lengths.sum())}


def _tokenizer_info(idx: DatasetIndex) -> dict[str, Any] | None:
    """The index's tokenizer entry plus ``total_tokens`` (lengths.npy holds the token counts of its field)."""
    if idx.tokenizer is None:
        return None
    lengths = idx.lengths
    return {**dict(idx.tokenizer), "total_tokens": None if lengths is None or not len(lengths)
            else int(lengths.sum())}


def _store_info(idx: DatasetIndex, total: int) -> dict[str, Any]:
    """How images are stored, and the disk that costs: ``{"mode": "jpeg"}``, or for raw pixels the
    index's ``store`` entry plus ``bytes`` (on disk) and ``bytes_as_jpeg`` (the same shards holding
    the image files the pixels were decoded from instead)."""
    if idx.store is None:
        return {"mode": "jpeg"}
    st = dict(idx.store)
    st["bytes"] = total
    st["bytes_as_jpeg"] = _bytes_as_jpeg(st, total)
    return st


def _bytes_as_jpeg(store: Mapping[str, Any], total: int) -> int:
    """The bytes of shards of ``total`` bytes if their raw pixels were the image files they were decoded from."""
    return total - int(store.get("raw_bytes", 0)) + int(store.get("encoded_bytes", 0))


def _span(r: Mapping[str, int]) -> str:
    """``{"min", "max"}`` as ``info`` writes it: ``8-9``, or ``8`` when they are equal."""
    return f"{r['min']}" if r["min"] == r["max"] else f"{r['min']}-{r['max']}"


#: Image file extensions under the name ``info`` gives their format.
_IMAGE_KINDS = {"jpg": "jpeg", "jpeg": "jpeg", "jpe": "jpeg", "jfif": "jpeg", "tif": "tiff"}


def image_kinds(fields: tuple[str, ...] | list[str]) -> list[str]:
    """The formats of a dataset's encoded image fields, sorted (``jpeg``, ``png``, ...); [] without images.

    Example:
        >>> image_kinds(["cls", "jpg", "seg.png"]), image_kinds(["txt", "json"]), image_kinds(["rgb8", "cls"])
        (['jpeg', 'png'], [], [])
    """
    return sorted({_IMAGE_KINDS.get(last_ext(f), last_ext(f)) for f in fields if is_image(f)})


def encoded_store_line(fields: tuple[str, ...] | list[str]) -> str:
    """The ``store`` line of ``info`` for a dataset packed as it was read (``pack --store jpeg``, the default):
    the formats of its images, or that it has none.

    Example:
        >>> encoded_store_line(["cls", "png"])
        'store      png (images as encoded files; `fastfeed pack --store raw` trades disk for CPU)'
        >>> print(encoded_store_line(["txt"]))
        store      no images (each field's bytes as packed)
    """
    kinds = image_kinds(fields)
    if not kinds:
        return "store      no images (each field's bytes as packed)"
    return f"store      {' + '.join(kinds)} (images as encoded files; `fastfeed pack --store raw` trades disk for CPU)"


def store_line(store: Mapping[str, Any], total: int) -> str:
    """The ``store`` line of ``fastfeed pack`` and ``info`` for raw or mixed storage (``pack --store``).

    Args:
        store: the index's ``store`` entry (``mode``, ``field``, ``share``, ``raw_samples``,
            ``raw_bytes``, ``encoded_bytes``).
        total: the bytes of all shards.

    Example:
        >>> print(store_line({"mode": "raw", "field": "rgb8", "raw_samples": 120, "raw_bytes": 40_000_000,
        ...                   "encoded_bytes": 3_000_000}, 41_200_000))
        store      raw pixels (rgb8): 120 image(s) as pixels, 41.2 MB on disk, ~4.2 MB as JPEG (9.8x)
    """
    as_jpeg = _bytes_as_jpeg(store, total)
    what = "raw pixels" if store.get("mode") == "raw" else f"mixed (share {store.get('share')} as pixels)"
    return (f"store      {what} ({store.get('field', 'rgb8')}): {store.get('raw_samples')} image(s) as pixels, "
            f"{format_bytes(total)} on disk, ~{format_bytes(as_jpeg)} as JPEG ({total / max(1, as_jpeg):.1f}x)")


def verify(dst: str | os.PathLike[str], *, workers: int | str = 1, decode: bool = True,
           progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check a packed dataset end to end (see the module doc); never raises on damage.

    Args:
        dst: the dataset folder.
        workers: processes checking shards in parallel (``"auto"``: one per usable core,
            :func:`fastfeed.host.cpu_count`).
        decode: decode every image (the slow part); False checks bytes only.
        progress: called with ``(shards_checked, shards_total)`` as shards finish.

    Example:
        >>> verify("/data/in-ff", workers="auto").ok   # doctest: +SKIP
        True
    """
    if workers == "auto":
        workers = cpu_count()
    if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"workers={workers!r}: must be an integer >= 1 or 'auto'")
    report = VerifyReport(path=str(dst), ok=False, decoded=decode)
    try:
        idx = open_checked(dst, on_error="skip")  # a damaged foreign tar: reported below, the rest checked
    except FastfeedError as e:
        report.problems.append(str(e))
        return report
    foreign = is_foreign(idx)
    arrays, report.problems = _sidecars(idx, foreign)
    offsets, labels, lengths, shapes, sums = (arrays.get(n) for n in (OFFSETS_NAME, LABELS_NAME, LENGTHS_NAME,
                                                                     SHAPES_NAME, CHECKSUMS_NAME))
    algorithm = str((idx.checksums or {}).get("algorithm", ""))
    if lengths is not None and (lengths < 0).any():
        report.problems.append(f"{dst}/{LENGTHS_NAME}: negative lengths; re-run `fastfeed pack --overwrite`")
    report.problems += _damaged_tars(idx) if foreign else _check_skipped(Path(dst), idx)
    starts = idx.shard_starts

    def rows(arr: np.ndarray | None, s: int) -> np.ndarray | None:
        return None if arr is None else np.asarray(arr[int(starts[s]):int(starts[s + 1])]).copy()

    jobs = [(idx.root if foreign else str(dst), idx.format, info_, rows(offsets, s), rows(labels, s), decode, foreign,
             rows(shapes, s), rows(sums, s), algorithm) for s, info_ in enumerate(idx.shards)]
    names = [str(Path(job[0]) / job[2].name) for job in jobs]

    def died(i: int, why: str) -> _Checked:
        return ([f"{names[i]}: the process checking it {why}; the shard is damaged in a way that crashes its "
                 "reader: restore it or re-pack (and report it: it should have been an error)"], [], 0, 0, 0)

    if workers > 1 and len(jobs) > 1:
        outcomes = run_isolated(_verify_shard, jobs, int(workers), died, lambda i: _reported(None, i, len(jobs), progress))
    else:
        outcomes = [_reported(_verify_shard(j), i, len(jobs), progress) for i, j in enumerate(jobs)]
    seen: dict[str, str] = {}
    for info_, (problems, keys, images, pixels, nbytes) in zip(idx.shards, outcomes):
        report.problems += problems
        report.shards += 1
        report.samples += len(keys)
        report.images += images
        report.pixels += pixels
        report.bytes += nbytes
        for k in keys:
            if k in seen:
                report.problems.append(f"{info_.name}: key {k!r} also in {seen[k]}; keys must be unique, "
                                       "re-run `fastfeed pack --overwrite`")
            else:
                seen[k] = info_.name
    report.ok = not report.problems
    return report


def _sidecars(idx: DatasetIndex, foreign: bool) -> tuple[dict[str, np.ndarray], list[str]]:
    """The usable sidecars and the problems found in them (foreign tars: the offsets of the scan)."""
    if foreign:
        return {OFFSETS_NAME: np.asarray(idx.offsets)}, []
    return verify_sidecars(idx)


def _reported(outcome: _T, i: int, total: int, progress: Callable[[int, int], None] | None) -> _T:
    if progress is not None:
        progress(i + 1, total)
    return outcome


def _damaged_tars(idx: DatasetIndex) -> list[str]:
    """The damage the scan of foreign tars found (hidden members left out are no damage)."""
    return [f"{d['path']}: {d['reason']}; re-download or repair the shard" for d in idx.skipped
            if not d.get("reason", "").startswith("hidden file")]


def _check_skipped(root: Path, idx: DatasetIndex) -> list[str]:
    path = root / SKIPPED_NAME
    if not idx.skipped:
        return []
    if not path.is_file():
        return [f"{path}: missing, but the index lists {len(idx.skipped)} skipped input(s); "
                "re-run `fastfeed pack` to restore it"]
    lines = [x for x in path.read_text("utf-8", "replace").splitlines() if x and not x.startswith("#")]
    if len(lines) != len(idx.skipped):
        return [f"{path}: lists {len(lines)} input(s), the index {len(idx.skipped)}; re-run `fastfeed pack`"]
    return []


_Job = tuple[str, str, ShardInfo, "np.ndarray | None", "np.ndarray | None", bool, bool, "np.ndarray | None",
             "np.ndarray | None", str]


#: What checking one shard found: (problems, keys in order, encoded images, images as pixels, bytes).
_Checked = tuple[list[str], list[str], int, int, int]


def _verify_shard(job: _Job) -> _Checked:
    """Check one shard: (problems, keys in order, encoded images (decoded when asked), images as pixels, bytes).

    A foreign tar (no fastfeed index) has no checksum or DALI index to compare: its
    members are read and its images decoded."""
    root, fmt, shard, offsets, labels, decode, foreign, shapes, sums, algorithm = job
    path = Path(root) / shard.name
    problems: list[str] = []

    def problem(text: str) -> None:
        if len(problems) < _MAX_PROBLEMS_PER_SHARD:
            problems.append(f"{path}: {text}")
        elif len(problems) == _MAX_PROBLEMS_PER_SHARD:
            problems.append(f"{path}: more problems not shown")

    if not path.is_file():
        problem("missing; restore it or re-run `fastfeed pack --overwrite`")
        return problems, [], 0, 0, 0
    size = path.stat().st_size
    if size != shard.bytes:
        problem(f"{size} bytes, the index says {shard.bytes}; the shard is damaged, restore it or re-pack")
    if not foreign and _sha256(path) != shard.sha256:
        problem("sha256 differs from the index; the shard is damaged, restore it or re-pack")
    keys: list[str] = []
    images = pixels = 0
    fix = _decode_fix(foreign)
    try:
        tar = open_shard(str(path)) if foreign and is_gzip_tar(path.name) else path
        locations = _locations(tar, fmt)
        for i, sample in enumerate(_read_samples(tar, fmt)):
            key = sample["__key__"]
            keys.append(key)
            loc = (i, 0) if locations is None else locations[i] if i < len(locations) else None
            if offsets is not None and i < len(offsets) and tuple(int(x) for x in offsets[i]) != loc:
                problem(f"sample {key!r}: offsets.npy says {tuple(int(x) for x in offsets[i])}, the shard "
                        f"{loc}; re-pack")
            if labels is not None and i < len(labels) and "cls" in sample:
                cls = _int_or_none(sample["cls"])
                if cls is not None and cls != labels[i]:
                    problem(f"sample {key!r}: cls member {cls} but labels.npy says {labels[i]}; re-pack")
            if shapes is not None or RAW_FIELD in sample:
                pixels += _check_pixels(sample, None if shapes is None or i >= len(shapes) else shapes[i], problem)
            for name, data in sample.items():
                if name != "__key__" and is_image(name):
                    images += 1
                    err = decode_error(data) if decode else None
                    if err is not None:
                        problem(f"sample {key!r} field {name!r}: image does not decode ({err}); "
                                + fix.format(member=f"{key}.{name}"))
    except (FastfeedError, tarfile.TarError, OSError) as e:
        problem(f"cannot be read after {len(keys)} samples ({e}); restore it or re-pack")
        _check_sums(path, fmt, offsets, sums, algorithm, keys, problem, quiet=True)  # which samples are damaged
        return problems, keys, images, pixels, size
    _check_sums(path, fmt, offsets, sums, algorithm, keys, problem)
    if len(keys) != shard.samples:
        problem(f"holds {len(keys)} samples, the index says {shard.samples}; re-pack")
    if fmt == "tar" and not foreign:
        for text in _check_dali_index(Path(root), shard, path):
            problem(text)
    return problems, keys, images, pixels, size


def _check_sums(path: Path, fmt: str, offsets: np.ndarray | None, sums: np.ndarray | None, algorithm: str,
                keys: list[str], problem: Callable[[str], None], quiet: bool = False) -> None:
    """Every sample against ``checksums.npy`` (when the index has it); ``quiet``: a shard that
    cannot be read was reported already."""
    if sums is None or offsets is None:
        return
    try:
        sample_problems(str(path), fmt, offsets, sums, algorithm, keys, problem)
    except (FastfeedError, OSError) as e:
        if not quiet:
            problem(f"samples not checked against checksums.npy ({e}); restore it or re-pack")


def _check_pixels(sample: dict[str, Any], shape: np.ndarray | None, problem: Callable[[str], None]) -> int:
    """Check a sample's raw pixels against its row of ``shapes.npy``; returns 1 when it holds pixels."""
    key, data = sample["__key__"], sample.get(RAW_FIELD)
    if shape is None:
        problem(f"sample {key!r}: field {RAW_FIELD} (raw pixels) but the index has no shapes.npy; re-pack")
        return 1
    h, w = int(shape[0]), int(shape[1])
    if data is None:
        if h or w:
            problem(f"sample {key!r}: shapes.npy says {h}x{w} pixels but it has no field {RAW_FIELD}; re-pack")
        return 0
    if len(data) != 3 * h * w or not h * w:
        problem(f"sample {key!r}: field {RAW_FIELD} holds {len(data)} bytes, its shape {h}x{w} (shapes.npy) needs "
                f"{3 * h * w}; the shard is damaged or does not match its index: restore it or re-pack")
    return 1


def _decode_fix(foreign: bool) -> str:
    """What to do about an image that does not decode: where its source is, and the fix."""
    if foreign:
        return ("the member {member} of this tar is damaged: re-create the tar from its source, or convert "
                "the set with `fastfeed pack --on-error skip` to leave it out")
    return ("its source file ({member} under the packed SRC, the key being its path there) was damaged before "
            "packing: replace it and re-run `fastfeed pack --overwrite`, or re-pack with --on-error skip "
            "to leave it out")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _read_samples(path: Path | str | Any, fmt: str) -> Any:
    reader = FORMATS[fmt][1](path)
    try:
        yield from reader
    finally:
        reader.close()


def _locations(path: Path | str | Any, fmt: str) -> list[tuple[int, int]] | None:
    """Tar: (offset, span) of every sample from its headers; LMDB: None (record numbers)."""
    if fmt == "lmdb":
        return None
    spans = scan_tar(path).spans
    if not isinstance(path, (str, Path)):
        path.seek(0)
    return spans


def _int_or_none(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def _tar_members(path: Path) -> list[list[tuple[str, int, int, str]]]:
    """Per sample, its members as (ext, data offset, size, name), the way DALI indexes them."""
    samples: list[list[tuple[str, int, int, str]]] = []
    last = None
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            parts = split_key(m.name) if m.isreg() else None
            if parts is None:
                continue
            if parts[0] != last:
                samples.append([])
                last = parts[0]
            samples[-1].append((m.name.split("/")[-1].split(".", 1)[1], m.offset_data, m.size, m.name))
    return samples


def _check_dali_index(root: Path, shard: ShardInfo, path: Path) -> list[str]:
    if not shard.dali_index:
        return ["no DALI index recorded; re-run `fastfeed pack --overwrite` to add it"]
    idx_path = root / shard.dali_index
    try:
        lines = idx_path.read_text("utf-8").splitlines()
        version, count = lines[0].split()
        if version not in ("v1.1", "v1.2"):
            return [f"{idx_path.name}: unknown DALI index version {version!r}; re-pack"]
        width = 4 if version == "v1.2" else 3
        entries = []
        for line in lines[1:]:
            tok = line.split()
            entries.append([(tok[j], int(tok[j + 1]), int(tok[j + 2])) for j in range(0, len(tok), width)])
    except (OSError, ValueError, IndexError) as e:
        return [f"{idx_path.name}: unreadable DALI index ({e}); re-run `fastfeed pack --overwrite`"]
    members = [[(ext, off, size) for ext, off, size, _ in s] for s in _tar_members(path)]
    if int(count) != len(entries) or entries != members:
        return [f"{idx_path.name}: does not match the members of {shard.name}; re-run `fastfeed pack --overwrite`"]
    return []
