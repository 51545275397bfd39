"""The destination folder of ``pack``: refuse a DST inside SRC or holding other data, resume, overwrite.

:func:`check_destination` decides what DST is (new, an unfinished run of this job to
resume, already complete, or refused); :func:`prepare_destination` removes fastfeed's own
files when overwriting (shards, sidecars, index, resume records; nothing else) and
records the job in ``DST/.fastfeed-pack/job.json``.

One writer at a time: :func:`hold_destination` takes ``DST/.fastfeed-pack.lock`` (``flock``) for the
whole of a ``pack`` and records there who holds it (pid, host, start, command), so a second
``pack`` into the same DST, ``--overwrite`` or not, stops at once with a
:class:`~fastfeed.errors.DestinationBusyError` naming the first. The kernel releases the lock when
its holder dies, however it dies, so the lock of a killed ``pack`` is simply taken over (and
logged); the holder removes the file when it ends.

A full disk (or quota): every write of ``pack`` into DST (the shards, their DALI indexes and
resume records, the job record, the sidecars, ``skipped.txt`` and ``index.json``) runs inside
:func:`on_full_disk`. An ``ENOSPC`` or ``EDQUOT`` from the OS (an ``OSError``, or LMDB's
``DiskError``) becomes a :class:`~fastfeed.errors.DiskFullError` that names the destination
folder, the bytes free there and the bytes this pack still has to write, estimated from the
plan; any other error passes unchanged. The temporary file of the failed write is removed by its
writer, so running the same command again once space is free resumes: shards already complete
are kept, and the result is byte-identical to an uninterrupted run.

Example:
    >>> from pathlib import Path
    >>> check_destination(Path("/nonexistent/fastfeed-dst"), "files", "job", "content", overwrite=False)
    False
    >>> import errno
    >>> try:
    ...     with on_full_disk("/data/in-ff", needed=lambda: 5_000_000_000):
    ...         raise OSError(errno.ENOSPC, "No space left on device", "/data/in-ff/shard-000003.tar.77.tmp")
    ... except DiskFullError as e:
    ...     e.errno == errno.ENOSPC, e.needed
    (True, 5000000000)
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from fastfeed._util import format_bytes
from fastfeed.errors import DestinationBusyError, DestinationError, DiskFullError
from fastfeed.packed.index import atomic_write_bytes
from fastfeed.packed.layout import INDEX_NAME, JOB_RECORD, LOCK_NAME, OWN_FILE, RESUME_DIR
from fastfeed.packing.sources.base import show

__all__ = [
    "check_destination",
    "check_not_inside",
    "disk_full",
    "full_disk_errno",
    "hold_destination",
    "on_full_disk",
    "prepare_destination",
    "remove_own_files",
]

log = logging.getLogger("fastfeed.pack")


def check_not_inside(src: Path, dst: Path) -> None:
    try:
        if src.is_file():
            return
    except OSError:  # a name too long, say: opening the source says what is wrong with it
        return
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if d == s or d.startswith(s.rstrip(os.sep) + os.sep):
        raise DestinationError(
            f"{show(str(dst))}: the destination is inside the source {show(str(src))}; its shards "
            "would be packed again on the next run. Choose a DST outside SRC"
        )


def check_destination(dst: Path, kind: str, job: str, content: str, *, overwrite: bool) -> bool:
    """Decide what DST is: new, resumable, already complete (True), or refused."""
    if dst.exists() and not dst.is_dir():
        raise DestinationError(f"{show(str(dst))}: exists and is not a folder; choose another DST")
    if not dst.exists():
        return False
    names = sorted(n for n in os.listdir(dst) if n != LOCK_NAME)  # the lock is this pack's own
    if not names:
        return False
    if INDEX_NAME in names:
        try:
            d = json.loads((dst / INDEX_NAME).read_text("utf-8"))
            same = d.get("input") == kind and (d.get("options") or {}).get("content") == content
        except (OSError, ValueError):
            same = False
        if same and not overwrite:
            if _shards_present(dst, d):
                return True
            log.warning("%s: index.json is there but shards are missing or truncated; packing again",
                        show(str(dst)))
            return False
        if not overwrite:
            raise DestinationError(
                f"{show(str(dst))}: already holds a complete dataset packed from other input or "
                "options; pass --overwrite to replace it, or choose another DST"
            )
        return False
    if RESUME_DIR in names:
        try:
            previous = json.loads((dst / JOB_RECORD).read_text("utf-8")).get("job")
        except (OSError, ValueError):
            previous = None
        if previous == job:
            log.info("%s: resuming an unfinished run of this job", show(str(dst)))
            return False
    if overwrite:
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


def prepare_destination(dst: Path, *, overwrite: bool, record: dict[str, Any],
                        needed: Callable[[], int | None] | None = None) -> None:
    """Remove fastfeed's files when overwriting; record the job (``record``) for resuming.

    ``needed``: the bytes the pack will write (for a full disk's message)."""
    if overwrite and dst.is_dir():
        remove_own_files(dst, keep=())
        shutil.rmtree(dst / RESUME_DIR, ignore_errors=True)
    with on_full_disk(dst, needed=needed):
        (dst / RESUME_DIR).mkdir(parents=True, exist_ok=True)
        job_path = dst / JOB_RECORD
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


# ---------------------------------------------------------------- one writer at a time
#: Seconds to wait for a lock whose recorded holder is gone: its writer processes end within 0.2 s of it.
_STALE_WAIT = 3.0


@contextmanager
def hold_destination(dst: str | os.PathLike[str], *, command: str | None = None) -> Iterator[None]:
    """Hold the lock of the folder ``dst`` (created when missing) while the block runs.

    Args:
        dst: the destination folder of a local ``pack``.
        command: what to record as the holder's command (default: this process's ``sys.argv``).

    Raises:
        DestinationBusyError: another process holds it; names its pid, host, start and command.

    Example:
        >>> with hold_destination("/tmp/fastfeed-doctest-dst"):   # doctest: +SKIP
        ...     pass
    """
    dst = Path(dst)
    if dst.exists() and not dst.is_dir():
        yield  # planning refuses it, with its message
        return
    created = not dst.exists()
    with on_full_disk(dst.parent if created else dst):
        dst.mkdir(parents=True, exist_ok=True)
    try:
        fd = _acquire(dst, command if command is not None else " ".join(sys.argv) or sys.executable)
    except BaseException:
        if created:
            _remove_empty(dst)
        raise
    try:
        yield
    finally:
        if fd is not None:
            # remove the file while holding the lock: whoever opened it meanwhile finds it gone and retries
            (dst / LOCK_NAME).unlink(missing_ok=True)
            os.close(fd)
        if created:
            _remove_empty(dst)  # a plan that failed before writing leaves no empty folder behind


def _acquire(dst: Path, command: str) -> int | None:
    """Lock ``DST/.fastfeed-pack.lock`` and record this process there; the fd holding it (None: DST is
    read-only, so no pack can write there either)."""
    path = dst / LOCK_NAME
    deadline = time.monotonic() + _STALE_WAIT
    while True:
        try:
            with on_full_disk(dst):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except (PermissionError, OSError) as e:
            if isinstance(e, DiskFullError) or e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            return None  # a read-only DST (a complete dataset shared read-only): nothing will write here
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            if not _holder_alive(holder) and time.monotonic() < deadline:
                time.sleep(0.1)  # the holder is gone: its writer processes are ending
                continue
            raise _busy(dst, holder) from None
        except OSError as e:  # a file system without flock (some network mounts): no guard, say so
            log.warning("%s: cannot lock %s (%s); make sure no other `fastfeed pack` writes into this DST",
                        show(str(dst)), LOCK_NAME, e)
            return fd
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder ended and removed it between our open and our lock: take the new one
            os.close(fd)
            continue
        previous = _read_holder(fd)
        if previous:
            log.warning("%s: taking over the lock of a pack that is no longer running (%s); resuming what it "
                        "wrote", show(str(dst)), _who(previous))
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": command}
        data = (json.dumps(record) + "\n").encode()
        with on_full_disk(dst, what=LOCK_NAME):
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        return fd


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        d = json.loads(os.pread(fd, 1 << 16, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _holder_alive(holder: dict[str, Any]) -> bool:
    """False only when the holder ran on this host and its pid is gone."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _who(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that has not recorded itself yet"
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: "
            f"{holder.get('command')}")


def _busy(dst: Path, holder: dict[str, Any]) -> DestinationBusyError:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    gone = "" if _holder_alive(holder) else (
        f" (pid {pid} is gone, but a process it started still holds the lock: find it with `fuser {dst / LOCK_NAME}`)")
    return DestinationBusyError(
        f"{show(str(dst))}: another `fastfeed pack` is writing into this folder ({_who(holder)}){gone}; wait for it "
        f"to finish, or stop it (kill {pid} on {host}) and run this command again. "
        "Two packs never write into one DST at once, --overwrite or not",
        holder=holder)


def _remove_empty(dst: Path) -> None:
    try:
        dst.rmdir()
    except OSError:
        pass  # not empty: something was written, keep it


# ---------------------------------------------------------------- a full disk
#: The errno values that mean "no space for this write": the disk is full, or a quota is used up.
_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up"}


def full_disk_errno(exc: BaseException) -> int | None:
    """``ENOSPC``/``EDQUOT`` when ``exc`` says the disk (or quota) is full, else None.

    An ``OSError`` carries its errno; LMDB's errors do not (``lmdb.DiskError`` is its ``ENOSPC``),
    so their class name and message are read.

    Example:
        >>> full_disk_errno(OSError(errno.EDQUOT, "Disk quota exceeded")) == errno.EDQUOT
        True
        >>> full_disk_errno(OSError(errno.EACCES, "Permission denied")) is None
        True
    """
    if isinstance(exc, DiskFullError):
        return exc.errno
    if isinstance(exc, OSError):
        return exc.errno if exc.errno in _FULL else None
    text = str(exc)
    if type(exc).__name__ == "DiskError" or "No space left on device" in text:
        return errno.ENOSPC
    if "Disk quota exceeded" in text:
        return errno.EDQUOT
    return None


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged process can still write in ``folder``'s file system, or None when unknown."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return int(st.f_bavail) * int(st.f_frsize)


@contextmanager
def on_full_disk(dst: str | os.PathLike[str], *, needed: Callable[[], int | None] | None = None,
                 what: str = "", resumes: bool = True) -> Iterator[None]:
    """Turn an ``ENOSPC``/``EDQUOT`` raised inside into a :class:`DiskFullError` about ``dst``.

    Args:
        dst: the destination folder ``pack`` writes into.
        needed: called only on a full disk: the bytes still to write (an estimate), or None.
        what: the file being written, for the message when the failed call names none.
        resumes: the command resumes where it stopped (``pack``); False: it starts again (``shapes``).

    Raises:
        DiskFullError: with ``path``, ``free`` and ``needed`` set; an ``OSError`` too.
    """
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        code = full_disk_errno(e)
        if code is None:
            raise
        raise disk_full(dst, code, needed() if needed is not None else None,
                        getattr(e, "filename", None) or what, resumes=resumes) from e


def disk_full(dst: str | os.PathLike[str], code: int, needed: int | None, what: str = "", *,
              resumes: bool = True) -> DiskFullError:
    """The :class:`DiskFullError` for a write into ``dst`` that failed with ``code``."""
    folder = os.fspath(dst)
    free = free_bytes(folder)
    writing = f" (writing {os.path.basename(os.fspath(what))})" if what else ""
    have = "an unknown amount" if free is None else format_bytes(free)
    job = "this pack still has" if resumes else "it still has"
    still = "" if needed is None else f", and {job} about {format_bytes(needed)} to write"
    short = needed - free if needed is not None and free is not None else 0
    fix = f"free at least {format_bytes(short)} more there " if short > 0 else "free some space there "
    hint = "or raise the quota, " if code == errno.EDQUOT else ""
    return DiskFullError(
        f"{show(folder)}: {_FULL.get(code, os.strerror(code))}{writing}: {have} free there{still}; {fix}{hint}"
        + ("or choose a DST on a larger disk, then run the same command again: it resumes, keeping the shards "
           "already written" if resumes else "and run the same command again"),
        path=folder, free=free, needed=needed, errno=code)
