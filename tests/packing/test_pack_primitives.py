"""One of each primitive: the image-extension set, the CPU count of ``workers="auto"``, the
``on_error`` vocabulary; each used the same way by ``pack``, ``verify`` and the loader."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

import fastfeed
from fastfeed import host
from fastfeed.cli import main
from fastfeed.decode import fields
from fastfeed.errors import BadFileError
from fastfeed.formats import naming
from fastfeed.packing.api import pack
from fastfeed.packing.options import PackOptions


def _image(fmt: str, size: tuple[int, int] = (40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 40, 90)).save(buf, fmt)
    return buf.getvalue()


def test_one_image_extension_set(tmp_path: Path) -> None:
    """Extensions the loader decodes as images are the ones pack checks and verify decodes."""
    assert fields.IMAGE_EXTENSIONS is naming.IMAGE_EXTENSIONS
    src = tmp_path / "src"
    files = {"a/0.tga": "TGA", "a/1.ico": "ICO", "b/2.pcx": "PCX", "b/3.sgi": "SGI", "b/4.jpeg": "JPEG"}
    for rel, fmt in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(_image(fmt))
    idx = pack(src, tmp_path / "out", samples_per_shard=2)
    assert idx.input == "imagefolder" and idx.num_samples == 5  # every one detected as an image
    assert set(idx.fields) == {"cls", "tga", "ico", "pcx", "sgi", "jpg"}
    assert all(fields.is_image(f) for f in idx.fields if f != "cls")
    report = fastfeed.verify(tmp_path / "out")
    assert report.ok and report.images == 5, report.problems
    (src / "b" / "5.pcx").write_bytes(b"plain text, not a PCX image")
    with pytest.raises(BadFileError, match="has an image extension but is not an image"):
        pack(src, tmp_path / "bad")


def test_workers_auto_honours_the_cgroup_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pack and verify size ``workers="auto"`` by host.cpu_count (affinity and CPU quota)."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5
    monkeypatch.setattr(host, "_CGROUP", cgroup)
    assert host.cpu_count() == 1
    assert PackOptions.create(workers="auto").workers == 1
    (tmp_path / "src" / "c").mkdir(parents=True)
    (tmp_path / "src" / "c" / "x.png").write_bytes(_image("PNG"))
    pack(tmp_path / "src", tmp_path / "out")
    assert fastfeed.verify(tmp_path / "out", workers="auto").ok


def _bad_source(root: Path) -> Path:
    (root / "c").mkdir(parents=True)
    (root / "c" / "good.png").write_bytes(_image("PNG"))
    (root / "c" / "bad.png").write_bytes(b"")
    return root


def test_on_error_raise_is_the_default_and_fail_the_old_spelling(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src = _bad_source(tmp_path / "src")
    with pytest.raises(BadFileError, match="zero-byte file"):
        pack(src, tmp_path / "a")
    assert PackOptions().on_error == "raise"
    with pytest.warns(FutureWarning, match="old spelling of 'raise'"):
        with pytest.raises(BadFileError, match="zero-byte file"):
            pack(src, tmp_path / "b", on_error="fail")
    with pytest.warns(FutureWarning, match="old spelling"):
        assert main(["pack", str(src), str(tmp_path / "c"), "--on-error", "fail"]) != 0
    assert "zero-byte file" in capsys.readouterr().err
    assert main(["pack", str(src), str(tmp_path / "d"), "--on-error", "skip"]) == 0
    assert fastfeed.info(tmp_path / "d")["num_skipped"] == 1


def test_one_key_rule_for_pack_and_readers(tmp_path: Path) -> None:
    """pack groups files by the key rule webdataset reads its shards with; metadata names are no samples."""
    wds = pytest.importorskip("webdataset")
    src = tmp_path / "src"
    png = _image("PNG")
    names = {"a.v2/0001.seg.PNG": png, "a.v2/0001.json": b"{}", "b/0002.tar.gz.txt": b"t", "b/0002.cls": b"3",
             "__meta__/info.json": b"{}"}
    for rel, data in names.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    with pytest.raises(BadFileError, match="metadata to WebDataset readers"):
        pack(src, tmp_path / "strict", input="files")
    idx = pack(src, tmp_path / "out", input="files", shuffle=False, on_error="skip")
    assert [s["path"] for s in idx.skipped] == ["__meta__/info.json"]
    shard = str(tmp_path / "out" / idx.shards[0].name)
    theirs = [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
              for s in wds.WebDataset(shard, shardshuffle=False)]
    assert theirs == [{"__key__": "a.v2/0001", "json": b"{}", "seg.png": png},
                      {"__key__": "b/0002", "cls": b"3", "tar.gz.txt": b"t"}]
    assert idx.fields == ("cls", "json", "seg.png", "tar.gz.txt")
