"""A full disk while packing: a real ``ENOSPC`` from the kernel (``/dev/full``), not a mock.

Pack writes every file through a temporary name it knows in advance (``<shard>.<pid>.tmp``,
``.<sidecar>.tmp-<pid>``); a symlink there to ``/dev/full`` makes the kernel answer that write with
``ENOSPC``, as a full file system does. Then: a :class:`DiskFullError` naming DST, what is free and
what is still needed; exit 2 from the CLI, one line; and the same command, once the space is back,
finishes the job byte-identically to a clean run.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Callable

import pytest

import fastfeed
from _pack_data import tree_digest, write_messy_folder
from fastfeed.cli import main
from fastfeed.errors import DestinationError, DiskFullError, FastfeedError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/dev/full"),
                                reason="needs Linux's /dev/full")

ARGS = {"samples_per_shard": 3, "workers": 1}


def _full(path: Path) -> None:
    """The next write to ``path`` (a temporary name pack will open) fails with ENOSPC."""
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/full")


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("full-src")
    write_messy_folder(root)
    return root


@pytest.fixture(scope="module")
def clean(src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    dst = tmp_path_factory.mktemp("full-clean") / "ds"
    fastfeed.pack(src, dst, **ARGS)
    return tree_digest(dst)


def _fill_on_start(name: str, dst: Path) -> Callable[..., None]:
    """A progress callback that, on its first call (DST prepared, nothing written), makes ``name`` full."""
    armed = [True]

    def progress(*_: int) -> None:
        if armed[0]:
            armed[0] = False
            _full(dst / name)

    return progress


def test_a_full_disk_while_writing_a_shard_names_dst_free_and_needed(src: Path, tmp_path: Path,
                                                                     clean: dict[str, str]) -> None:
    dst = tmp_path / "ds"
    with pytest.raises(DiskFullError) as e:
        fastfeed.pack(src, dst, progress=_fill_on_start(f"shard-000001.tar.{os.getpid()}.tmp", dst), **ARGS)
    err = e.value
    assert isinstance(err, DestinationError) and isinstance(err, OSError) and err.errno == errno.ENOSPC
    text = str(err)
    assert text.startswith(f"{dst}: no space left on the device (writing shard-000001.tar.{os.getpid()}.tmp)")
    assert " free there, and this pack still has about " in text and "run the same command again" in text
    assert err.path == str(dst) and err.free is not None and err.free > 0
    assert err.needed is not None and err.needed > 0
    assert (dst / "shard-000000.tar").is_file()  # the shard written before is kept for the re-run
    assert not list(dst.glob("*.tmp")) and not (dst / "index.json").exists()
    fastfeed.pack(src, dst, **ARGS)  # space is back: the same call finishes the job
    assert tree_digest(dst) == clean


def test_a_full_disk_while_writing_the_index_then_the_cli(src: Path, tmp_path: Path, clean: dict[str, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "ds"
    with pytest.raises(DiskFullError, match=r"no space left on the device \(writing \.checksums\.npy\.tmp-"):
        fastfeed.pack(src, dst, progress=_fill_on_start(f".checksums.npy.tmp-{os.getpid()}", dst), **ARGS)
    assert not (dst / "index.json").exists() and not list(dst.glob(".*.tmp-*"))
    # the CLI (in this process, so the pid of its temporary names is known): one line, exit 2
    _full(dst / f".index.json.tmp-{os.getpid()}")
    code = main(["pack", str(src), str(dst), "--samples-per-shard", "3", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{dst}: no space left on the device (writing .index.json.tmp-{os.getpid()})" in err
    assert "internal error" not in err and "Traceback" not in err
    assert not (dst / "index.json").exists()
    assert main(["pack", str(src), str(dst), "--samples-per-shard", "3", "--workers", "1"]) == 0
    assert tree_digest(dst) == clean


def test_a_full_disk_while_recording_an_lmdb_shard(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    record = f".fastfeed-pack/.shard-000000.json.tmp-{os.getpid()}"  # written after the LMDB shard, before its rename
    with pytest.raises(DiskFullError, match=r"no space left on the device \(writing \.shard-000000\.json\.tmp-"):
        fastfeed.pack(src, dst, format="lmdb", progress=_fill_on_start(record, dst), **ARGS)
    assert not list(dst.glob("*.tmp")) and not (dst / "shard-000000.lmdb").exists()
    fastfeed.pack(src, dst, format="lmdb", **ARGS)
    assert fastfeed.verify(dst).ok


def test_lmdb_disk_error_is_a_full_disk() -> None:
    lmdb = pytest.importorskip("lmdb")
    from fastfeed.packing.dest import full_disk_errno

    assert full_disk_errno(lmdb.DiskError("mdb_txn_commit: No space left on device")) == errno.ENOSPC
    assert full_disk_errno(lmdb.MapFullError("MDB_MAP_FULL")) is None


def test_other_os_errors_pass_unchanged(tmp_path: Path) -> None:
    from fastfeed.packing.dest import on_full_disk

    with pytest.raises(PermissionError):
        with on_full_disk(tmp_path):
            raise PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(DiskFullError, match="quota") as e:
        with on_full_disk(tmp_path, needed=lambda: 10**9):
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / "x"))
    assert e.value.errno == errno.EDQUOT and isinstance(e.value, FastfeedError)


def test_the_error_crosses_from_a_writer_process() -> None:
    """Pool writers send it to the pack process pickled: its attributes survive."""
    import pickle

    err = DiskFullError("/data/ff: no space left", path="/data/ff", free=10, needed=2000, errno=errno.EDQUOT)
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.path, back.free, back.needed, back.errno) == (
        DiskFullError, "/data/ff: no space left", "/data/ff", 10, 2000, errno.EDQUOT)
