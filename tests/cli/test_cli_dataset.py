"""``fastfeed pack``, ``info`` and ``verify``: what they print (the reports' text() and to_json()),
already-complete packs, progress without a terminal."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed._util import format_bytes
from fastfeed.cli import main
from fastfeed.cli.dataset import PackSummary
from fastfeed.packed.checks import InfoReport, VerifyReport, info
from fastfeed.packed.index import DatasetIndex

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py

_JPEG_STORE = "  store      jpeg (images as encoded files; `fastfeed pack --store raw` trades disk for CPU)"


# ---------------------------------------------------------------------- pack
def test_pack_json_and_already_complete(photos: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "o"
    assert main(["pack", str(photos / "train"), str(dst), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first == {"dst": str(dst), "already_complete": False, "num_samples": 60, "num_shards": 1,
                     "format": "tar", "bytes": first["bytes"], "skipped": 0, "input": "imagefolder",
                     "classes": 3}
    assert first["bytes"] == sum(s.bytes for s in DatasetIndex.load(dst).shards)
    assert main(["pack", str(photos / "train"), str(dst), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["already_complete"] is True
    assert main(["pack", str(photos / "train"), str(dst)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"already complete: {dst} holds these 60 samples") and "packed 60" not in out
    assert main(["pack", str(photos / "train"), str(dst), "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert out == PackSummary.of(DatasetIndex.load(dst), str(dst), already_complete=False).text() + "\n"
    assert out.splitlines() == [
        f"packed 60 samples into 1 tar shard(s), {format_bytes(first['bytes'])}, in {dst} (input: imagefolder, "
        "3 classes)",
        f"check it before training (every shard read, every image decoded): fastfeed verify {dst}"]


def test_pack_summary_of_skipped_inputs_and_raw_pixels(photos: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "train"
    (src / "n00000000").mkdir(parents=True)
    for f in sorted((photos / "train" / "n00000000").iterdir())[:6]:
        (src / "n00000000" / f.name).write_bytes(f.read_bytes())
    (src / "n00000000" / "broken.jpg").write_bytes(b"not a jpeg")
    dst = tmp_path / "o"
    assert main(["pack", str(src), str(dst), "--on-error", "skip", "--store", "raw", "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"packed 6 samples into 1 tar shard(s), ") and lines[0].endswith("1 class)")
    assert lines[1].startswith("store      raw pixels (rgb8): 6 image(s) as pixels, ") and "as JPEG" in lines[1]
    assert lines[2:] == [f"skipped 1 input(s); see {dst}/skipped.txt",
                         f"check it before training (every shard read, every image decoded): fastfeed verify {dst}"]


def test_progress_lines_without_a_terminal(photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import fastfeed._progress as progress

    # capsys: stderr is not a terminal. A run shorter than the interval prints no line ...
    assert main(["pack", str(photos / "train"), str(tmp_path / "quiet"), "--workers", "1"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)  # ... a longer one a line per interval
    assert main(["pack", str(photos / "train"), str(tmp_path / "o"), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and lines[-1].startswith("pack: 60/60 files (100%)") and "MB/s of" in lines[-1]
    assert "\r" not in err  # lines for a log file, not a bar
    assert main(["verify", str(tmp_path / "o")]) == 0
    assert "verify: 1/1 shards (100%)" in capsys.readouterr().err


def test_progress_line_every_interval(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    import fastfeed._progress as progress

    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.2)
    bar = progress.Progress("verify", "shard", tty=False)
    bar.update(1, 10)
    assert capsys.readouterr().err == ""  # not yet an interval
    time.sleep(0.25)
    bar.update(2, 10)
    bar.update(3, 10)  # within the interval of the last line
    assert capsys.readouterr().err.splitlines() == ["verify: 2/10 shards (20%), 0 s"]
    bar.update(10, 10)  # the end, since lines were shown
    assert capsys.readouterr().err.startswith("verify: 10/10 shards (100%)")


# ---------------------------------------------------------------------- info
@pytest.fixture(scope="module")
def six_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 6 classes (more than info shows), packed into 3 shards of 8, no restart markers."""
    from tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("six")
    make_image_folder(root / "train", num_images=24, num_classes=6, size=(40, 30))
    fastfeed.pack(root / "train", root / "ff", samples_per_shard=8, seed=3, jpeg_restarts=False, workers=1)
    return root / "ff"


def test_info_report_text_line_for_line(six_classes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = info(six_classes)
    assert isinstance(report, InfoReport) and isinstance(fastfeed.info(six_classes), fastfeed.InfoReport)
    idx = DatasetIndex.load(six_classes)
    assert report.text().splitlines() == [
        str(six_classes),
        f"  format     tar, DALI index files (packed from imagefolder by fastfeed {fastfeed.__version__}, "
        f"index v{idx.version})",
        f"  samples    24 in 3 shard(s) of 8, {format_bytes(sum(s.bytes for s in idx.shards))}",
        "  fields     cls, jpg",
        _JPEG_STORE,
        "  classes    6 (n00000000, n00000001, n00000002, n00000003, ...); 4 samples per class",
        "  aspect     24 images, width/height 1.33-1.33 (median 1.33): 4:3 100%",
        "  pixels     median 1,200 px (1,200 px-1,200 px)",
        "  order      shuffled (seed 3)",
        "  skipped    0",
    ]
    assert main(["info", str(six_classes)]) == 0
    assert capsys.readouterr().out == report.text() + "\n"


def test_info_report_json_and_mapping(six_classes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = info(six_classes)
    d = report.to_json()
    assert list(d) == ["path", "format", "input", "num_samples", "num_shards", "bytes", "samples_per_shard",
                       "shard_bytes", "fields", "num_classes", "classes", "has_labels", "dali_index", "num_skipped",
                       "lengths", "options", "fastfeed_version", "index_version", "fingerprint", "foreign", "store",
                       "samples_per_class", "aspect"]
    assert d["aspect"]["near"] == {"4:3": 24} and d["aspect"]["unknown"] == 0
    assert (d["num_samples"], d["num_classes"], d["classes"][-1], d["fields"]) == (24, 6, "n00000005", ["cls", "jpg"])
    assert d["samples_per_class"] == {"min": 4, "max": 4} and d["store"] == {"mode": "jpeg"}
    assert main(["info", str(six_classes), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(d))
    # what info() returned before it returned a report: a mapping of the same keys
    assert dict(report) == d and report == d and len(report) == len(d)
    assert report["num_samples"] == report.num_samples == 24 and report.get("tokenizer") is None
    assert "tokenizer" not in report and "note" not in report
    with pytest.raises(KeyError):
        report["no such key"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.num_samples = 1  # type: ignore[misc]
    d["options"]["seed"] = 99  # a copy: the report is unchanged
    assert report.options["seed"] == 3


def test_info_report_of_lengths_without_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.synth import make_text_jsonl

    src = make_text_jsonl(tmp_path / "texts.jsonl", num_samples=30, seed=1)
    fastfeed.pack(src, tmp_path / "ds", length="text", samples_per_shard=16, shuffle=False, workers=1)
    report = info(tmp_path / "ds")
    lengths = DatasetIndex.load(tmp_path / "ds").lengths
    assert report.classes is None and report.lengths is not None
    assert ("samples_per_class" in report) is report.has_labels  # labels (from the manifest) without class names
    text = report.text().splitlines()
    assert f"  lengths    text: min {lengths.min()}, median {np.median(lengths):g}, max {lengths.max()}, " \
           f"total {lengths.sum()}" in text
    assert not any(line.startswith("  classes") for line in text) and text[-1] == "  skipped    0"
    assert text[-2].startswith("  order      key order")
    assert main(["info", str(tmp_path / "ds"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"]["total"] == int(lengths.sum())


def test_info_report_of_webdataset_tars(tmp_path: Path) -> None:
    from tools.synth import make_jpeg

    rng = np.random.default_rng(0)
    (tmp_path / "wds").mkdir()
    for t in range(2):
        with tarfile.open(tmp_path / "wds" / f"train-{t:06d}.tar", "w") as tf:
            for i in range(3):
                for ext, data in (("jpg", make_jpeg(rng, (32, 24))), ("cls", b"%d" % i)):
                    member = tarfile.TarInfo(f"s{t}/{i:04d}.{ext}")
                    member.size = len(data)
                    tf.addfile(member, io.BytesIO(data))
    report = info(tmp_path / "wds")
    assert report.foreign and report.note is not None and report.to_json()["note"] == report.note
    text = report.text().splitlines()
    assert text[1] == f"  format     tar: {report.note}"
    assert not any(line.startswith("  store") for line in text)  # nothing was packed: no storage choice
    assert text[-2:] == ["  order      as stored in the tars", "  skipped    0"]


# ---------------------------------------------------------------------- verify
def test_verify_prints_its_report(photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(photos / "ff"), "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    assert out == "ok: 1 shard(s), 60 samples, 60 images decoded\n" and err == ""
    assert main(["verify", str(photos / "ff"), "--no-decode", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == fastfeed.verify(photos / "ff", decode=False).to_json()
    broken = tmp_path / "broken"
    fastfeed.pack(photos / "train", broken)
    next(broken.glob("*.tar")).unlink()
    assert main(["verify", str(broken)]) == 1
    out, err = capsys.readouterr()
    report = fastfeed.verify(broken)
    assert out == "" and err == report.text() + "\n"
    assert err.splitlines()[0] == f"{broken}: {len(report.problems)} problem(s):"
    assert err.splitlines()[1].startswith(f"  {broken}/") and "missing" in err
    assert VerifyReport(str(broken), ok=False, problems=["a", "b"]).text().splitlines() == [
        f"{broken}: 2 problem(s):", "  a", "  b"]
