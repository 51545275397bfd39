"""Where tune results live, and which stored result applies to a loader.

A result is only valid for what it was measured on, so it is stored under a
:class:`TuneKey`: the dataset fingerprint, the host (usable cores, memory, CPU model),
``LOCAL_WORLD_SIZE``, the batch size, the decode mode and the image size. A result
whose key does not match (another machine, a re-packed dataset, another batch size) is
ignored.

Files, looked up in this order (the first match wins):

1. ``$FASTFEED_TUNE_DIR/<fingerprint>.json`` when that variable is set;
2. ``<dataset>/fastfeed-tune.json`` next to the index (local datasets);
3. ``<user cache>/fastfeed/tune/<fingerprint>.json`` (``$XDG_CACHE_HOME`` or ``~/.cache``).

``fastfeed tune`` writes to the first of these that is writable: an explicit
``store_dir`` argument, else 1, else 2, else 3. A file holds a list of records, so
one dataset folder serves several hosts, batch sizes and decode modes (a shared
filesystem seen by a homogeneous cluster is tuned once).

A new result does not replace a better stored one for the same key
(:func:`better_stored`): one that never reached steady state does not replace a steady
one, an unconfirmed one does not replace a confirmed one, and a run measured for less
than half as long does not replace a longer one (``fastfeed tune`` says so and keeps the
stored result; ``--replace`` stores it anyway).

Example:
    >>> key = TuneKey("0123abcd", host_info(), 1, 256, "cpu", (224, 224))
    >>> key.matches(key)
    True
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from fastfeed.decode.geometry import normalize_image_size
from fastfeed.errors import DestinationError
from fastfeed.host import HostInfo, host_info
from fastfeed.packed.index import atomic_write_bytes
from fastfeed.storage.remote import is_url as _is_url

__all__ = [
    "DATASET_FILE",
    "STORE_VERSION",
    "TuneKey",
    "TuneRecord",
    "better_stored",
    "candidate_files",
    "find_record",
    "save_record",
    "stored_record",
]

log = logging.getLogger(__name__)

DATASET_FILE = "fastfeed-tune.json"
STORE_VERSION = 1


@dataclass(frozen=True)
class TuneKey:
    """What a tune result depends on. See the module docstring."""

    fingerprint: str
    host: HostInfo
    local_world_size: int
    batch_size: int
    decode: str | None
    image_size: tuple[int, int] | None

    def matches(self, other: "TuneKey") -> bool:
        """Equal, except that hosts match by :meth:`HostInfo.matches` (memory within 10%)."""
        return (
            self.fingerprint == other.fingerprint
            and self.host.matches(other.host)
            and self.local_world_size == other.local_world_size
            and self.batch_size == other.batch_size
            and self.decode == other.decode
            and self.image_size == other.image_size
        )

    def mismatch(self, other: "TuneKey") -> str:
        """The first field that differs, as words (for logs), or '' when they match."""
        for name in ("fingerprint", "local_world_size", "batch_size", "decode", "image_size"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                return f"{name} {b!r} != {a!r}"
        if not self.host.matches(other.host):
            return f"host {other.host} != {self.host}"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "host": self.host.to_json(),
            "local_world_size": self.local_world_size,
            "batch_size": self.batch_size,
            "decode": self.decode,
            "image_size": None if self.image_size is None else list(self.image_size),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TuneKey":
        return cls(
            fingerprint=str(d["fingerprint"]),
            host=HostInfo.from_json(dict(d["host"])),
            local_world_size=int(d["local_world_size"]),
            batch_size=int(d["batch_size"]),
            decode=d.get("decode"),
            image_size=normalize_image_size(d.get("image_size")),
        )

    @classmethod
    def current(
        cls, fingerprint: str, *, batch_size: int, decode: str | None,
        image_size: int | tuple[int, int] | None, local_world_size: int,
    ) -> "TuneKey":
        """The key for this host now."""
        return cls(fingerprint, host_info(), local_world_size, int(batch_size), decode,
                   normalize_image_size(image_size))


@dataclass(frozen=True)
class TuneRecord:
    """One stored result: the key and what the loader should use.

    Attributes:
        key: what it was measured for.
        num_workers: the chosen worker count.
        prefetch_factor: the chosen prefetch factor (None with 0 workers).
        knobs: decode-mode settings chosen by the search (loader keyword -> value).
        samples_per_s: measured throughput of the chosen setting.
        created: ISO time of the run.
        details: everything else ``fastfeed tune`` reports (trials, target, reason).
        path: the file it was read from or written to.
    """

    key: TuneKey
    num_workers: int
    prefetch_factor: int | None
    knobs: Mapping[str, Any] = field(default_factory=dict)
    samples_per_s: float = 0.0
    created: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""

    @property
    def steady(self) -> bool:
        """The chosen setting's measurement reached steady state (records without the flag: True)."""
        return bool((self.details.get("chosen") or {}).get("steady", True))

    @property
    def confirmed(self) -> bool:
        """The choice was made on confirmation re-measurements."""
        return bool(self.details.get("confirmed"))

    @property
    def measuring_s(self) -> float:
        """Seconds the run spent measuring (0 when unknown)."""
        try:
            return float(self.details.get("measuring_s") or 0.0)
        except (TypeError, ValueError):
            return 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key.to_json(),
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor,
            "knobs": dict(self.knobs),
            "samples_per_s": self.samples_per_s,
            "created": self.created,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], path: str = "") -> "TuneRecord":
        workers = int(d["num_workers"])
        pf = d.get("prefetch_factor")
        return cls(
            key=TuneKey.from_json(d["key"]),
            num_workers=workers,
            prefetch_factor=None if pf is None or workers == 0 else int(pf),
            knobs=dict(d.get("knobs") or {}),
            samples_per_s=float(d.get("samples_per_s", 0.0)),
            created=str(d.get("created", "")),
            details=dict(d.get("details") or {}),
            path=path,
        )


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastfeed" / "tune"


def candidate_files(root: str, fingerprint: str) -> list[Path]:
    """Files that may hold results for a dataset, in lookup order (see module docstring)."""
    files = []
    env = os.environ.get("FASTFEED_TUNE_DIR")
    if env:
        files.append(Path(env) / f"{fingerprint}.json")
    if root and not _is_url(root):
        files.append(Path(root) / DATASET_FILE)
    files.append(_user_cache() / f"{fingerprint}.json")
    return files


def _read_records(path: Path) -> Iterator[TuneRecord]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable tune results (%s); ignored. Re-run `fastfeed tune`", path, e)
        return
    if not isinstance(data, dict) or data.get("fastfeed_tune") != STORE_VERSION:
        log.info("%s: tune results of another format version; ignored", path)
        return
    for d in data.get("results", []):
        try:
            yield TuneRecord.from_json(d, str(path))
        except (KeyError, TypeError, ValueError) as e:
            log.warning("%s: a damaged tune record (%s); ignored", path, e)


def find_record(root: str, key: TuneKey) -> TuneRecord | None:
    """The newest stored record matching ``key``, or None (mismatches are logged at DEBUG)."""
    for path in candidate_files(root, key.fingerprint):
        found = []
        for rec in _read_records(path):
            why = key.mismatch(rec.key)
            if why:
                log.debug("%s: tune record ignored (%s)", path, why)
            else:
                found.append(rec)
        if found:
            return max(found, key=lambda r: r.created)
    return None


#: A new result measured for less than this share of the stored one's time is "shorter".
SHORTER = 0.5


def better_stored(old: TuneRecord, new: TuneRecord) -> str | None:
    """Why the stored ``old`` is better than ``new`` (then keep it), or None to replace it.

    Example:
        >>> steady = {"chosen": {"steady": True}, "measuring_s": 40.0}
        >>> short = {"chosen": {"steady": False}, "measuring_s": 1.0}
        >>> k = TuneKey("f", host_info(), 1, 64, "cpu", None)
        >>> better_stored(TuneRecord(k, 2, 2, details=steady), TuneRecord(k, 0, None, details=short))
        'steady, where this run never reached steady state'
    """
    if old.steady and not new.steady:
        return "steady, where this run never reached steady state"
    if old.steady != new.steady:
        return None
    if old.confirmed and not new.confirmed:
        return "confirmed by re-measurement, where this run's budget ended before confirming"
    if new.measuring_s < SHORTER * old.measuring_s:
        return f"measured for {old.measuring_s:.0f} s, this run for {new.measuring_s:.0f} s"
    return None


def stored_record(root: str, key: TuneKey, store_dir: str | os.PathLike[str] | None = None) -> TuneRecord | None:
    """The stored record that :func:`save_record` would replace (``store_dir`` or the lookup order)."""
    if store_dir is None:
        return find_record(root, key)
    found = [r for r in _read_records(Path(store_dir) / f"{key.fingerprint}.json") if r.key.matches(key)]
    return max(found, key=lambda r: r.created) if found else None


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def save_record(record: TuneRecord, root: str, store_dir: str | os.PathLike[str] | None = None) -> Path:
    """Store ``record`` (replacing any record with a matching key); returns the file.

    Goes to ``store_dir/<fingerprint>.json`` when given, else the first writable place
    of the lookup order.
    """
    fp = record.key.fingerprint
    if store_dir is not None:
        targets = [Path(store_dir) / f"{fp}.json"]
    else:
        targets = candidate_files(root, fp)
    for path in targets:
        if not _writable_dir(path.parent):
            log.info("%s: not writable, trying the next place for tune results", path.parent)
            continue
        kept = [r for r in _read_records(path) if not r.key.matches(record.key)]
        data = {"fastfeed_tune": STORE_VERSION,
                "results": [r.to_json() for r in kept] + [record.to_json()]}
        text = json.dumps(data, indent=1) + "\n"
        try:
            atomic_write_bytes(path, text.encode("utf-8"))
        except OSError as e:
            log.info("%s: cannot write tune results (%s), trying the next place", path, e)
            continue
        return path
    raise DestinationError(
        f"no writable place for tune results (tried {', '.join(map(str, targets))}); "
        "pass store_dir= (CLI: --store-dir) or set FASTFEED_TUNE_DIR"
    )
