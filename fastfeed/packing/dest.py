"""The destination folder of ``pack``: refuse a DST inside SRC or holding other data, resume, overwrite.

:func:`check_destination` decides what DST is (new, an unfinished run of this job to
resume, already complete, or refused); :func:`prepare_destination` removes fastfeed's own
files when overwriting (shards, sidecars, index, resume records; nothing else) and
records the job in ``DST/.fastfeed-pack/job.json``.

Example:
    >>> from pathlib import Path
    >>> check_destination(Path("/nonexistent/fastfeed-dst"), "files", "job", "content", overwrite=False)
    False
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from fastfeed.errors import DestinationError
from fastfeed.packed.index import atomic_write_bytes
from fastfeed.packed.layout import INDEX_NAME, JOB_RECORD, OWN_FILE, RESUME_DIR
from fastfeed.packing.sources.base import show

__all__ = ["check_destination", "check_not_inside", "prepare_destination", "remove_own_files"]

log = logging.getLogger("fastfeed.pack")


def check_not_inside(src: Path, dst: Path) -> None:
    if src.is_file():
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
    names = sorted(os.listdir(dst))
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


def prepare_destination(dst: Path, *, overwrite: bool, record: dict[str, Any]) -> None:
    """Remove fastfeed's files when overwriting; record the job (``record``) for resuming."""
    if overwrite and dst.is_dir():
        remove_own_files(dst, keep=())
        shutil.rmtree(dst / RESUME_DIR, ignore_errors=True)
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
