"""What a new user meets on day one with ``fastfeed pack`` / ``info`` / ``verify`` (issue #17,
item 6): a stray file in an ImageFolder, a folder of WebDataset tars, a truncated JPEG, a
shard size without its unit. Nothing may be silently wrong: every case keeps the data or
stops with an error naming the way out."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fastfeed.cli import main
from fastfeed.errors import BadFileError, ConfigError, SourceError
from fastfeed.packed.checks import info, verify
from fastfeed.packed.reader import DatasetReader, resolve_index
from fastfeed.packing.api import pack
from tools.synth import make_image_folder, make_jpeg


def _truncated(data: bytes) -> bytes:
    """A real JPEG cut short, as an interrupted copy leaves it."""
    return data[: len(data) * 2 // 3]


def _write_tar(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    with tarfile.open(path, "w") as tf:
        for key, fields in samples:
            for ext, data in fields.items():
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))


def _wds(root: Path, shards: int = 3, per: int = 4) -> Path:
    """A folder of WebDataset tars: jpg + cls + json per sample."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for t in range(shards):
        _write_tar(root / f"train-{t:06d}.tar",
                   [(f"s{t}/{i:04d}", {"jpg": make_jpeg(rng, (32, 24)), "cls": b"%d" % ((t + i) % 3),
                                       "json": json.dumps({"t": t, "i": i}).encode()}) for i in range(per)])
    return root


# ---------------------------------------------------------------- 1: a stray file in an ImageFolder
def test_stray_readme_keeps_the_imagefolder_and_its_labels(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = make_image_folder(tmp_path / "train", num_images=12, num_classes=3, size=(32, 24))
    (src / "n00000001" / "README.txt").write_text("downloaded from ...")
    with caplog.at_level(logging.WARNING, "fastfeed.pack"):
        idx = pack(src, tmp_path / "o")
    assert idx.input == "imagefolder" and idx.num_samples == 12 and idx.classes is not None
    assert len(idx.classes) == 3 and idx.labels is not None and sorted(set(idx.labels.tolist())) == [0, 1, 2]
    assert [(d["path"], "stray" in d["reason"]) for d in idx.skipped] == [("n00000001/README.txt", True)]
    assert "n00000001/README.txt" in (tmp_path / "o" / "skipped.txt").read_text()
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "n00000001/README.txt" in warned and "--input files" in warned
    # the summary names the kind detected and the class count, text and JSON
    assert main(["pack", str(src), str(tmp_path / "o2")]) == 0
    out = capsys.readouterr().out
    assert "(input: imagefolder, 3 classes)" in out and "skipped 1 input(s)" in out
    assert f"fastfeed verify {tmp_path / 'o2'}" in out
    assert main(["pack", str(src), str(tmp_path / "o3"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["input"] == "imagefolder" and summary["classes"] == 3 and summary["skipped"] == 1


def test_really_mixed_tree_is_an_error_naming_both_ways_out(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "train", num_images=6, num_classes=2, size=(16, 16))
    for c in ("n00000000", "n00000001"):
        for i in range(3):
            (src / c / f"notes_{i}.txt").write_text("x")  # 6 unrelated non-images: not strays
    with pytest.raises(SourceError, match=r"not an ImageFolder: 6 of 12 files .*--input imagefolder "
                                          r"--on-error skip.*--input files"):
        pack(src, tmp_path / "o")
    assert pack(src, tmp_path / "o2", input="files").input == "files"  # both ways out work
    kept = pack(src, tmp_path / "o3", input="imagefolder", on_error="skip")
    assert kept.num_samples == 6 and len(kept.skipped) == 6 and kept.has_labels


def test_sidecars_sharing_keys_still_make_a_files_pack(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "train", num_images=4, num_classes=2, size=(16, 16))
    for p in sorted(src.rglob("*.jpg")):
        p.with_suffix(".json").write_text('{"caption": "a"}')
    idx = pack(src, tmp_path / "o")
    assert idx.input == "files" and idx.fields == ("jpg", "json") and idx.num_samples == 4


# ---------------------------------------------------------------- 2: a folder of WebDataset tars
def test_pack_converts_webdataset_tars_member_by_member(tmp_path: Path) -> None:
    src = _wds(tmp_path / "wds")
    # the source bytes kept (restart markers re-code JPEGs, pixel-identical but other bytes)
    idx = pack(src, tmp_path / "o", samples_per_shard=5, shuffle=False, jpeg_restarts=False)
    assert idx.input == "webdataset" and idx.num_samples == 12 and idx.fields == ("cls", "jpg", "json")
    assert idx.has_labels and idx.labels is not None
    packed = DatasetReader(resolve_index(tmp_path / "o"))
    raw = DatasetReader(resolve_index(src))  # what the loader reads from the tars themselves
    by_key = {raw.read(i)["__key__"]: raw.read(i) for i in range(12)}
    for i in range(12):
        s = packed.read(i)
        assert s == by_key[s["__key__"]]  # same keys, same fields, same bytes
        assert int(idx.labels[i]) == int(s["cls"])
    assert verify(tmp_path / "o").ok


def test_pack_of_webdataset_tars_reports_duplicate_keys_and_gzip(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "dup"
    src.mkdir()
    jpg = make_jpeg(np.random.default_rng(1), (16, 16))
    _write_tar(src / "a.tar", [("k/0001", {"jpg": jpg})])
    _write_tar(src / "b.tar", [("k/0001", {"jpg": jpg}), ("k/0002", {"jpg": jpg})])
    with pytest.raises(BadFileError, match=r"b.tar:k/0001: duplicate key 'k/0001' \(also in a.tar\)"):
        pack(src, tmp_path / "o")
    kept = pack(src, tmp_path / "o2", on_error="skip")
    assert kept.num_samples == 2 and [d["path"] for d in kept.skipped] == ["b.tar:k/0001"]
    (src / "notes.txt").write_text("x")  # tars among other files: packed whole, with a warning
    with caplog.at_level(logging.WARNING, "fastfeed.pack"):
        assert pack(src, tmp_path / "o4").fields == ("tar", "txt")
    assert any("packed whole" in r.getMessage() and "--input webdataset" in r.getMessage() for r in caplog.records)
    gz = tmp_path / "gz"
    gz.mkdir()
    (gz / "a.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(ConfigError, match=r"a.tar.gz is a gzipped tar .*decompress them first"):
        pack(gz, tmp_path / "o3")


def test_info_verify_and_tune_accept_webdataset_tars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _wds(tmp_path / "wds")
    d = info(src)
    assert d["foreign"] is True and d["num_samples"] == 12 and "fastfeed pack" in d["note"]
    assert main(["info", str(src)]) == 0
    assert "WebDataset tars without a fastfeed index" in capsys.readouterr().out
    report = verify(src)
    assert report.ok and report.samples == 12 and report.images == 12, report.problems
    assert main(["verify", str(src), "--workers", "1"]) == 0
    # a damaged member: named, with the fix
    rng = np.random.default_rng(2)
    _write_tar(src / "train-000009.tar", [("s9/0000", {"jpg": make_jpeg(rng, (32, 24))}),
                                          ("s9/0001", {"jpg": _truncated(make_jpeg(rng, (64, 48)))})])
    bad = verify(src)
    assert not bad.ok and len(bad.problems) == 1
    assert "train-000009.tar: sample 's9/0001' field 'jpg': image does not decode" in bad.problems[0]
    assert "s9/0001.jpg of this tar is damaged" in bad.problems[0] and "--on-error skip" in bad.problems[0]
    # a tar cut short: its readable samples are checked, the loss named
    cut = src / "train-000009.tar"
    cut.write_bytes(cut.read_bytes()[:1500])
    broken = verify(src)
    assert not broken.ok and any("train-000009.tar" in p and "runs past the end" in p for p in broken.problems)


@pytest.mark.slow
def test_tune_accepts_webdataset_tars(tmp_path: Path) -> None:
    from fastfeed.tuning.api import tune

    src = _wds(tmp_path / "wds", shards=2, per=8)  # it used to require index.json (doctor suggested it anyway)
    r = tune(src, batch_size=4, image_size=16, time_budget="6s", max_workers=1, store=False)
    assert r.samples_per_s > 0 and r.num_workers <= 1 and r.path == str(src)


# ---------------------------------------------------------------- 3: a truncated JPEG
def test_truncated_jpeg_is_a_bad_file_in_pack(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "train", num_images=6, num_classes=2, size=(64, 48))
    victim = src / "n00000001" / "img_00000003.jpg"
    victim.write_bytes(_truncated(victim.read_bytes()))
    with pytest.raises(BadFileError, match=r"n00000001/img_00000003.jpg: truncated JPEG: no end-of-image "
                                           r"marker \(FF D9\).*pass --on-error skip"):
        pack(src, tmp_path / "o")
    idx = pack(src, tmp_path / "o2", on_error="skip")
    assert idx.num_samples == 5 and [d["path"] for d in idx.skipped] == ["n00000001/img_00000003.jpg"]
    assert verify(tmp_path / "o2").ok
    # zero padding after EOI (as some writers leave) is not truncation
    padded = src / "n00000000" / "img_00000000.jpg"
    victim.unlink()
    padded.write_bytes(padded.read_bytes() + b"\0" * 300)
    assert pack(src, tmp_path / "o3").num_samples == 5


def test_truncated_jpeg_inside_a_webdataset_tar_names_the_member(tmp_path: Path) -> None:
    src = tmp_path / "wds"
    src.mkdir()
    rng = np.random.default_rng(3)
    _write_tar(src / "a.tar", [("x/0", {"jpg": make_jpeg(rng, (32, 24))}),
                               ("x/1", {"jpg": _truncated(make_jpeg(rng, (64, 48)))})])
    with pytest.raises(BadFileError, match=r"a.tar:x/1.jpg: truncated JPEG"):
        pack(src, tmp_path / "o")
    assert pack(src, tmp_path / "o2", on_error="skip").num_samples == 1


def test_verify_names_the_source_file_and_the_fix(tmp_path: Path) -> None:
    from PIL import Image

    src = make_image_folder(tmp_path / "train", num_images=4, num_classes=2, size=(32, 24))
    buf = io.BytesIO()
    noise = np.random.default_rng(4).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buf, format="PNG")
    (src / "n00000001" / "scan_7.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])  # passes pack
    dst = tmp_path / "o"
    pack(src, dst)
    report = verify(dst)
    assert not report.ok and len(report.problems) == 1
    text = report.problems[0]
    assert "sample 'n00000001/scan_7' field 'png': image does not decode" in text
    assert "n00000001/scan_7.png under the packed SRC" in text and "fastfeed pack --overwrite" in text


# ---------------------------------------------------------------- 4: --shard-size without a unit
def test_shard_size_without_unit_below_1mb_is_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = make_image_folder(tmp_path / "train", num_images=6, num_classes=2, size=(16, 16))
    with pytest.raises(ConfigError, match=r"shard_size='256' has no unit, so it means 256 bytes.*write 256MB"):
        pack(src, tmp_path / "o", shard_size="256")
    assert main(["pack", str(src), str(tmp_path / "o"), "--shard-size", "256"]) == 2
    assert "write 256MB if you meant megabytes" in capsys.readouterr().err
    assert pack(src, tmp_path / "o1", shard_size="256MB").options["shard_size"] == 256_000_000
    assert pack(src, tmp_path / "o2", shard_size="2000000").options["shard_size"] == 2_000_000
    assert len(pack(src, tmp_path / "o3", shard_size="2KB").shards) > 1  # a unit: small on purpose
    with caplog.at_level(logging.WARNING, "fastfeed.pack"):
        assert len(pack(src, tmp_path / "o4", shard_size=2000).shards) > 1  # the Python API: bytes
    assert any("very small" in r.getMessage() for r in caplog.records)
