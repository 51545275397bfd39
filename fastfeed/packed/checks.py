"""``fastfeed info`` and ``fastfeed verify``: what a packed dataset holds, and is it intact.

:func:`verify` checks everything a reader relies on: the index loads, every shard exists
with its recorded size and sha256, every sample parses and its key is unique, the
offsets in ``offsets.npy`` point at the samples (tar) or records (LMDB), each tar's DALI
index matches its members, labels match the ``cls`` members, lengths and ``skipped.txt``
agree with the index, every image decodes, and every image stored as pixels (``rgb8``,
``pack --store raw``) has the bytes its shape in ``shapes.npy`` says. It collects problems instead of stopping
at the first one.

Example:
    >>> report = verify("/data/in-ff", workers=4)   # doctest: +SKIP
    >>> report.ok, report.samples, report.problems[:1]  # doctest: +SKIP
    (True, 1281167, [])
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from fastfeed.errors import ConfigError, FastfeedError
from fastfeed.formats import FORMATS
from fastfeed.formats.images import decode_error
from fastfeed.formats.naming import RAW_FIELD, is_image, split_key
from fastfeed.formats.wds import scan_tar
from fastfeed.host import cpu_count
from fastfeed.packed.index import DatasetIndex, ShardInfo
from fastfeed.packed.layout import LENGTHS_NAME, SKIPPED_NAME
from fastfeed.packed.reader import resolve_index
from fastfeed.storage.remote import is_gzip_tar, open_shard

__all__ = ["VerifyReport", "info", "verify"]

_MAX_PROBLEMS_PER_SHARD = 50
_T = TypeVar("_T")


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        path: the dataset folder.
        ok: True when no problem was found.
        problems: one line per problem, naming the file or shard and what to do.
        shards, samples, images, bytes: what was checked.
    """

    path: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    shards: int = 0
    samples: int = 0
    images: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


def info(dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarise a packed dataset (from its index and sidecars; shards are not read), or a
    folder of WebDataset tars (from their member headers; ``foreign`` is True).

    Example:
        >>> info("/data/in-ff")["num_samples"]   # doctest: +SKIP
        1281167
    """
    idx = open_checked(dst)
    counts = idx.shard_counts
    sizes = np.array([s.bytes for s in idx.shards], dtype=np.int64)
    out: dict[str, Any] = {
        "path": str(dst),
        "format": idx.format,
        "input": idx.input,
        "num_samples": idx.num_samples,
        "num_shards": len(idx.shards),
        "bytes": int(sizes.sum()),
        "samples_per_shard": {"min": int(counts.min()), "max": int(counts.max())},
        "shard_bytes": {"min": int(sizes.min()), "max": int(sizes.max()), "mean": int(sizes.mean())},
        "fields": list(idx.fields),
        "num_classes": None if idx.classes is None else len(idx.classes),
        "classes": None if idx.classes is None else list(idx.classes),
        "has_labels": idx.has_labels,
        "dali_index": all(s.dali_index for s in idx.shards) if idx.format == "tar" else False,
        "num_skipped": len(idx.skipped),
        "lengths": None,
        "options": dict(idx.options),
        "fastfeed_version": idx.fastfeed_version,
        "index_version": idx.version,
        "fingerprint": idx.fingerprint,
        "foreign": is_foreign(idx),
        "store": _store_info(idx, int(sizes.sum())),
    }
    if out["foreign"]:
        out["note"] = FOREIGN_NOTE.format(src=dst)
    labels = idx.labels
    if labels is not None and len(labels):
        per_class = np.bincount(labels[labels >= 0]) if (labels >= 0).any() else np.zeros(0, np.int64)
        nonzero = per_class[per_class > 0]
        out["samples_per_class"] = (
            {"min": int(nonzero.min()), "max": int(nonzero.max())} if len(nonzero) else None
        )
    lengths = idx.lengths
    if lengths is not None and len(lengths):
        out["lengths"] = {
            "field": idx.lengths_field, "min": int(lengths.min()), "max": int(lengths.max()),
            "mean": float(np.mean(lengths)), "median": float(np.median(lengths)),
            "total": int(lengths.sum()),
        }
    if idx.tokenizer is not None:  # with a tokenizer, lengths.npy holds the token counts of its field
        out["tokenizer"] = {**dict(idx.tokenizer), "total_tokens": None if out["lengths"] is None
                            else out["lengths"]["total"]}
    return out


def _store_info(idx: DatasetIndex, total: int) -> dict[str, Any]:
    """How images are stored, and the disk that costs: ``{"mode": "jpeg"}``, or for raw pixels the
    index's ``store`` entry plus ``bytes`` (on disk) and ``bytes_as_jpeg`` (the same shards holding
    the image files the pixels were decoded from instead)."""
    if idx.store is None:
        return {"mode": "jpeg"}
    st = dict(idx.store)
    st["bytes"] = total
    st["bytes_as_jpeg"] = total - int(st.get("raw_bytes", 0)) + int(st.get("encoded_bytes", 0))
    return st


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
    report = VerifyReport(path=str(dst), ok=False)
    try:
        idx = open_checked(dst, on_error="skip")  # a damaged foreign tar: reported below, the rest checked
        offsets = np.asarray(idx.offsets)
        labels = None if idx.labels is None else np.asarray(idx.labels)
        lengths = None if idx.lengths is None else np.asarray(idx.lengths)
        shapes = None if idx.shapes is None else np.asarray(idx.shapes)
    except FastfeedError as e:
        report.problems.append(str(e))
        return report
    if lengths is not None and (lengths < 0).any():
        report.problems.append(f"{dst}/{LENGTHS_NAME}: negative lengths; re-run `fastfeed pack --overwrite`")
    foreign = is_foreign(idx)
    report.problems += _damaged_tars(idx) if foreign else _check_skipped(Path(dst), idx)
    starts = idx.shard_starts
    jobs = []
    for s, info_ in enumerate(idx.shards):
        a, b = int(starts[s]), int(starts[s + 1])
        jobs.append((idx.root if foreign else str(dst), idx.format, info_, offsets[a:b].copy(),
                     None if labels is None else labels[a:b].copy(), decode, foreign,
                     None if shapes is None else shapes[a:b].copy()))
    if workers > 1 and len(jobs) > 1:
        import multiprocessing as mp

        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as ex:
            outcomes = [_reported(o, i, len(jobs), progress) for i, o in enumerate(ex.map(_verify_shard, jobs))]
    else:
        outcomes = [_reported(_verify_shard(j), i, len(jobs), progress) for i, j in enumerate(jobs)]
    seen: dict[str, str] = {}
    for info_, (problems, keys, images, nbytes) in zip(idx.shards, outcomes):
        report.problems += problems
        report.shards += 1
        report.samples += len(keys)
        report.images += images
        report.bytes += nbytes
        for k in keys:
            if k in seen:
                report.problems.append(f"{info_.name}: key {k!r} also in {seen[k]}; keys must be unique, "
                                       "re-run `fastfeed pack --overwrite`")
            else:
                seen[k] = info_.name
    report.ok = not report.problems
    return report


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


def _verify_shard(job: tuple[str, str, ShardInfo, np.ndarray, np.ndarray | None, bool, bool, np.ndarray | None]
                  ) -> tuple[list[str], list[str], int, int]:
    """Check one shard: (problems, keys in order, images decoded, bytes).

    A foreign tar (no fastfeed index) has no checksum or DALI index to compare: its
    members are read and its images decoded."""
    root, fmt, shard, offsets, labels, decode, foreign, shapes = job
    path = Path(root) / shard.name
    problems: list[str] = []

    def problem(text: str) -> None:
        if len(problems) < _MAX_PROBLEMS_PER_SHARD:
            problems.append(f"{path}: {text}")
        elif len(problems) == _MAX_PROBLEMS_PER_SHARD:
            problems.append(f"{path}: more problems not shown")

    if not path.is_file():
        problem("missing; restore it or re-run `fastfeed pack --overwrite`")
        return problems, [], 0, 0
    size = path.stat().st_size
    if size != shard.bytes:
        problem(f"{size} bytes, the index says {shard.bytes}; the shard is damaged, restore it or re-pack")
    if not foreign and _sha256(path) != shard.sha256:
        problem("sha256 differs from the index; the shard is damaged, restore it or re-pack")
    keys: list[str] = []
    images = 0
    fix = _decode_fix(foreign)
    try:
        tar = open_shard(str(path)) if foreign and is_gzip_tar(path.name) else path
        locations = _locations(tar, fmt)
        for i, sample in enumerate(_read_samples(tar, fmt)):
            key = sample["__key__"]
            keys.append(key)
            loc = (i, 0) if locations is None else locations[i] if i < len(locations) else None
            if i < len(offsets) and tuple(int(x) for x in offsets[i]) != loc:
                problem(f"sample {key!r}: offsets.npy says {tuple(int(x) for x in offsets[i])}, the shard "
                        f"{loc}; re-pack")
            if labels is not None and i < len(labels) and "cls" in sample:
                cls = _int_or_none(sample["cls"])
                if cls is not None and cls != labels[i]:
                    problem(f"sample {key!r}: cls member {cls} but labels.npy says {labels[i]}; re-pack")
            if shapes is not None or RAW_FIELD in sample:
                images += _check_pixels(sample, None if shapes is None or i >= len(shapes) else shapes[i], problem)
            if decode:
                for name, data in sample.items():
                    if name != "__key__" and is_image(name):
                        images += 1
                        err = decode_error(data)
                        if err is not None:
                            problem(f"sample {key!r} field {name!r}: image does not decode ({err}); "
                                    + fix.format(member=f"{key}.{name}"))
    except (FastfeedError, tarfile.TarError, OSError) as e:
        problem(f"cannot be read after {len(keys)} samples ({e}); restore it or re-pack")
        return problems, keys, images, size
    if len(keys) != shard.samples:
        problem(f"holds {len(keys)} samples, the index says {shard.samples}; re-pack")
    if fmt == "tar" and not foreign:
        for text in _check_dali_index(Path(root), shard, path):
            problem(text)
    return problems, keys, images, size


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
