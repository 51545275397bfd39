"""``fastfeed shapes DST`` writes into DST as pack does: under pack's lock (one writer at a time) and with
a full disk said as a :class:`DiskFullError` naming DST (a real ``ENOSPC`` from ``/dev/full``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import fastfeed
from _pack_data import tree_digest, write_messy_folder
from fastfeed.errors import DestinationBusyError, DiskFullError
from fastfeed.packing.dest import hold_destination
from fastfeed.packing.shapes import add_shapes


@pytest.fixture()
def ds(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    write_messy_folder(src)
    fastfeed.pack(src, tmp_path / "ds", samples_per_shard=3, workers=1)
    return tmp_path / "ds"


def test_shapes_refuses_a_dst_another_writer_holds(ds: Path) -> None:
    before = tree_digest(ds)
    with hold_destination(ds, command="fastfeed pack SRC DST"):
        with pytest.raises(DestinationBusyError, match="fastfeed pack SRC DST"):
            add_shapes(ds, overwrite=True)
    assert tree_digest(ds) == before
    assert add_shapes(ds, overwrite=True).written
    assert not (ds / ".fastfeed-pack.lock").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/dev/full"),
                    reason="needs Linux's /dev/full")
def test_a_full_disk_while_writing_sizes_names_dst_and_leaves_the_dataset_as_it_was(ds: Path) -> None:
    before = tree_digest(ds)
    tmp = ds / f".sizes.npy.tmp-{os.getpid()}"
    tmp.symlink_to("/dev/full")
    with pytest.raises(DiskFullError) as e:
        add_shapes(ds, overwrite=True)
    tmp.unlink(missing_ok=True)
    msg = str(e.value)
    assert msg.startswith(f"{ds}: no space left") and "sizes.npy" in msg and "run the same command again" in msg
    assert "resumes" not in msg and e.value.path == str(ds)
    assert tree_digest(ds) == before
    assert add_shapes(ds, overwrite=True).written
    assert fastfeed.verify(ds).ok
