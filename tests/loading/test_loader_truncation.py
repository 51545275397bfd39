"""No crash on damaged files (issue 27, part 4): truncated shards are errors naming them, never signals.

A truncated LMDB shard used to kill ``fastfeed verify`` with a bus error (exit 135) or an
"internal error: BrokenProcessPool"; a shard truncated under a running loader killed it with
SIGBUS (``num_workers=0``) or torch's "out of shared memory" (``num_workers=2``). Now: the
LMDB header is checked before the file is mapped, every mapped read checks the file's size
first, verify reports every problem and names a shard whose check kills its worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

import fastfeed
from fastfeed.errors import IndexMismatchError, ShardError
from fastfeed.packed.integrity import run_isolated

BATCH = 4

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


@pytest.fixture(scope="module")
def packs(small_image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 60 photos as tar (JPEGs, read with pread), LMDB (memory-mapped) and raw pixels (a mapped tar)."""
    root = tmp_path_factory.mktemp("trunc")
    kinds = {"tar": {"format": "tar"}, "lmdb": {"format": "lmdb"}, "raw": {"store": "raw", "max_side": 64}}
    for name, kw in kinds.items():
        fastfeed.pack(small_image_folder, root / name, samples_per_shard=20, workers=1, seed=0, **kw)
    return {name: root / name for name in kinds}


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(src, dst)
    return dst


def _shards(ds: Path) -> list[Path]:
    return [ds / s["name"] for s in json.loads((ds / "index.json").read_text())["shards"]]


def test_a_truncated_lmdb_shard_is_reported_by_verify_and_refused_by_the_loader(packs: dict[str, Path],
                                                                                tmp_path: Path) -> None:
    ds = _copy(packs["lmdb"], tmp_path)
    shard = _shards(ds)[1]
    os.truncate(shard, shard.stat().st_size // 2)
    for workers in (1, 2):
        report = fastfeed.verify(ds, workers=workers)  # used to die of SIGBUS (or BrokenProcessPool)
        text = "\n".join(report.problems)
        assert not report.ok and report.shards == 3, text
        assert f"{shard.name}: " in text and "LMDB header counts" in text and "truncated" in text, text
    with pytest.raises(IndexMismatchError, match=rf"{shard.name}: \d+ bytes but the index says \d+"):
        fastfeed.loader(ds, batch_size=BATCH, num_workers=0)
    # an index edited to the shorter size: the LMDB header still tells, before anything is mapped
    meta = json.loads((ds / "index.json").read_text())
    meta["shards"][1]["bytes"] = shard.stat().st_size
    (ds / "index.json").write_text(json.dumps(meta))
    dl = fastfeed.loader(ds, batch_size=BATCH, num_workers=0, decode=None, shuffle=False,
                         storage=fastfeed.Storage(verify=False))
    with pytest.raises(ShardError, match=rf"{shard.name}: \d+ bytes, but its LMDB header counts \d+ .* truncated"):
        list(dl)


@pytest.mark.parametrize("kind", ["tar", "lmdb", "raw"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_truncated_under_a_running_loader_is_a_shard_error(packs: dict[str, Path], tmp_path: Path,
                                                                   kind: str, workers: int) -> None:
    ds = _copy(packs[kind], tmp_path)
    dl = fastfeed.loader(ds, batch_size=BATCH, image_size=16, num_workers=workers, shuffle=False,
                         on_error="skip")  # a shard that shrank is an error whatever on_error says
    it = iter(dl)
    next(it)
    if workers:  # let them fill their prefetch queues and wait: a shard that shrinks *during* a read of its
        time.sleep(1.5)  # memory map still faults (docs/format.md); one that shrank before the next read is this
    for shard in _shards(ds):
        os.truncate(shard, 4096 * 3)
    # the shard's first read since: its size against the index (or, LMDB, its header) at open; else at the read
    with pytest.raises(ShardError, match=r"shard-00000\d\.(tar|lmdb): (the shard is 12288 bytes now, \d+ when it was "
                                         r"checked: it was truncated or rewritten while being read|12288 bytes, but "
                                         r"its LMDB header counts \d+)"):
        for _ in it:
            pass
    if getattr(dl, "_iterator", None) is not None:  # the failed pass's workers go now (left to the garbage
        dl._iterator._shutdown_workers()  # collector with the traceback, their shutdown waits 10 s)


def test_verify_names_the_shard_whose_check_kills_its_worker() -> None:
    jobs = [signal.SIGWINCH, signal.SIGKILL, signal.SIGWINCH]  # SIGWINCH is ignored: raise_signal returns

    def died(i: int, why: str) -> str:
        return f"job {i}: {why}"

    assert run_isolated(signal.raise_signal, jobs, 2, died) == [None, "job 1: killed by SIGKILL", None]
