"""Every bad-input case of ``fastfeed pack``: an error naming the path and the fix, or, with
``on_error="skip"``, a counted skip in ``DST/skipped.txt`` and the index (nothing dropped
silently, shards still balanced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastfeed
from _pack_data import messy_images, shard_samples
from fastfeed.errors import (
    BadFileError,
    ConfigError,
    DestinationError,
    DuplicateKeyError,
    EmptySourceError,
    SourceError,
    UnsafePathError,
)
from fastfeed.packing.api import pack

REPO = Path(__file__).resolve().parents[2]


def _jpg() -> bytes:
    return messy_images()["progressive.jpg"][0]


def _folder(root: Path, n: int = 8, classes: int = 2) -> Path:
    for i in range(n):
        p = root / f"c{i % classes}" / f"img{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_jpg())
    return root


def _skip_listing(dst: Path) -> list[list[str]]:
    lines = (dst / "skipped.txt").read_text().splitlines()
    assert lines[0].startswith("# fastfeed pack skipped")
    return [line.split("\t") for line in lines[1:]]


def _check_skipped(dst: Path, expected_paths: set[str], reason: str, samples: int) -> None:
    idx = fastfeed.DatasetIndex.load(dst)
    rows = _skip_listing(dst)
    assert {r[0] for r in rows} == expected_paths
    assert all(reason in r[2] for r in rows), rows
    assert len(idx.skipped) == len(rows) == idx.to_json()["num_skipped"]
    assert idx.num_samples == samples
    assert max(idx.shard_counts) - min(idx.shard_counts) <= 1
    assert fastfeed.verify(dst).ok


# ---------------------------------------------------------------- file content
def test_zero_byte_file(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    (src / "c1" / "empty.jpg").write_bytes(b"")
    with pytest.raises(BadFileError, match=r"c1/empty.jpg: zero-byte file; remove it .*--on-error skip"):
        pack(src, tmp_path / "o")
    assert not (tmp_path / "o" / "index.json").exists()
    pack(src, tmp_path / "o2", on_error="skip", samples_per_shard=3)
    _check_skipped(tmp_path / "o2", {"c1/empty.jpg"}, "zero-byte", 8)


def test_not_an_image_with_image_extension(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src", n=9)
    (src / "c0" / "fake.jpg").write_bytes(b"<html>not a picture</html>")
    (src / "c1" / "text.png").write_bytes(b"hello")
    with pytest.raises(BadFileError, match=r"c0/fake.jpg: has an image extension but is not an image .*"
                                           r"fix or remove the file"):
        pack(src, tmp_path / "o")
    pack(src, tmp_path / "o2", on_error="skip", samples_per_shard=3)
    # found before shards were cut: 9 good samples in 3 full shards
    _check_skipped(tmp_path / "o2", {"c0/fake.jpg", "c1/text.png"}, "not an image", 9)
    assert list(fastfeed.DatasetIndex.load(tmp_path / "o2").shard_counts) == [3, 3, 3]


def test_image_decode_failure_with_max_side(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    (src / "c1" / "truncated.jpg").write_bytes(_jpg()[:700])  # valid header, data cut off
    with pytest.raises(BadFileError, match=r"c1/truncated.jpg: cannot decode image for --max-side"):
        pack(src, tmp_path / "o", max_side=32)
    pack(src, tmp_path / "o2", max_side=32, on_error="skip")
    _check_skipped(tmp_path / "o2", {"c1/truncated.jpg"}, "cannot decode image", 8)
    # without --max-side the JPEG's missing end-of-image marker finds it (it used to pass, for verify
    # or training to find); verify naming a damaged source file: test_pack_daycase.py
    with pytest.raises(BadFileError, match=r"c1/truncated.jpg: truncated JPEG"):
        pack(src, tmp_path / "o3")


def test_unreadable_file(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    locked = src / "c0" / "locked.jpg"
    locked.write_bytes(_jpg())
    locked.chmod(0)
    fail = _run_unprivileged(["pack", str(src), str(tmp_path / "o")])
    assert fail.returncode == 2, fail.stderr
    assert "c0/locked.jpg: not readable (permission denied); fix its permissions" in fail.stderr
    ok = _run_unprivileged(["pack", str(src), str(tmp_path / "o2"), "--on-error", "skip"])
    assert ok.returncode == 0, ok.stderr
    assert "skipped 1 input(s)" in ok.stdout
    _check_skipped(tmp_path / "o2", {"c0/locked.jpg"}, "not readable", 8)


def _drop_file_permission_override() -> None:
    """Root reads everything: drop CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH from the bounding set."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


def _run_unprivileged(args: list[str]) -> subprocess.CompletedProcess:
    preexec = _drop_file_permission_override if os.geteuid() == 0 else None
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        return subprocess.run([sys.executable, "-m", "fastfeed", *args], capture_output=True, text=True,
                              env=env, preexec_fn=preexec, timeout=120)
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot make a file unreadable for this user here ({e})")


# ---------------------------------------------------------------- keys and names
def test_duplicate_keys_in_files_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"s{i}.jpg").write_bytes(_jpg())
    (src / "a.jpg").write_bytes(_jpg())
    (src / "a.JPG").write_bytes(_jpg())
    (src / "b.jpeg").write_bytes(_jpg())
    (src / "b.jpg").write_bytes(_jpg())
    with pytest.raises(DuplicateKeyError, match=r"a.JPG: duplicate key 'a' field 'jpg' \(a.JPG, a.jpg\); rename"):
        pack(src, tmp_path / "o")
    pack(src, tmp_path / "o2", on_error="skip")
    _check_skipped(tmp_path / "o2", {"a.JPG", "a.jpg", "b.jpeg", "b.jpg"}, "duplicate key", 6)


def test_duplicate_keys_in_imagefolder(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    (src / "c0" / "x.jpg").write_bytes(_jpg())
    (src / "c0" / "x.png").write_bytes(messy_images()["rgba.png"][0])
    with pytest.raises(DuplicateKeyError, match=r"c0/x.jpg: duplicate key 'c0/x' field 'image' \(c0/x.jpg, c0/x.png\)"):
        pack(src, tmp_path / "o", input="imagefolder")
    pack(src, tmp_path / "o2", on_error="skip")
    _check_skipped(tmp_path / "o2", {"c0/x.jpg", "c0/x.png"}, "duplicate key", 8)


def test_duplicate_keys_in_jsonl(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    m.write_text("\n".join(json.dumps({"__key__": k, "txt": "t"}) for k in ["a", "b", "a", "c"]) + "\n")
    with pytest.raises(DuplicateKeyError, match=r"m.jsonl:3: duplicate __key__ 'a' \(also line 1\)"):
        pack(m, tmp_path / "o")
    idx = pack(m, tmp_path / "o2", on_error="skip")
    assert idx.num_samples == 3 and _skip_listing(tmp_path / "o2")[0][:2] == ["m.jsonl:3", "a"]


@pytest.mark.parametrize("key,why", [("../escape", "contains '..'"), ("/etc/passwd", "absolute path"),
                                     ("a\nb", "newline"), ("a/./b", "'.' path component"),
                                     ("x.y", "last part contains '.'")])
def test_unsafe_keys_in_jsonl(tmp_path: Path, key: str, why: str) -> None:
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"__key__": key, "txt": "x"}) + "\n" + json.dumps({"__key__": "ok", "txt": "y"}) + "\n")
    with pytest.raises(UnsafePathError, match=f"m.jsonl:1: unusable __key__ .*{why}.*fix __key__"):
        pack(m, tmp_path / "o")
    idx = pack(m, tmp_path / "o2", on_error="skip")
    assert idx.num_samples == 1 and "\n" not in (tmp_path / "o2" / "skipped.txt").read_text().split("\n", 1)[1][:-1]


def test_newline_and_undecodable_file_names(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    (src / "c0" / "bad\nname.jpg").write_bytes(_jpg())
    with pytest.raises(UnsafePathError, match=r"c0/bad\\nname.jpg: unusable name: name contains a newline"):
        pack(src, tmp_path / "o")
    os.mkdir(os.fsencode(src / "c1") + b"/sub")
    (Path(os.fsdecode(os.fsencode(src / "c1") + b"/sub/caf\xe9.jpg"))).write_bytes(_jpg())
    pack(src, tmp_path / "o2", on_error="skip")
    rows = _skip_listing(tmp_path / "o2")
    assert [r[0] for r in rows] == ["c0/bad\\nname.jpg", "c1/sub/caf\\xe9.jpg"]
    assert "not valid UTF-8" in rows[1][2]
    assert fastfeed.verify(tmp_path / "o2").ok


# ---------------------------------------------------------------- the tree
def test_symlink_loops(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    (src / "c0" / "loop").symlink_to("..")
    with pytest.raises(UnsafePathError, match=r"c0/loop: symlink loop \(points back to \.\); remove or fix"):
        pack(src, tmp_path / "o", input="imagefolder")
    (src / "c0" / "loop").unlink()
    (src / "c1" / "self.jpg").symlink_to("self.jpg")
    with pytest.raises(UnsafePathError, match=r"c1/self.jpg: symlink loop"):
        pack(src, tmp_path / "o")
    (src / "c0" / "loop").symlink_to("..")
    pack(src, tmp_path / "o2", on_error="skip", input="imagefolder")
    _check_skipped(tmp_path / "o2", {"c0/loop", "c1/self.jpg"}, "symlink loop", 8)


def test_symlinked_files_and_folders_are_followed(tmp_path: Path) -> None:
    real = _folder(tmp_path / "real")
    src = tmp_path / "src"
    src.mkdir()
    (src / "c0").symlink_to(real / "c0")
    (src / "c1").mkdir()
    (src / "c1" / "link.jpg").symlink_to(real / "c1" / "img001.jpg")
    (src / "c1" / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
    with pytest.raises(BadFileError, match=r"c1/dangling.jpg: broken symlink \(points to .*gone.jpg\)"):
        pack(src, tmp_path / "o")
    # links out of SRC are followed when asked (tests/packing/test_pack_confinement.py: the policy)
    idx = pack(src, tmp_path / "o2", on_error="skip", allow_outside=True)
    assert idx.num_samples == 5 and idx.classes == ("c0", "c1")


def test_special_files_are_refused(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    os.mkfifo(src / "c0" / "pipe.jpg")
    with pytest.raises(BadFileError, match=r"c0/pipe.jpg: not a regular file"):
        pack(src, tmp_path / "o")


def test_empty_sources(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptySourceError, match=r"empty: nothing to pack"):
        pack(tmp_path / "empty", tmp_path / "o")
    (tmp_path / "hidden" / ".git").mkdir(parents=True)
    (tmp_path / "hidden" / ".DS_Store").write_bytes(b"x")
    with pytest.raises(EmptySourceError):
        pack(tmp_path / "hidden", tmp_path / "o")
    (tmp_path / "m.jsonl").write_text("\n\n")
    with pytest.raises(EmptySourceError):
        pack(tmp_path / "m.jsonl", tmp_path / "o")
    src = tmp_path / "allbad" / "c0"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(b"")
    with pytest.raises(EmptySourceError, match=r"all 1 candidate\(s\) were skipped; first: c0/a.jpg: zero-byte"):
        pack(tmp_path / "allbad", tmp_path / "o", on_error="skip")
    with pytest.raises(SourceError, match="does not exist"):
        pack(tmp_path / "missing", tmp_path / "o")


def test_non_image_in_imagefolder_and_file_without_extension(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    (src / "c0" / "notes.txt").write_text("hi")
    with pytest.raises(BadFileError, match=r"c0/notes.txt: not an image file in an ImageFolder; remove it"):
        pack(src, tmp_path / "o", input="imagefolder")
    # detection: an ImageFolder with one stray file, left out and reported (was: files, labels lost)
    detected = pack(src, tmp_path / "o2")
    assert detected.input == "imagefolder" and detected.classes is not None
    assert [d["path"] for d in detected.skipped] == ["c0/notes.txt"]
    (src / "c0" / "LICENSE").write_text("x")
    with pytest.raises(BadFileError, match=r"c0/LICENSE: no usable extension .*KEY.EXT"):
        pack(src, tmp_path / "o3", input="files")


def test_jsonl_bad_lines_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(_jpg())
    (tmp_path / "empty.jpg").write_bytes(b"")
    m = tmp_path / "m.jsonl"
    m.write_text("\n".join([
        json.dumps({"image": "a.jpg", "n": 1}),
        "{not json",
        json.dumps({"image": "missing.jpg", "n": 2}),
        json.dumps({"image": "empty.jpg", "n": 3}),
        "[1, 2]",
        json.dumps({"image": "a.jpg", "n": 4}),
    ]) + "\n")
    with pytest.raises(BadFileError, match=r"m.jsonl:2: not valid JSON .*fix the line") as e:
        pack(m, tmp_path / "o")
    assert "also 3 more problem(s)" in str(e.value) and "m.jsonl:3: field 'image' names 'missing.jpg'" in str(e.value)
    idx = pack(m, tmp_path / "o2", on_error="skip", shuffle=False, jpeg_restarts=False)
    assert idx.num_samples == 2 and [r[0] for r in _skip_listing(tmp_path / "o2")] == \
        ["m.jsonl:2", "m.jsonl:3", "m.jsonl:4", "m.jsonl:5"]
    assert [s["image.jpg"] for s in shard_samples(tmp_path / "o2")] == [_jpg(), _jpg()]


def test_length_field_missing_or_unusable(tmp_path: Path) -> None:
    m = tmp_path / "m.jsonl"
    m.write_text("\n".join(json.dumps(r) for r in [{"t": "a b"}, {"u": "c"}, {"t": "d e f"}, {"t": 1.5}]) + "\n")
    with pytest.raises(SourceError, match=r"sample '000000001' has no field 't' for --length"):
        pack(m, tmp_path / "o", length="t")
    idx = pack(m, tmp_path / "o2", length="t", on_error="skip", shuffle=False)
    assert idx.lengths.tolist() == [2, 3] and len(idx.skipped) == 2
    with pytest.raises(ConfigError, match="ImageFolder holds only images"):
        pack(_folder(tmp_path / "imgs"), tmp_path / "o3", length="txt")


# ---------------------------------------------------------------- destination
def test_destination_inside_source(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    with pytest.raises(DestinationError, match=r"src/packed: the destination is inside the source .*outside SRC"):
        pack(src, src / "packed")
    with pytest.raises(DestinationError, match="inside the source"):
        pack(src, src)
    assert not (src / "packed").exists()


def test_non_empty_destination(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    dst = tmp_path / "o"
    dst.mkdir()
    (dst / "mine.txt").write_text("keep me")
    with pytest.raises(DestinationError, match=r"o: not empty \(mine.txt\); choose an empty .*--overwrite"):
        pack(src, dst)
    pack(src, dst, overwrite=True)
    assert (dst / "mine.txt").read_text() == "keep me" and fastfeed.verify(dst).ok
    (dst / "file").write_text("x")
    with pytest.raises(DestinationError, match="exists and is not a folder"):
        pack(src, dst / "file")


def test_unfinished_run_of_another_job_is_refused(tmp_path: Path) -> None:
    from fastfeed.packing.api import plan_pack, write_shard

    src = _folder(tmp_path / "src")
    plan = plan_pack(src, tmp_path / "o", samples_per_shard=2)
    write_shard(plan, 0)
    with pytest.raises(DestinationError, match="an unfinished run of another job"):
        pack(src, tmp_path / "o", samples_per_shard=3)
    idx = pack(src, tmp_path / "o", samples_per_shard=3, overwrite=True)
    assert len(idx.shards) == 3 and sorted(p.name for p in (tmp_path / "o").glob("shard-*.tar")) == \
        ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]


def test_bad_options() -> None:
    for kw, msg in [({"format": "zip"}, "format='zip'"), ({"shard_size": "big"}, "shard_size='big'"),
                    ({"samples_per_shard": 0}, "samples_per_shard=0"), ({"quality": 101}, "quality=101"),
                    ({"max_side": 2}, "max_side=2"), ({"on_error": "ignore"}, "on_error='ignore'"),
                    ({"input": "csv"}, "input='csv'"), ({"workers": -1}, "workers=-1")]:
        with pytest.raises(ConfigError, match=msg):
            pack("x", "y", **kw)
