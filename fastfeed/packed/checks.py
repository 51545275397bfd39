"""``fastfeed verify`` (and, re-exported from :mod:`fastfeed.packed.summary`, ``fastfeed info``): is a
packed dataset intact, and what it holds.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from fastfeed._options import as_bool
from fastfeed.errors import ConfigError, FastfeedError
from fastfeed.formats import FORMATS
from fastfeed.formats.images import decode_error
from fastfeed.formats.naming import RAW_FIELD, is_image, split_key
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
from fastfeed.packed.summary import (
    ASPECTS,
    InfoReport,
    aspect_info,
    aspect_lines,
    check_path,
    encoded_store_line,
    image_kinds,
    info,
    is_foreign,
    open_checked,
    store_line,
)
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
    check_path(dst)
    decode = as_bool(decode, "decode")
    if progress is not None and not callable(progress):
        raise ConfigError(f"progress={progress!r}: pass a function progress(shards_checked, shards_total), or None")
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
