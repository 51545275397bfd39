"""Files from outside the source (issue 27, part 2): a symlink out of SRC, an absolute or ``../`` path of a
JSONL manifest is an error naming it and ``--allow-outside`` (or a counted skip); with ``allow_outside`` it
is packed and counted in the summary and the index. Links that stay inside SRC (a symlink farm) pack as
they always did. A manifest path that does not exist is an error naming its line, never stored as text."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

import fastfeed
from fastfeed.cli import main
from fastfeed.errors import BadFileError, EmptySourceError, UnsafePathError
from fastfeed.packing.api import pack
from fastfeed.packing.sources.remote import UrlTree
from fastfeed.packing.sources.tree import LocalTree


def _jpeg(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 12), (shade, 40, 200 - shade)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _manifest(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _skipped(dst: Path) -> dict[str, str]:
    return {s["path"]: s["reason"] for s in fastfeed.DatasetIndex.load(dst).skipped}


# ---------------------------------------------------------------- JSONL manifests
def test_manifest_paths_outside_its_folder_and_missing(tmp_path: Path) -> None:
    away = _write(tmp_path / "elsewhere" / "x.jpg", _jpeg(1))
    inside = _write(tmp_path / "m" / "img" / "a.jpg", _jpeg(2))
    m = _manifest(tmp_path / "m" / "train.jsonl", [
        {"image": "img/a.jpg", "caption": "inside, relative"},
        {"image": "../elsewhere/x.jpg", "caption": "climbs out"},
        {"image": str(away), "caption": "absolute, elsewhere"},
        {"image": str(inside), "caption": "absolute, inside: fine"},
        {"image": "img/missing.jpg", "caption": "not there"},
    ])
    with pytest.raises(UnsafePathError) as e:
        pack(m, tmp_path / "o")
    msg = str(e.value)
    assert msg.startswith(f"{m}:2: field 'image' names '../elsewhere/x.jpg', which resolves outside the manifest's "
                          f"folder (to {away})")
    assert "--allow-outside" in msg and "--on-error skip" in msg and "also 2 more problem(s)" in msg
    assert f"{m}:3: field 'image' names '{away}'" in msg and f"{m}:5: field 'image' names 'img/missing.jpg'" in msg
    assert not (tmp_path / "o" / "index.json").exists()

    idx = pack(m, tmp_path / "skip", on_error="skip", shuffle=False)  # counted skips, nothing from outside
    assert idx.num_samples == 2 and idx.outside is None
    reasons = _skipped(tmp_path / "skip")
    assert sorted(reasons) == ["train.jsonl:2", "train.jsonl:3", "train.jsonl:5"]
    assert "resolves outside the manifest's folder" in reasons["train.jsonl:3"]
    assert "which is not a file" in reasons["train.jsonl:5"]

    allowed = pack(m, tmp_path / "allowed", on_error="skip", allow_outside=True, shuffle=False)
    assert allowed.num_samples == 4 and list(_skipped(tmp_path / "allowed")) == ["train.jsonl:5"]
    assert allowed.outside == {"files": 2, "roots": [str(away.parent)]}
    assert json.loads((tmp_path / "allowed" / "index.json").read_text())["outside"] == allowed.outside
    assert allowed.options["allow_outside"] is True and "allow_outside" not in idx.options
    assert fastfeed.verify(tmp_path / "allowed").ok


def test_a_manifest_whose_image_paths_all_miss_is_an_error_not_text(tmp_path: Path) -> None:
    m = _manifest(tmp_path / "m.jsonl", [{"image": f"img/{i:04d}.jpg", "caption": f"a cat, {i}"} for i in range(3)])
    with pytest.raises(BadFileError, match=r"m.jsonl:1: field 'image' names 'img/0000.jpg', which is not a file "
                                           r"\(paths are relative to the manifest's folder\); fix the path"):
        pack(m, tmp_path / "o")
    with pytest.raises(EmptySourceError, match=r"all 3 candidate\(s\) were skipped; first: m.jsonl:1"):
        pack(m, tmp_path / "o2", on_error="skip")
    # texts that merely end like a file name stay texts; a field of media paths is read from the files
    _write(tmp_path / "img" / "0001.jpg", _jpeg(3))
    m2 = _manifest(tmp_path / "m2.jsonl", [{"image": "img/0001.jpg", "caption": "see example.com", "v": "1.5"}])
    idx = pack(m2, tmp_path / "o3")
    assert idx.fields == ("caption.txt", "image.jpg", "v.txt")


# ---------------------------------------------------------------- symlinks in a folder
def test_a_symlink_farm_inside_the_tree_packs(tmp_path: Path) -> None:
    """Links (files and a folder, relative and absolute) whose targets stay inside SRC: a DVC-style cache
    under a hidden folder, which is itself never packed."""
    src = tmp_path / "src"
    store = src / ".store"
    for i in range(3):
        _write(store / f"{i:02d}", _jpeg(10 * i))
        (src / "cat").mkdir(parents=True, exist_ok=True)
        (src / "cat" / f"{i}.jpg").symlink_to(Path("..") / ".store" / f"{i:02d}")  # relative
    _write(store / "dogs" / "d.jpg", _jpeg(99))
    (src / "dog").symlink_to(store / "dogs")  # absolute, a folder
    idx = pack(src, tmp_path / "o", shuffle=False)
    assert idx.input == "imagefolder" and idx.classes == ("cat", "dog") and idx.num_samples == 4
    assert idx.outside is None and "outside" not in json.loads((tmp_path / "o" / "index.json").read_text())
    assert fastfeed.verify(tmp_path / "o").ok


def test_a_link_out_of_the_tree_is_refused_or_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    for i in range(4):
        _write(src / f"c{i % 2}" / f"{i}.jpg", _jpeg(i))
    secret = _write(tmp_path / "system" / "passwd.jpg", _jpeg(77))  # a file the user never meant to pack
    _write(tmp_path / "pool" / "n01" / "a.jpg", _jpeg(5))
    (src / "c0" / "evil.jpg").symlink_to(secret)
    (src / "c1" / "sub").symlink_to(tmp_path / "pool" / "n01")  # a folder out of the tree
    with pytest.raises(UnsafePathError) as e:
        pack(src, tmp_path / "o")
    assert str(e.value).startswith(f"{src}/c0/evil.jpg: resolves outside SRC (to {secret}, through a symlink); "
                                   "pass --allow-outside to pack files from outside SRC (counted in the pack "
                                   "summary and the index)")
    assert f"{src}/c1/sub/a.jpg: resolves outside SRC" in str(e.value)

    idx = pack(src, tmp_path / "skip", on_error="skip")
    assert idx.num_samples == 4 and sorted(_skipped(tmp_path / "skip")) == ["c0/evil.jpg", "c1/sub/a.jpg"]

    assert main(["pack", str(src), str(tmp_path / "cli"), "--allow-outside", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"2 file(s) from outside SRC (--allow-outside), in {tmp_path / 'pool' / 'n01'}, {secret.parent}" in out
    allowed = fastfeed.DatasetIndex.load(tmp_path / "cli")
    assert allowed.num_samples == 6 and allowed.skipped == ()
    assert allowed.outside == {"files": 2, "roots": [str(tmp_path / "pool" / "n01"), str(secret.parent)]}
    assert main(["pack", str(src), str(tmp_path / "cli"), "--allow-outside", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outside"] == allowed.outside  # already complete: the same entry


def test_where_a_path_resolves(tmp_path: Path) -> None:
    """The two trees' answer to "is this file outside the root?" (a manifest's paths, a walk's links)."""
    root = tmp_path / "root"
    _write(root / "a" / "x.jpg", b"x")
    (root / "up").symlink_to(tmp_path)
    tree = LocalTree(root)
    assert tree.outside("a/x.jpg") is None and tree.outside(str(root / "a" / "x.jpg")) is None
    assert tree.outside("a/../a/x.jpg") is None
    assert tree.outside("../y.jpg") == str(tmp_path / "y.jpg")
    assert tree.outside("up/y.jpg") == str(tmp_path / "y.jpg")  # through a symlinked folder
    assert tree.outside("/etc/passwd") == "/etc/passwd"
    url = UrlTree("s3://bucket/train")  # object keys: nothing resolved, only what climbs out
    assert url.outside("img/a.jpg") is None and url.outside("img/../b.jpg") is None
    assert url.outside("../other/a.jpg") == "s3://bucket/train/../other/a.jpg"
    assert url.outside("/etc/passwd") == "/etc/passwd" and url.outside("s3://x/y.jpg") == "s3://x/y.jpg"
