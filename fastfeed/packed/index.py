"""The versioned dataset index: the contract between ``pack``, ``tune`` and ``loader``.

A packed dataset is a folder (or an object-store prefix) holding shards plus::

    index.json      written last and atomically; the dataset is complete iff it exists
    offsets.npy     int64 (N, 2): per sample, the byte offset of its first tar header in
                    its shard and the byte size of the whole sample span (tar), or the
                    record number and 0 (LMDB)
    labels.npy      int64 (N,), optional: class index per sample (-1 when none)
    lengths.npy     int64 (N,), optional: per-sample length (``pack --length``)
    shapes.npy      int32 (N, 2), with ``pack --store raw|mixed:P`` only: per sample the (height,
                    width) of its raw pixels (field ``rgb8``), (0, 0) for a sample stored as JPEG
    checksums.npy   uint64 (N,): per sample, the checksum of the bytes its reader reads
                    (:mod:`fastfeed.formats.checksum`)
    sizes.npy       int32 (N, 2), optional: per sample the displayed (height, width) of its image
                    (EXIF orientation applied, read from the header), (0, 0) when it has none

``index.json``'s ``checksums`` entry names the per-sample algorithm and the sha256 of every
sidecar file: a sidecar is checked against it when it is opened, and the loader checks every
sample against ``checksums.npy`` when it reads it. An index without the entry (written before
it existed) loads as before, unchecked. Every sidecar is also checked on its own terms when it
is opened (:mod:`fastfeed.packed.sidecars`: dtypes, shapes, labels within the classes, offsets
in order and inside their shards).

``index.json``'s optional ``sizes`` entry (``{"samples": "sizes.npy", "unknown": K}``) says that
``sizes.npy`` holds every sample's image size, what the aspect-ratio sampler buckets by
(:mod:`fastfeed.sampling.aspect`); ``K`` samples have none (no image, or a header that could not
be read). ``pack`` writes it; ``fastfeed shapes DST`` adds it to a dataset packed before it
existed, without re-packing. Like ``checksums``, it does not change the index version: an older
fastfeed ignores it, and sizes are not part of the :attr:`~DatasetIndex.fingerprint`.

``index.json``'s optional ``outside`` entry (``{"files": N, "roots": [folders]}``) says that ``N``
files came from outside the source (``pack --allow-outside``: symlinks out of SRC, absolute or
``../`` paths of a manifest) and names at most 8 folders that hold them; an index without it packed
nothing from outside its source (or predates the entry).

A dataset whose images are stored as pixels has a ``"store"`` entry in ``index.json`` and
index version 2 (:data:`INDEX_VERSION`), so a fastfeed that predates raw pixels refuses it with
:class:`~fastfeed.errors.IndexVersionError` instead of misreading it; datasets of encoded
images keep writing version 1 (:data:`JPEG_INDEX_VERSION`), which every fastfeed reads.

``index.json`` holds the format version, the shard format, the fastfeed version, the
sample count, the fields (extensions), class names, per shard its file name, sample
count, byte size and sha256 (and the DALI index file for tar), the pack options that
identify the job, and the skipped inputs. Global sample ``i`` lives in shard ``s``
where ``shard_starts[s] <= i < shard_starts[s + 1]``; samples are numbered shard by
shard in file order. Sidecar arrays are plain ``.npy`` files, loaded lazily (memory
mapped when local).

Example:
    >>> idx = DatasetIndex.load("/data/imagenet-packed")      # doctest: +SKIP
    >>> idx.num_samples, idx.format, len(idx.shards)          # doctest: +SKIP
    (1281167, 'tar', 5005)
    >>> shard, offset, size = idx.locate(12345)               # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fastfeed.errors import ConfigError, IndexMismatchError, IndexVersionError
from fastfeed.packed.layout import (
    CHECKSUMS_NAME,
    INDEX_NAME,
    LABELS_NAME,
    LENGTHS_NAME,
    OFFSETS_NAME,
    SHAPES_NAME,
    SIZES_NAME,
)
from fastfeed.packed.sidecars import Layout, check_hash, check_sidecar, load_npy, npy_bytes, sha256_hex
from fastfeed.storage.remote import exists, is_url, read_bytes

__all__ = [
    "INDEX_NAME",
    "INDEX_VERSION",
    "JPEG_INDEX_VERSION",
    "READ_VERSIONS",
    "DatasetIndex",
    "ShardInfo",
    "atomic_write_bytes",
]

#: The newest index version: 2 adds images stored as pixels (``"store"``, ``shapes.npy``).
INDEX_VERSION = 2
#: The version written for datasets without raw pixels (unchanged, so older fastfeeds still read them).
JPEG_INDEX_VERSION = 1
#: The versions this fastfeed reads.
READ_VERSIONS = (1, 2)
FORMATS = ("tar", "lmdb")


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the index records it.

    Attributes:
        name: file name relative to the dataset root (``shard-000000.tar``).
        samples: number of samples in the shard.
        bytes: size of the shard file in bytes.
        sha256: hex digest of the shard file.
        dali_index: name of DALI's index file for this shard (tar only), or None.
    """

    name: str
    samples: int
    bytes: int
    sha256: str
    dali_index: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }
        if self.dali_index is not None:
            d["dali_index"] = self.dali_index
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ShardInfo":
        return cls(
            name=str(d["name"]),
            samples=int(d["samples"]),
            bytes=int(d["bytes"]),
            sha256=str(d["sha256"]),
            dali_index=d.get("dali_index"),
        )


@dataclass(frozen=True)
class DatasetIndex:
    """A loaded (or about to be written) dataset index.

    Arrays are attached with :meth:`with_arrays` before :meth:`save`, and read lazily
    from the sidecar files after :meth:`load`.
    """

    format: str
    num_samples: int
    shards: tuple[ShardInfo, ...]
    fields: tuple[str, ...] = ()
    classes: tuple[str, ...] | None = None
    input: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    skipped: tuple[Mapping[str, str], ...] = ()
    lengths_field: str | None = None
    #: ``pack --tokenizer``: ``{"sha256", "vocab_size", "pad_id", "dtype", "field", "tokens"}``
    #: (``pad_id`` is the loader's default padding value; ``tokens`` the field of stored ids or None).
    tokenizer: Mapping[str, Any] | None = None
    #: ``pack --store raw|mixed:P``: ``{"mode": "raw"|"mixed", "share", "field", "raw_samples",
    #: "raw_bytes", "encoded_bytes"}`` (see :mod:`fastfeed.packing.content.pixels`); None: encoded images only.
    store: Mapping[str, Any] | None = None
    #: ``{"algorithm", "samples": "checksums.npy", "sidecars": {file name: sha256}}``: how each sample's
    #: bytes are checked on read and every sidecar's hash; None for an index written before checksums.
    checksums: Mapping[str, Any] | None = None
    #: ``{"samples": "sizes.npy", "unknown"}``: every sample's displayed image size is in ``sizes.npy``
    #: (``unknown`` of them (0, 0)); None for an index without sizes (``fastfeed shapes DST`` adds them).
    sizes: Mapping[str, Any] | None = None
    #: ``pack --allow-outside``: ``{"files": N, "roots": [folders]}``, the files packed from outside the
    #: source and at most 8 folders holding them; None when none were.
    outside: Mapping[str, Any] | None = None
    has_labels: bool = False
    version: int = JPEG_INDEX_VERSION
    fastfeed_version: str = ""
    root: str = ""
    #: fsspec options (endpoint, credentials) for a remote ``root``; used to read the sidecars.
    storage_options: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ derived
    @property
    def shard_counts(self) -> np.ndarray:
        """Samples per shard, int64 (S,)."""
        return np.array([s.samples for s in self.shards], dtype=np.int64)

    @property
    def shard_starts(self) -> np.ndarray:
        """Global index of each shard's first sample, int64 (S + 1,) with N last."""
        return np.concatenate([[0], np.cumsum(self.shard_counts)]).astype(np.int64)

    def shard_of(self, i: int | np.ndarray) -> np.ndarray | int:
        """Shard number holding global sample ``i`` (vectorised)."""
        return np.searchsorted(self.shard_starts, i, side="right") - 1

    @property
    def offsets(self) -> np.ndarray:
        """int64 (N, 2): per sample (offset, size) inside its shard."""
        return self._array(OFFSETS_NAME)

    @property
    def labels(self) -> np.ndarray | None:
        """int64 (N,) class index per sample, or None when the dataset has no labels."""
        return self._array(LABELS_NAME) if self.has_labels else None

    @property
    def lengths(self) -> np.ndarray | None:
        """int64 (N,) per-sample lengths recorded by ``pack --length``, or None."""
        return self._array(LENGTHS_NAME) if self.lengths_field else None

    @property
    def shapes(self) -> np.ndarray | None:
        """int32 (N, 2) (height, width) of each sample's raw pixels ((0, 0): stored encoded), or
        None when the dataset stores no pixels (``pack --store jpeg``)."""
        return self._array(SHAPES_NAME) if self.store is not None else None

    @property
    def image_sizes(self) -> np.ndarray | None:
        """int32 (N, 2): the displayed (height, width) of each sample's image, EXIF orientation
        applied ((0, 0): none, or an unreadable header), or None when the index records no sizes
        (``fastfeed shapes DST`` adds them)."""
        return self._array(SIZES_NAME) if self.sizes is not None else None

    @property
    def sample_checksums(self) -> np.ndarray | None:
        """uint64 (N,) checksum of each sample's bytes (algorithm: ``checksums["algorithm"]``), or
        None for an index written before checksums."""
        return self._array(CHECKSUMS_NAME) if self.checksums is not None else None

    def locate(self, i: int) -> tuple[int, int, int]:
        """Return (shard number, offset, size) of global sample ``i``."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range for {self.num_samples} samples")
        s = int(self.shard_of(i))
        off, size = self.offsets[i]
        return s, int(off), int(size)

    def shard_path(self, s: int) -> str:
        """Path or URL of shard ``s`` (root joined with its name)."""
        return join(self.root, self.shards[s].name)

    @property
    def fingerprint(self) -> str:
        """Short stable hash of what identifies the data (shards and counts)."""
        h = hashlib.sha256()
        h.update(self.format.encode())
        for s in self.shards:
            h.update(f"{s.name}:{s.samples}:{s.bytes}:{s.sha256};".encode())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ arrays
    def with_arrays(
        self,
        *,
        offsets: np.ndarray,
        labels: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        shapes: np.ndarray | None = None,
        checksums: np.ndarray | None = None,
        algorithm: str | None = None,
        sizes: np.ndarray | None = None,
    ) -> "DatasetIndex":
        """Return a copy holding the given sidecar arrays (for :meth:`save`).

        With ``sizes`` (per sample the displayed image (height, width), (0, 0) for none) the
        copy has a :attr:`sizes` entry.

        With ``checksums`` (per sample, of ``algorithm``: what ``pack`` writes) the copy's
        :attr:`checksums` entry also records the sha256 of every sidecar file :meth:`save`
        writes; without, it has none (an index as written before checksums).
        """
        arrays = {OFFSETS_NAME: np.asarray(offsets, dtype=np.int64).reshape(-1, 2)}
        if shapes is not None:
            arrays[SHAPES_NAME] = np.asarray(shapes, dtype=np.int32).reshape(-1, 2)
        if labels is not None:
            arrays[LABELS_NAME] = np.asarray(labels, dtype=np.int64)
        if lengths is not None:
            arrays[LENGTHS_NAME] = np.asarray(lengths, dtype=np.int64)
        sizes_entry = None
        if sizes is not None:
            arrays[SIZES_NAME] = np.asarray(sizes, dtype=np.int32).reshape(-1, 2)
            sizes_entry = _sizes_entry(arrays[SIZES_NAME])
        entry = None
        if checksums is not None:
            if algorithm is None:
                raise ValueError("with_arrays(checksums=...) needs the algorithm that made them")
            arrays[CHECKSUMS_NAME] = np.asarray(checksums, dtype=np.uint64).reshape(-1)
            entry = {"algorithm": algorithm, "samples": CHECKSUMS_NAME,
                     "sidecars": {name: sha256_hex(npy_bytes(arr)) for name, arr in sorted(arrays.items())}}
        return replace(self, _arrays=arrays, has_labels=labels is not None, checksums=entry, sizes=sizes_entry)

    def with_sizes(self, sizes: np.ndarray) -> "DatasetIndex":
        """Return a copy that records ``sizes`` (int (N, 2): per sample the displayed image
        (height, width), (0, 0) for none), for an index that is already written:
        :meth:`save` then writes ``sizes.npy`` and ``index.json`` only (what ``fastfeed shapes``
        does); the ``checksums`` entry gains the new file's sha256.

        Raises:
            IndexMismatchError: ``sizes`` does not have one (height, width) row per sample.

        Example:
            >>> idx = DatasetIndex("tar", 2, (ShardInfo("shard-000000.tar", 2, 4096, "0" * 64),))
            >>> idx.with_sizes(np.array([[48, 64], [0, 0]])).sizes
            {'samples': 'sizes.npy', 'unknown': 1}
        """
        arr = np.asarray(sizes)
        if arr.ndim != 2 or arr.shape != (self.num_samples, 2) or arr.dtype.kind not in "iu" or (arr < 0).any():
            raise IndexMismatchError(f"{self.root or 'index'}: sizes of shape {arr.shape} ({arr.dtype}); the index "
                                     f"needs non-negative integers ({self.num_samples}, 2), one (height, width) per "
                                     "sample")
        arr = np.ascontiguousarray(arr, dtype=np.int32)
        entry = self.checksums
        if entry is not None:
            entry = {**dict(entry), "sidecars": {**dict(entry.get("sidecars") or {}),
                                                 SIZES_NAME: sha256_hex(npy_bytes(arr))}}
        return replace(self, _arrays={SIZES_NAME: arr}, sizes=_sizes_entry(arr), checksums=entry)

    def with_sidecars(self, files: Mapping[str, bytes]) -> "DatasetIndex":
        """Return a copy holding the sidecars read from ``files`` (file name -> the file's bytes),
        each checked as when it is opened (its recorded sha256, dtype, shape, rows).

        Raises:
            IndexMismatchError: a sidecar that does not match the index.
        """
        out = replace(self, _arrays={})
        for name, data in files.items():
            out._arrays[name] = out._checked(join(self.root, name), *load_npy(join(self.root, name), data))
        return out

    def _array(self, name: str) -> np.ndarray:
        arr = self._arrays.get(name)
        if arr is None:
            path = join(self.root, name)
            try:
                if is_url(path):
                    loaded = load_npy(path, read_bytes(path, storage_options=self.storage_options))
                else:
                    loaded = load_npy(path, mmap=True)
            except FileNotFoundError:
                raise IndexMismatchError(
                    f"{path}: sidecar of {join(self.root, INDEX_NAME)} is missing; "
                    "re-run `fastfeed pack` to rebuild the dataset"
                ) from None
            arr = self._arrays[name] = self._checked(path, *loaded)
        return arr

    def _checked(self, path: str, arr: np.ndarray, sha: str) -> np.ndarray:
        """A sidecar just read, checked against the sha256 the index recorded and on its own terms."""
        if self.checksums is not None:
            check_hash(path, sha, dict(self.checksums.get("sidecars") or {}).get(os.path.basename(path)), INDEX_NAME)
        check_sidecar(path, arr, self.layout)
        return arr

    @property
    def layout(self) -> Layout:
        """What a sidecar is checked against (:class:`~fastfeed.packed.sidecars.Layout`)."""
        return Layout(self.num_samples, self.format, [s.samples for s in self.shards], [s.bytes for s in self.shards],
                      self.classes, [s.name for s in self.shards])

    # ------------------------------------------------------------------ I/O
    def to_json(self) -> dict[str, Any]:
        return {
            "fastfeed_index": INDEX_VERSION if self.store is not None else JPEG_INDEX_VERSION,
            "format": self.format,
            "fastfeed_version": self.fastfeed_version,
            "num_samples": self.num_samples,
            "input": self.input,
            "fields": list(self.fields),
            "classes": None if self.classes is None else list(self.classes),
            "has_labels": self.has_labels,
            "lengths_field": self.lengths_field,
            "arrays": sorted(set(self._arrays) | set(self._array_names())),
            "options": dict(self.options),
            "num_skipped": len(self.skipped),
            "skipped": [dict(s) for s in self.skipped],
            "shards": [s.to_json() for s in self.shards],
            **({"tokenizer": dict(self.tokenizer)} if self.tokenizer is not None else {}),
            **({"store": dict(self.store)} if self.store is not None else {}),
            **({"checksums": _plain(self.checksums)} if self.checksums is not None else {}),
            **({"sizes": dict(self.sizes)} if self.sizes is not None else {}),
            **({"outside": {"files": int(self.outside["files"]), "roots": list(self.outside["roots"])}}
               if self.outside is not None else {}),
        }

    def _array_names(self) -> list[str]:
        names = [OFFSETS_NAME]
        if self.has_labels:
            names.append(LABELS_NAME)
        if self.lengths_field:
            names.append(LENGTHS_NAME)
        if self.store is not None:
            names.append(SHAPES_NAME)
        if self.checksums is not None:
            names.append(CHECKSUMS_NAME)
        if self.sizes is not None:
            names.append(SIZES_NAME)
        return sorted(names)

    def save(self, root: str | os.PathLike[str]) -> Path:
        """Write the sidecar arrays, then ``index.json`` atomically (last).

        Returns the path of ``index.json``.
        """
        root = Path(root)
        for name, arr in sorted(self._arrays.items()):
            atomic_write_bytes(root / name, npy_bytes(arr))  # the bytes with_arrays hashed
        text = json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"
        out = root / INDEX_NAME
        atomic_write_bytes(out, text.encode("utf-8"))
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], root: str = "") -> "DatasetIndex":
        where = join(root, INDEX_NAME) if root else INDEX_NAME
        version = d.get("fastfeed_index")
        if version not in READ_VERSIONS:
            raise IndexVersionError(
                f"{where}: index format version {version!r}, this fastfeed reads versions "
                f"{', '.join(map(str, READ_VERSIONS))}; re-pack with `fastfeed pack --overwrite` or install the "
                "fastfeed version that wrote it"
            )
        store = d.get("store")
        if (store is not None) != (version >= 2):
            raise IndexMismatchError(f"{where}: index version {version} {'without' if store is None else 'with'} "
                                     "a \"store\" entry; the index is corrupt, re-run `fastfeed pack`")
        fmt = d.get("format")
        if fmt not in FORMATS:
            raise IndexMismatchError(f"{where}: unknown shard format {fmt!r} (expected tar or lmdb)")
        shards = tuple(ShardInfo.from_json(s) for s in d["shards"])
        idx = cls(
            format=fmt,
            num_samples=int(d["num_samples"]),
            shards=shards,
            fields=tuple(d.get("fields", ())),
            classes=None if d.get("classes") is None else tuple(d["classes"]),
            input=d.get("input", ""),
            options=dict(d.get("options", {})),
            skipped=tuple(d.get("skipped", ())),
            lengths_field=d.get("lengths_field"),
            tokenizer=None if d.get("tokenizer") is None else dict(d["tokenizer"]),
            store=None if store is None else dict(store),
            checksums=_checksums_entry(d.get("checksums"), where),
            sizes=_read_sizes_entry(d.get("sizes"), where),
            outside=_outside_entry(d.get("outside"), where),
            has_labels=bool(d.get("has_labels", False)),
            version=int(version),
            fastfeed_version=str(d.get("fastfeed_version", "")),
            root=root,
        )
        total = sum(s.samples for s in shards)
        if total != idx.num_samples:
            raise IndexMismatchError(
                f"{where}: shards hold {total} samples but num_samples is {idx.num_samples}; "
                "the index is corrupt, re-run `fastfeed pack`"
            )
        return idx

    @classmethod
    def load(
        cls, root: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
    ) -> "DatasetIndex":
        """Load the index of the dataset at ``root`` (a folder or an fsspec URL).

        ``storage_options`` (endpoint, credentials) are passed to fsspec for a URL and
        kept for reading the sidecar arrays later.
        """
        root_s = str(root).rstrip("/") if is_url(root) else str(Path(root))
        path = join(root_s, INDEX_NAME)
        try:
            if is_url(root_s):
                raw = read_bytes(path, storage_options=storage_options)
            else:
                raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise IndexMismatchError(
                f"{path}: no index; the dataset is not packed or its packing did not finish. "
                "Run (or re-run) `fastfeed pack SRC DST` to complete it"
            ) from None
        except OSError as e:  # a local name too long, a folder refused: the path given is the one to fix
            if is_url(root_s):
                raise
            raise ConfigError(f"{path}: cannot be read ({e.strerror or e}); check the path") from None
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as e:
            raise IndexMismatchError(f"{path}: not valid JSON ({e}); re-run `fastfeed pack`") from None
        return replace(cls.from_json(d, root=root_s), storage_options=storage_options)

    @staticmethod
    def exists(root: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> bool:
        """True when ``root`` holds a complete dataset (its index exists)."""
        if is_url(root):
            return exists(join(str(root), INDEX_NAME), storage_options=storage_options)
        try:
            return (Path(root) / INDEX_NAME).is_file()
        except OSError:  # a name too long, say: no dataset there (its opening says what is wrong)
            return False


def _plain(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The ``checksums`` entry as JSON-ready dicts."""
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in entry.items()}


def _checksums_entry(entry: Any, where: str) -> dict[str, Any] | None:
    """The ``checksums`` entry of ``index.json`` (None: an index written before checksums), checked for shape."""
    if entry is None:
        return None
    if (not isinstance(entry, Mapping) or not isinstance(entry.get("algorithm"), str)
            or not isinstance(entry.get("sidecars"), Mapping)):
        raise IndexMismatchError(f"{where}: its \"checksums\" entry is not {{\"algorithm\", \"samples\", "
                                 "\"sidecars\"}}; the index is damaged, re-run `fastfeed pack`")
    return {"algorithm": entry["algorithm"], "samples": str(entry.get("samples", CHECKSUMS_NAME)),
            "sidecars": {str(k): str(v) for k, v in entry["sidecars"].items()}}


def _sizes_entry(sizes: np.ndarray) -> dict[str, Any]:
    """The ``sizes`` entry of ``index.json`` for ``sizes.npy`` holding ``sizes``."""
    return {"samples": SIZES_NAME, "unknown": int(np.count_nonzero(sizes[:, 0] == 0)) if len(sizes) else 0}


def _read_sizes_entry(entry: Any, where: str) -> dict[str, Any] | None:
    """The ``sizes`` entry of ``index.json`` (None: an index without sizes), checked for shape."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or entry.get("samples") != SIZES_NAME:
        raise IndexMismatchError(f"{where}: its \"sizes\" entry is not {{\"samples\": \"{SIZES_NAME}\", "
                                 "\"unknown\"}; the index is damaged, run `fastfeed shapes DST --overwrite`")
    return {"samples": SIZES_NAME, "unknown": int(entry.get("unknown", 0))}


def _outside_entry(entry: Any, where: str) -> dict[str, Any] | None:
    """The ``outside`` entry of ``index.json`` (None: nothing came from outside the source), checked for shape."""
    if entry is None:
        return None
    if (not isinstance(entry, Mapping) or not isinstance(entry.get("files"), int) or entry["files"] < 0
            or not isinstance(entry.get("roots"), list) or not all(isinstance(r, str) for r in entry["roots"])):
        raise IndexMismatchError(f"{where}: its \"outside\" entry is not {{\"files\": N, \"roots\": [folders]}}; "
                                 "the index is damaged, re-run `fastfeed pack`")
    return {"files": int(entry["files"]), "roots": [str(r) for r in entry["roots"]]}


def join(root: str, name: str) -> str:
    """Join a dataset root (path or URL) and a relative name."""
    if not root:
        return name
    if is_url(root):
        return root.rstrip("/") + "/" + name
    return os.path.join(root, name)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # a full disk, say: leave no temporary behind, and name it
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(tmp)
        raise


def shard_sample_ranges(counts: Sequence[int]) -> list[range]:
    """Global sample ranges of shards with the given counts."""
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [range(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
