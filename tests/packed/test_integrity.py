"""Integrity on the read path (issue 27, part 1): nothing on disk is trusted that pack did not vouch for.

Real packs of real JPEGs, damaged afterwards the way disks and careless users damage them: a
flipped byte in a JPEG member of a tar shard or in an LMDB data page (both ``on_error`` modes,
``num_workers`` 0 and 2), a rewritten ``labels.npy``, ``offsets.npy`` rows swapped or pointing at
another sample, labels outside the classes, float and object ``labels.npy``, and an index written
before checksums (it still loads, and says so once).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.errors import IndexMismatchError, SampleError
from fastfeed.formats.checksum import pack_algorithm
from fastfeed.packed import reader as reader_mod
from fastfeed.packed.index import DatasetIndex

BATCH = 4

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


@pytest.fixture(scope="module")
def packs(small_image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 60 photos of ``small_image_folder`` packed as tar and as LMDB, 20 samples a shard."""
    root = tmp_path_factory.mktemp("integrity")
    for fmt in ("tar", "lmdb"):
        fastfeed.pack(small_image_folder, root / fmt, format=fmt, samples_per_shard=20, workers=1, seed=0)
    return {fmt: root / fmt for fmt in ("tar", "lmdb")}


def _copy(src: Path, tmp_path: Path, name: str = "ds") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _keys(dl: object) -> list[str]:
    return [k for b in dl for k in b["__key__"]]  # type: ignore[attr-defined]


def _shut(dl: object) -> None:
    """End the workers of a pass that failed now (left to the garbage collector, with the traceback that
    holds them, their shutdown waits out torch's join timeouts: 10 s)."""
    it = getattr(dl, "_iterator", None)
    if it is not None:
        it._shutdown_workers()


def _flip_jpeg_byte(ds: Path, fmt: str, sample: int) -> str:
    """Flip one byte inside sample ``sample``'s JPEG data, in its shard on disk; return its key."""
    ds_reader = fastfeed.open_dataset(ds)
    got = ds_reader.source.read(sample)
    key, jpg = got["__key__"], got["jpg"]
    shard = ds / ds_reader.index.shards[int(ds_reader.index.shard_of(sample))].name
    data = bytearray(shard.read_bytes())
    at = data.find(jpg[len(jpg) // 2: len(jpg) // 2 + 64])  # an LMDB data page holds the record's bytes as they are
    assert at > 0
    data[at + 10] ^= 0x5A
    shard.write_bytes(bytes(data))
    return key


def test_pack_records_checksums_and_sidecar_hashes(packs: dict[str, Path]) -> None:
    for ds in packs.values():
        d = json.loads((ds / "index.json").read_text())
        entry = d["checksums"]
        assert entry["algorithm"] == pack_algorithm() and entry["samples"] == "checksums.npy"
        assert set(entry["sidecars"]) == set(d["arrays"]) == {"checksums.npy", "labels.npy", "offsets.npy",
                                                                "sizes.npy"}
        sums = np.load(ds / "checksums.npy")
        assert sums.dtype == np.uint64 and sums.shape == (60,)
        assert fastfeed.verify(ds).ok


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_byte_in_a_sample_is_an_error_or_a_counted_skip(packs: dict[str, Path], tmp_path: Path,
                                                                  fmt: str, workers: int) -> None:
    ds = _copy(packs[fmt], tmp_path)
    key = _flip_jpeg_byte(ds, fmt, 27)
    unit = "record" if fmt == "lmdb" else "offset"
    with pytest.raises(SampleError, match=rf"shard-000001\.{fmt}: sample '{key}' at {unit} \d+: its bytes' "
                                          r"\w+ checksum is [0-9a-f]{16}, the index recorded [0-9a-f]{16}.*"
                                          "on_error='skip'"):
        list(failed := fastfeed.loader(ds, batch_size=BATCH, image_size=16, num_workers=workers, shuffle=False))
    _shut(failed)
    dl = fastfeed.loader(ds, batch_size=BATCH, image_size=16, num_workers=workers, on_error="skip")
    keys = _keys(dl)
    assert key not in keys and len(keys) == 59
    assert dl.stats.skipped == 1 and key in dl.stats.skip_messages[0] and "checksum" in dl.stats.skip_messages[0]
    report = fastfeed.verify(ds)
    assert any(f"sample '{key}'" in p and "checksum" in p for p in report.problems), report.problems


def test_verify_false_reads_unchecked(packs: dict[str, Path], tmp_path: Path) -> None:
    ds = _copy(packs["tar"], tmp_path)
    key = _flip_jpeg_byte(ds, "tar", 3)
    dl = fastfeed.loader(ds, batch_size=BATCH, num_workers=0, decode=None, shuffle=False,
                         storage=fastfeed.Storage(verify=False))
    assert key in _keys(dl) and dl.stats.skipped == 0


def test_open_dataset_checks_what_it_reads(packs: dict[str, Path], tmp_path: Path) -> None:
    ds = _copy(packs["lmdb"], tmp_path)
    key = _flip_jpeg_byte(ds, "lmdb", 44)
    with pytest.raises(SampleError, match=f"sample '{key}'.*checksum"):
        fastfeed.open_dataset(ds)[44]


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_rewritten_labels_are_refused_when_opened(packs: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    ds = _copy(packs[fmt], tmp_path)
    labels = np.load(ds / "labels.npy")
    np.save(ds / "labels.npy", np.roll(labels, 1))  # still int64, still within the classes: only the hash tells
    with pytest.raises(IndexMismatchError, match=r"labels.npy: sha256 [0-9a-f]{16}\.\.\. differs from the "
                                                 r"[0-9a-f]{16}\.\.\. index.json recorded.*re-run `fastfeed pack`"):
        fastfeed.loader(ds, batch_size=BATCH, num_workers=0)
    assert any("labels.npy: sha256" in p for p in fastfeed.verify(ds).problems)


def test_offsets_swapped_or_pointing_at_another_sample(packs: dict[str, Path], tmp_path: Path) -> None:
    for name, change in (("swapped", lambda o: o[[1, 0, *range(2, len(o))]]),
                         ("twice", lambda o: np.concatenate([o[:1], o[:1], o[2:]]))):
        ds = _copy(packs["tar"], tmp_path, name)
        np.save(ds / "offsets.npy", change(np.load(ds / "offsets.npy")))
        with pytest.raises(IndexMismatchError, match="offsets.npy: sha256"):
            list(fastfeed.loader(ds, batch_size=BATCH, num_workers=0, decode=None))
        problems = fastfeed.verify(ds).problems
        assert any("offsets.npy: sha256" in p for p in problems)
        assert any("offsets.npy: row 0 (shard-000000.tar)" in p and "swapped or points at another sample" in p
                   for p in problems), problems


def _without_checksums(ds: Path) -> None:
    """Make ``ds`` look packed before checksums existed: no ``checksums`` entry, no checksums.npy."""
    d = json.loads((ds / "index.json").read_text())
    del d["checksums"]
    d["arrays"].remove("checksums.npy")
    (ds / "index.json").write_text(json.dumps(d))
    (ds / "checksums.npy").unlink()


def test_an_index_without_checksums_loads_and_says_so_once(packs: dict[str, Path], tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    ds = _copy(packs["tar"], tmp_path)
    _without_checksums(ds)
    reader_mod._UNCHECKED.discard(str(ds))
    with caplog.at_level(logging.INFO, logger="fastfeed"):
        for _ in range(2):
            assert len(_keys(fastfeed.loader(ds, batch_size=BATCH, image_size=16, num_workers=0))) == 60
    said = [r for r in caplog.records if "no checksums: re-pack to verify on read" in r.getMessage()]
    assert len(said) == 1 and str(ds) in said[0].getMessage()
    assert DatasetIndex.load(ds).checksums is None and fastfeed.verify(ds).ok


def test_offsets_pointing_at_another_sample_in_an_old_index(packs: dict[str, Path], tmp_path: Path) -> None:
    ds = _copy(packs["lmdb"], tmp_path)
    _without_checksums(ds)
    offsets = np.load(ds / "offsets.npy")
    offsets[[3, 4]] = offsets[[4, 3]]  # records swapped: no hash to tell, the order does
    np.save(ds / "offsets.npy", offsets)
    with pytest.raises(SampleError, match=r"offsets.npy: row 3 \(shard-000000.lmdb\): record 4 .* swapped or points "
                                          "at another sample"):
        list(fastfeed.loader(ds, batch_size=BATCH, num_workers=0, decode=None))


@pytest.mark.parametrize("bad", [7, 268435457])
def test_a_label_outside_the_classes_is_refused(packs: dict[str, Path], tmp_path: Path, bad: int) -> None:
    ds = _copy(packs["tar"], tmp_path)
    _without_checksums(ds)  # no hash to catch it: the range check must
    labels = np.load(ds / "labels.npy")
    labels[11] = bad
    np.save(ds / "labels.npy", labels)
    want = rf"labels.npy: label {bad} of sample 11 is outside the 3 classes of the index \(0-2, or -1 for none\)"
    with pytest.raises(IndexMismatchError, match=want):
        fastfeed.loader(ds, batch_size=BATCH, num_workers=0)
    report = fastfeed.verify(ds)
    assert not report.ok and any(f"label {bad} of sample 11" in p for p in report.problems)


def test_classes_that_no_longer_cover_the_labels(packs: dict[str, Path], tmp_path: Path) -> None:
    ds = _copy(packs["tar"], tmp_path)
    d = json.loads((ds / "index.json").read_text())
    d["classes"] = d["classes"][:2]  # the index edited by hand: labels 2 now name no class
    (ds / "index.json").write_text(json.dumps(d))
    problems = fastfeed.verify(ds).problems
    assert any("is outside the 2 classes of the index" in p for p in problems), problems


@pytest.mark.parametrize("kind", ["float", "object"])
def test_float_or_object_labels_are_a_clear_error(packs: dict[str, Path], tmp_path: Path, kind: str) -> None:
    ds = _copy(packs["tar"], tmp_path)
    _without_checksums(ds)
    labels = np.load(ds / "labels.npy")
    if kind == "float":
        np.save(ds / "labels.npy", labels.astype(np.float64) + 0.5)
        want = r"labels.npy: holds float64 values, fastfeed writes integers here"
    else:
        np.save(ds / "labels.npy", np.array([str(x) for x in labels], dtype=object), allow_pickle=True)
        want = r"labels.npy: not a plain .npy array fastfeed can read"
    with pytest.raises(IndexMismatchError, match=want):
        fastfeed.loader(ds, batch_size=BATCH, num_workers=0)
    with pytest.raises(IndexMismatchError, match=want):
        fastfeed.info(ds)
    report = fastfeed.verify(ds)
    assert not report.ok and any(("labels.npy: holds" if kind == "float" else "labels.npy: not a plain") in p
                                 for p in report.problems)
