"""Packing into an object store (``fastfeed pack SRC s3://bucket/prefix``): nodes need no common disk.

The plan is made against an empty local staging folder (so planning, shard writing
and the index are exactly the local packer's) and the object store is then treated
like the local DST:

- before writing, :meth:`RemoteDest.check` decides what the prefix holds (new, an
  unfinished run of this job, already this dataset, or something else: refused unless
  ``overwrite``), as :func:`fastfeed.packing.plan.plan_pack` does for a folder, and
  :meth:`RemoteDest.prepare` records the job in ``PREFIX/.fastfeed-pack/job.json``;
- :func:`write_shard_remote` (run by any engine, on any node) writes a shard to a
  local temporary folder with :func:`fastfeed.packing.write.write_shard`, uploads the DALI
  index, then the shard, then its resume record. An object store shows an object only
  once its upload completed, so a shard is published whole or not at all; other
  fsspec file systems get a temporary name and a rename. A re-run reuses a published
  shard when its record matches the plan and the object's sha256 (streamed back)
  matches the record;
- after :func:`fastfeed.packing.finish.finalize` wrote the index in the staging folder,
  :meth:`RemoteDest.publish_dataset` uploads the sidecars, ``skipped.txt`` and, last,
  ``index.json``; then removes the resume records and stale files of earlier runs.

Every request to the store is bounded: a connect or a read (an upload's answer too) that
makes no progress for a minute is given up and retried, and after the last retry a
:class:`~fastfeed.errors.RemoteError` names the object, what timed out and how to wait longer
(:mod:`fastfeed.storage.retry`). ``pack(..., storage_options={"timeout": 120, "retries": 8})``
changes the bound (fastfeed reads those two keys; the rest go to fsspec).

Example:
    >>> idx = fastfeed.pack("train", "s3://bucket/train-ff", engine="ray")   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from fastfeed import __version__
from fastfeed.errors import DestinationError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.layout import (
    INDEX_NAME,
    JOB_RECORD,
    OWN_FILE,
    RESUME_DIR,
    SKIPPED_NAME,
    resume_record,
)
from fastfeed.packing.plan import PackPlan
from fastfeed.packing.write import (
    ProgressFn,
    ShardResult,
    shard_fingerprint,
    write_shard,
)
from fastfeed.storage.bounded import call_within, filesystem
from fastfeed.storage.retry import RetryPolicy, policy_of, with_retries

__all__ = ["RemoteDest", "write_shard_remote"]

log = logging.getLogger("fastfeed.pack")

#: fsspec protocols whose uploads become visible atomically, when complete.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "oss", "r2"})
_CHUNK = 8 << 20


@dataclass(frozen=True)
class RemoteDest:
    """A destination prefix on an fsspec file system (picklable: sent to every task).

    Attributes:
        url: the prefix, e.g. ``s3://bucket/train-ff`` (no trailing slash).
        storage_options: passed to fsspec (endpoint, credentials); None: the
            environment of the process (on a cluster: of each node). Its ``"timeout"`` and
            ``"retries"`` bound every request (:func:`fastfeed.storage.retry.policy_of`).
    """

    url: str
    storage_options: Mapping[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def create(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> "RemoteDest":
        return cls(str(url).rstrip("/"), dict(storage_options) if storage_options else None)

    # ------------------------------------------------------------ primitives
    @property
    def policy(self) -> RetryPolicy:
        """The timeout and retries of every request to the store."""
        return policy_of(self.storage_options)

    def _fs(self) -> tuple[Any, str]:
        return filesystem(self.url, self.storage_options, retry=self.policy)

    def name_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _path(self, name: str) -> str:
        return f"{self._fs()[1].rstrip('/')}/{name}"

    def listdir(self) -> dict[str, int]:
        """Names directly under the prefix -> size (folders: -1); empty when it does not exist."""
        fs, root = self._fs()
        fs.invalidate_cache(root)

        def ls() -> list[dict[str, Any]]:
            try:
                return list(fs.ls(root, detail=True))
            except FileNotFoundError:
                return []

        out = {}
        for e in with_retries(ls, self.url, "list", self.policy):
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            out[name] = -1 if e.get("type") == "directory" else int(e.get("size") or 0)
        return out

    def read(self, name: str) -> bytes:
        """A whole object; FileNotFoundError when missing."""
        fs, _ = self._fs()
        path = self._path(name)
        return with_retries(lambda: fs.cat_file(path), self.name_url(name), "read", self.policy)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Publish small ``data`` as ``name`` (whole or not at all)."""
        with tempfile.NamedTemporaryFile(prefix="fastfeed-", delete=False) as f:
            f.write(data)
        try:
            self.publish(f.name, name)
        finally:
            os.unlink(f.name)

    def publish(self, local: str | os.PathLike[str], name: str) -> None:
        """Upload a local file as ``name``, visible only once complete."""
        fs, _ = self._fs()
        final = self._path(name)
        policy = self.policy
        deadline = policy.upload_deadline(os.path.getsize(local))  # a body the store stopped taking

        def put(to: str) -> None:
            call_within(fs, "put_file", deadline, str(local), to)

        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if protocols & _OBJECT_STORES:
            with_retries(lambda: put(final), self.name_url(name), "upload", policy)
            return
        tmp = f"{final}.{uuid.uuid4().int % 10**12}.tmp"  # a name OWN_FILE knows, for cleanup
        with_retries(lambda: put(tmp), self.name_url(name), "upload", policy)
        with_retries(lambda: fs.mv(tmp, final), self.name_url(name), "rename", self.policy)

    def remove(self, names: Sequence[str], *, recursive: bool = False) -> None:
        fs, _ = self._fs()
        for name in names:
            path = self._path(name)

            def rm(path: str = path) -> None:
                try:
                    fs.rm(path, recursive=recursive)
                except FileNotFoundError:
                    pass

            with_retries(rm, self.name_url(name), "delete", self.policy)
        fs.invalidate_cache(self._fs()[1])

    def matches(self, name: str, size: int | None, sha256: str | None) -> bool:
        """True when object ``name`` exists with this size and sha256 (streamed back)."""
        fs, _ = self._fs()
        path = self._path(name)

        def digest() -> tuple[int, str]:
            h = hashlib.sha256()
            n = 0
            with fs.open(path, "rb", block_size=_CHUNK) as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    n += len(chunk)
            return n, h.hexdigest()

        try:
            n, got = with_retries(digest, self.name_url(name), "checksum", self.policy)
        except FileNotFoundError:
            return False
        return (size is None or n == size) and got == sha256

    # ------------------------------------------------------------ job state
    def check(self, plan: PackPlan) -> bool:
        """What the prefix holds: False to (re)pack, True when it already holds this dataset.

        Raises:
            DestinationError: it holds another dataset or other files (without overwrite).
        """
        names = self.listdir()
        overwrite = plan.options.overwrite
        if not names:
            return False
        if INDEX_NAME in names:
            try:
                d = json.loads(self.read(INDEX_NAME))
                same = d.get("input") == plan.kind and (d.get("options") or {}).get("content") == plan.content
            except (OSError, ValueError):
                d, same = {}, False
            if same and not overwrite:
                if all(names.get(str(s.get("name"))) == int(s.get("bytes", -2)) for s in d.get("shards", [])):
                    return True
                log.warning("%s: index.json is there but shards are missing or truncated; packing again",
                            self.url)
                return False
            if not overwrite:
                raise DestinationError(
                    f"{self.url}: already holds a complete dataset packed from other input or options; "
                    "pass --overwrite to replace it, or choose another DST"
                )
            return False
        if RESUME_DIR in names:
            try:
                previous = json.loads(self.read(JOB_RECORD)).get("job")
            except (OSError, ValueError):
                previous = None
            if previous == plan.job:
                log.info("%s: resuming an unfinished run of this job", self.url)
                return False
        if overwrite:
            return False
        shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        what = ("an unfinished run of another job (other source or options)" if RESUME_DIR in names
                else f"not empty ({shown})")
        raise DestinationError(
            f"{self.url}: {what}; choose an empty or new DST, or pass --overwrite to replace "
            "fastfeed's objects there (other objects are left alone)"
        )

    def prepare(self, plan: PackPlan) -> None:
        """Remove fastfeed's objects when overwriting; record the job for resuming."""
        if plan.options.overwrite:
            self.remove([INDEX_NAME])  # first: the prefix stops being a complete dataset
            self.cleanup(keep=())
        record = {"job": plan.job, "fastfeed": __version__, "src": plan.src, "content": plan.content}
        self.put_bytes(JOB_RECORD, (json.dumps(record, indent=1) + "\n").encode())

    def cleanup(self, keep: Sequence[str] | None) -> None:
        """Remove resume records and fastfeed's objects not in ``keep`` (None: what the index lists)."""
        if keep is None:
            try:
                keep = _index_files(json.loads(self.read(INDEX_NAME)))
            except (OSError, ValueError, KeyError, TypeError):
                return
        names = self.listdir()
        if RESUME_DIR in names:
            self.remove([RESUME_DIR], recursive=True)
        stale = [n for n in names if OWN_FILE.match(n) and n not in keep and n != INDEX_NAME]
        if stale:
            self.remove(stale)

    def load_index(self) -> DatasetIndex:
        return DatasetIndex.from_json(json.loads(self.read(INDEX_NAME)), root=self.url)

    def publish_dataset(self, stage: str | os.PathLike[str], index: DatasetIndex) -> DatasetIndex:
        """Publish what :func:`fastfeed.packing.finish.finalize` wrote into the staging folder ``stage``.

        Sidecars and ``skipped.txt`` go first, ``index.json`` last; then the resume records
        and objects of earlier runs that the index does not list are removed.

        Example:
            >>> dest.publish_dataset(plan.dst, finalize(plan, results))   # doctest: +SKIP
        """
        folder = Path(stage)
        d = index.to_json()
        for name in [*d["arrays"], SKIPPED_NAME]:
            if (folder / name).is_file():
                self.publish(folder / name, name)
        self.publish(folder / INDEX_NAME, INDEX_NAME)
        self.cleanup(keep=_index_files(d))
        return replace(index, root=self.url)


def _index_files(d: Mapping[str, Any]) -> list[str]:
    shards = d["shards"]
    keep = [s["name"] for s in shards] + [s["dali_index"] for s in shards if s.get("dali_index")]
    return keep + list(d.get("arrays", [])) + ([SKIPPED_NAME] if d.get("num_skipped") else [])


# ---------------------------------------------------------------- step 2 and 3
def _reusable(plan: PackPlan, number: int, dest: RemoteDest) -> ShardResult | None:
    shard = plan.shards[number]
    try:
        rec = ShardResult.from_json(json.loads(dest.read(resume_record(shard.name))))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    if rec.name != shard.name or rec.fingerprint != shard_fingerprint(plan, shard):
        return None
    if not dest.matches(shard.name, rec.bytes, rec.sha256):
        log.info("%s: checksum differs from the resume record; writing it again", dest.name_url(shard.name))
        return None
    if rec.dali_index and not dest.matches(rec.dali_index, None, rec.dali_sha256):
        return None
    return replace(rec, reused=True)


def write_shard_remote(
    plan: PackPlan, number: int, dest: RemoteDest, *, progress: ProgressFn | None = None
) -> ShardResult:
    """Write shard ``number`` of ``plan`` and publish it under ``dest`` (or reuse it).

    The shard is written by :func:`~fastfeed.packing.write.write_shard` into a temporary
    folder of this machine (``TMPDIR``: room for one shard per writing process), then
    uploaded: DALI index, shard, resume record. Idempotent: attempts of the same
    shard upload identical bytes.

    Example:
        >>> write_shard_remote(plan, 0, RemoteDest.create("s3://bucket/ff"))  # doctest: +SKIP
    """
    done = _reusable(plan, number, dest)
    if done is not None:
        if progress is not None:
            progress(done.files_read, done.bytes_read)
        return done
    stage = Path(tempfile.mkdtemp(prefix="fastfeed-shard-"))
    try:
        (stage / RESUME_DIR).mkdir()
        result = write_shard(replace(plan, dst=str(stage)), number, progress=progress)
        if result.dali_index:
            dest.publish(stage / result.dali_index, result.dali_index)
        dest.publish(stage / result.name, result.name)
        dest.put_bytes(resume_record(result.name), json.dumps(result.to_json()).encode())
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return result
