"""``fastfeed info``: what a packed dataset holds, read from its index and sidecars (never the shards).

:func:`info` builds an :class:`InfoReport` (printed as :meth:`~InfoReport.text`, what ``fastfeed
info`` shows, and :meth:`~InfoReport.to_json`, what it shows with ``--json``); the helpers here
(:func:`open_checked`, the store and aspect-ratio lines) are shared with
:func:`fastfeed.packed.checks.verify`, which re-exports this module's public names.

Example:
    >>> info("/data/in-ff").num_samples   # doctest: +SKIP
    1281167
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastfeed._util import format_bytes
from fastfeed.errors import ConfigError
from fastfeed.formats.naming import RAW_FIELD, is_image, last_ext
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import resolve_index

__all__ = ["ASPECTS", "FOREIGN_NOTE", "InfoReport", "aspect_info", "aspect_lines", "check_path", "encoded_store_line",
           "image_kinds", "info", "is_foreign", "open_checked", "store_line"]


FOREIGN_NOTE = ("WebDataset tars without a fastfeed index (indexed in memory, as fastfeed.loader() reads them); "
                "`fastfeed pack {src} DST` converts them once into a packed dataset with an index (checksums, "
                "labels, DALI index files, a faster start)")


def open_checked(dst: str | os.PathLike[str], *, on_error: str = "raise") -> DatasetIndex:
    """The index of ``dst``: a packed dataset's, or, for a folder of WebDataset tars without
    one, the in-memory index the loader builds (:func:`~fastfeed.packed.reader.resolve_index`).

    Raises:
        FastfeedError: neither (the error of the missing index), or a damaged tar (``raise``).
    """
    check_path(dst)
    if DatasetIndex.exists(dst):
        return DatasetIndex.load(dst)
    try:
        return resolve_index(dst, on_error=on_error)
    except ConfigError:  # no tars there either: say what a packed dataset lacks
        return DatasetIndex.load(dst)


def check_path(dst: Any, name: str = "dst") -> None:
    """Refuse what cannot be a dataset's folder or URL (None, a number, a list) with a ConfigError."""
    if not isinstance(dst, (str, os.PathLike)) or not os.fspath(dst):
        raise ConfigError(f"{name}={dst!r}: give the folder (or URL) of a packed dataset, e.g. 'train-ff'")


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
