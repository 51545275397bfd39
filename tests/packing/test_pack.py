"""``fastfeed pack``: inputs, options, output format, determinism, resume, info/verify, CLI."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastfeed
from _pack_data import messy_images, shard_samples, tree_digest, write_messy_folder
from fastfeed.cli import main
from fastfeed.errors import DestinationError, IndexMismatchError
from fastfeed.formats import FORMATS
from fastfeed.packed.index import DatasetIndex
from fastfeed.packing.api import finalize, pack, plan_pack, write_shard


def _sources(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- ImageFolder, tar and LMDB
@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_imagefolder_roundtrip(small_image_folder: Path, tmp_path: Path, fmt: str) -> None:
    dst = tmp_path / "out"
    idx = pack(small_image_folder, dst, format=fmt, samples_per_shard=16, jpeg_restarts=False)  # source bytes
    classes = sorted(p.name for p in small_image_folder.iterdir())
    assert idx.input == "imagefolder" and idx.format == fmt
    assert idx.classes == tuple(classes) and idx.fields == ("cls", "jpg")
    assert idx.num_samples == 60 and list(idx.shard_counts) == [15, 15, 15, 15]
    assert (dst / "index.json").is_file() and not (dst / ".fastfeed-pack").exists()
    src = _sources(small_image_folder)
    samples = shard_samples(dst)
    assert len({s["__key__"] for s in samples}) == 60
    for sample, label in zip(samples, idx.labels):
        key = sample["__key__"]
        assert sample["jpg"] == src[key + ".jpg"], key
        assert sample["cls"] == str(label).encode() and classes[label] == key.split("/")[0]
    # shuffled: every shard mixes classes
    starts = idx.shard_starts
    for s in range(len(idx.shards)):
        assert len(set(idx.labels[starts[s]:starts[s + 1]].tolist())) > 1
    if fmt == "tar":
        for s in idx.shards:
            assert s.dali_index == s.name.replace(".tar", ".idx") and (dst / s.dali_index).is_file()
            with tarfile.open(dst / s.name) as tf:  # a plain POSIX tar
                members = tf.getmembers()
                assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in members)
                names = [m.name for m in members]
                assert names[0].endswith(".cls") and names[1] == names[0][:-3] + "jpg"
    report = fastfeed.verify(dst)
    assert report.ok, report.problems
    assert report.samples == 60 and report.images == 60


def test_no_shuffle_keeps_key_order(small_image_folder: Path, tmp_path: Path) -> None:
    idx = pack(small_image_folder, tmp_path / "o", shuffle=False, samples_per_shard=25)
    keys = [s["__key__"] for s in shard_samples(tmp_path / "o")]
    assert keys == sorted(keys) and list(idx.shard_counts) == [20, 20, 20]


def test_shard_size_cuts_by_bytes(small_image_folder: Path, tmp_path: Path) -> None:
    total = sum(p.stat().st_size for p in small_image_folder.rglob("*.jpg"))
    idx = pack(small_image_folder, tmp_path / "o", shard_size=total // 3)
    assert len(idx.shards) in (4, 5)  # + tar overhead per member
    assert max(idx.shard_counts) - min(idx.shard_counts) <= 1


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_deterministic_across_runs_and_workers(small_image_folder: Path, tmp_path: Path, fmt: str) -> None:
    # max_side makes the job worth a process pool, so workers=2 really runs in parallel
    pack(small_image_folder, tmp_path / "a", format=fmt, samples_per_shard=12, workers=1, max_side=40)
    pack(small_image_folder, tmp_path / "b", format=fmt, samples_per_shard=12, workers=2, max_side=40)
    a, b = tree_digest(tmp_path / "a"), tree_digest(tmp_path / "b")
    assert a == b and len(a) >= 5
    pack(small_image_folder, tmp_path / "c", format=fmt, samples_per_shard=12, seed=1, max_side=40)
    assert tree_digest(tmp_path / "c") != a


def test_copied_source_gives_identical_output(small_image_folder: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "elsewhere" / "train"
    shutil.copytree(small_image_folder, copy)  # new location, new mtimes
    pack(small_image_folder, tmp_path / "a", samples_per_shard=20)
    pack(copy, tmp_path / "b", samples_per_shard=20)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")


# ---------------------------------------------------------------- files by key, JSONL
def test_files_grouped_by_key(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(12):
        d = src / "a" / "b"
        d.mkdir(parents=True, exist_ok=True)
        ext = "jpeg" if i % 2 else "JPG"
        (d / f"{i:04d}.{ext}").write_bytes(messy_images()["tiny.jpg"][0])
        (d / f"{i:04d}.json").write_text(json.dumps({"i": i}))
        (d / f"{i:04d}.cls").write_text(str(i % 3))
        (d / f"{i:04d}.seg.png").write_bytes(messy_images()["rgba.png"][0])
    (src / ".DS_Store").write_bytes(b"junk")
    idx = pack(src, tmp_path / "o", samples_per_shard=5, shuffle=False)
    assert idx.input == "files" and idx.fields == ("cls", "jpg", "json", "seg.png")
    assert list(idx.shard_counts) == [4, 4, 4]
    assert idx.labels.tolist() == [i % 3 for i in range(12)] and idx.classes is None
    samples = shard_samples(tmp_path / "o")
    assert samples[3]["__key__"] == "a/b/0003" and json.loads(samples[3]["json"]) == {"i": 3}
    assert fastfeed.verify(tmp_path / "o").ok


def test_jsonl_manifest(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    lines = []
    for i in range(9):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(messy_images()["tiny.jpg"][0])
        rec = {"image": f"img/{i}.jpg", "text": " ".join(["w"] * (i + 1)), "label": i % 2,
               "meta": {"n": i * 10, "ids": list(range(i))}, "score": 0.5}
        if i == 4:
            rec["__key__"] = "custom/key4"
        lines.append(json.dumps(rec))
    manifest = tmp_path / "data.jsonl"
    manifest.write_text("\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n")
    idx = pack(manifest, tmp_path / "o", samples_per_shard=4, shuffle=False, length="text", jpeg_restarts=False)
    assert idx.input == "jsonl"
    assert idx.fields == ("image.jpg", "label.json", "meta.json", "score.json", "text")
    assert idx.lengths_field == "text" and idx.lengths.tolist() == [1, 2, 3, 4, 6, 7, 8, 9, 5]
    assert idx.labels.tolist() == [0, 1, 0, 1, 1, 0, 1, 0, 0]
    s = {x["__key__"]: x for x in shard_samples(tmp_path / "o")}
    assert set(s) == {"000000000", "000000001", "000000002", "000000003", "000000006", "000000007",
                      "000000008", "000000009", "custom/key4"}
    assert s["000000002"]["text"] == b"w w w" and json.loads(s["000000002"]["meta.json"])["n"] == 20
    assert s["000000002"]["image.jpg"] == (tmp_path / "img" / "2.jpg").read_bytes()
    idx2 = pack(manifest, tmp_path / "o2", length="meta:n", shuffle=False)
    assert idx2.lengths.tolist() == [0, 10, 20, 30, 50, 60, 70, 80, 40]
    idx3 = pack(manifest, tmp_path / "o3", length="meta:ids", shuffle=False)
    assert idx3.lengths.tolist() == [0, 1, 2, 3, 5, 6, 7, 8, 4]


def test_length_from_text_files(tmp_path: Path) -> None:
    from tools.synth import make_text_jsonl

    src = tmp_path / "src"
    src.mkdir()
    rows = [json.loads(x) for x in make_text_jsonl(tmp_path / "t.jsonl", num_samples=30).read_text().splitlines()]
    for r in rows:
        (src / f"{r['id']:03d}.txt").write_text(r["text"])
        (src / f"{r['id']:03d}.len").write_text(str(len(r["text"]) // 2))
    idx = pack(src, tmp_path / "o", length="txt", shuffle=False)
    assert idx.lengths.tolist() == [len(r["text"].split()) for r in rows]
    idx = pack(src, tmp_path / "o2", length="len", shuffle=False)
    assert idx.lengths.tolist() == [len(r["text"]) // 2 for r in rows]
    assert fastfeed.info(tmp_path / "o2")["lengths"]["max"] == max(len(r["text"]) // 2 for r in rows)


def test_length_from_npy_arrays_by_field_or_stem(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    sizes = [3, 0, 17, 1, 250]
    for i, n in enumerate(sizes):
        buf = io.BytesIO()
        np.save(buf, np.arange(n, dtype=np.uint16))
        (src / f"{i:03d}.tokens.npy").write_bytes(buf.getvalue())
    for j, name in enumerate(("tokens.npy", "tokens")):  # the field, or its name without the extension
        idx = pack(src, tmp_path / f"o{j}", length=name, shuffle=False)
        assert idx.lengths.tolist() == sizes
    (src / "005.tokens.npy").write_bytes(b"\x93NUMPY broken")
    with pytest.raises(fastfeed.FastfeedError, match="005"):
        pack(src, tmp_path / "o9", length="tokens", shuffle=False)


# ---------------------------------------------------------------- messy images, --max-side
def test_messy_images_pack_and_verify(tmp_path: Path) -> None:
    write_messy_folder(tmp_path / "src")
    before = tree_digest(tmp_path / "src")
    idx = pack(tmp_path / "src", tmp_path / "o")
    assert idx.input == "imagefolder" and idx.num_samples == 9
    report = fastfeed.verify(tmp_path / "o")
    assert report.ok and report.images == 9, report.problems
    assert tree_digest(tmp_path / "src") == before


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_max_side_reencodes_messy_images(tmp_path: Path, fmt: str) -> None:
    sizes = write_messy_folder(tmp_path / "src")
    before = tree_digest(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "o", max_side=64, quality=80, format=fmt, jpeg_restarts=False)
    assert fastfeed.verify(tmp_path / "o").ok
    assert tree_digest(tmp_path / "src") == before  # originals untouched
    originals = messy_images()
    for s in shard_samples(tmp_path / "o"):
        field = "png" if "png" in s else "jpg"
        name = s["__key__"].split("/")[1] + "." + field
        rel = s["__key__"].split("/")[0] + "/" + name
        img = Image.open(io.BytesIO(s[field]))
        w, h = sizes[rel]
        scale = min(1.0, 64 / max(w, h))
        assert img.size == (max(1, round(w * scale)), max(1, round(h * scale))), name
        assert img.format == ("PNG" if field == "png" else "JPEG"), name
        if field == "jpg":
            assert img.mode in ("RGB", "L"), name
        if name == "tiny.jpg":
            assert s[field] == originals[name][0]  # small enough: stored as it was
    # EXIF-rotated: the pixels are upright now and the orientation tag is gone
    rot = [s for s in shard_samples(tmp_path / "o") if s["__key__"].endswith("rotated")][0]
    assert Image.open(io.BytesIO(rot["jpg"])).getexif().get(0x0112) in (None, 1)


@pytest.mark.skipif(not __import__("fastfeed.decode.roi", fromlist=["roi"]).available(),
                    reason="fastfeed._jpegroi not built")
def test_jpeg_restarts_store_the_same_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_messy_folder(tmp_path / "src")
    before = tree_digest(tmp_path / "src")
    idx = pack(tmp_path / "src", tmp_path / "o", jpeg_restarts=True)
    assert idx.num_samples == 9 and fastfeed.verify(tmp_path / "o").ok
    assert tree_digest(tmp_path / "src") == before
    assert json.loads((tmp_path / "o" / "index.json").read_text())["options"].get("jpeg_restarts") is True
    originals = messy_images()
    restarted = 0
    for s in shard_samples(tmp_path / "o"):
        field = "png" if "png" in s else "jpg"
        name = s["__key__"].split("/")[1] + "." + field
        src = originals[name][0]
        a, b = Image.open(io.BytesIO(src)), Image.open(io.BytesIO(s[field]))
        assert np.array_equal(np.asarray(a), np.asarray(b)), name  # lossless: the same pixels
        assert a.getexif().get(0x0112) == b.getexif().get(0x0112), name
        if s[field] != src:
            assert b"\xff\xdd\x00\x04\x00\x01" in s[field][:2000], name  # one restart per MCU
            restarted += 1
        elif src[:3] == b"\xff\xd8\xff":
            assert Image.open(io.BytesIO(src)).mode == "CMYK", name  # left as it was
    assert restarted >= 4  # the baseline, progressive, grayscale, rotated and tiny JPEGs
    # the loader reads them like any JPEG
    dl = fastfeed.loader(tmp_path / "o", batch_size=3, image_size=32, num_workers=0, shuffle=False)
    assert sum(len(b["__key__"]) for b in dl) == 9
    # without the extension: a clear error, before anything is written
    from fastfeed.decode import roi

    monkeypatch.setattr(roi, "built", lambda: False)
    with pytest.raises(fastfeed.ConfigError, match="jpeg_restarts=True needs"):
        pack(tmp_path / "src", tmp_path / "o2", jpeg_restarts=True)
    assert not (tmp_path / "o2").exists()


def test_cmyk_and_alpha_convert_to_plausible_colours(tmp_path: Path) -> None:
    from fastfeed.formats.images import reencode

    data, _ = messy_images()["cmyk.jpg"]
    src = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)
    out = Image.open(io.BytesIO(reencode(data, "jpg", 1000, 95)))
    assert out.mode == "RGB" and np.abs(np.asarray(out, np.float32) - src).mean() < 6
    rgba, _ = messy_images()["rgba.png"]
    flat = np.asarray(Image.open(io.BytesIO(reencode(rgba, "jpg", 1000, 95))), np.float32)
    assert flat[:, :50].min() > 240  # transparent half composited on white


# ---------------------------------------------------------------- resume and re-runs
def test_resume_reuses_complete_shards_and_rewrites_damaged(small_image_folder: Path, tmp_path: Path) -> None:
    pack(small_image_folder, tmp_path / "clean", samples_per_shard=10)
    dst = tmp_path / "out"
    plan = plan_pack(small_image_folder, dst, samples_per_shard=10)
    for n in (0, 1, 2):  # an interrupted run: three shards done, one half written
        write_shard(plan, n)
    (dst / f"{plan.shards[3].name}.999.tmp").write_bytes(b"partial")
    assert not (dst / "index.json").exists()
    with (dst / plan.shards[1].name).open("r+b") as f:  # damage a complete shard
        f.seek(700)
        f.write(b"X")
    kept = (dst / plan.shards[0].name).stat().st_mtime_ns
    idx = pack(small_image_folder, dst, samples_per_shard=10)
    assert (dst / plan.shards[0].name).stat().st_mtime_ns == kept
    assert tree_digest(dst) == tree_digest(tmp_path / "clean")
    assert idx.num_samples == 60


def test_finalize_needs_every_shard(small_image_folder: Path, tmp_path: Path) -> None:
    plan = plan_pack(small_image_folder, tmp_path / "o", samples_per_shard=30)
    results = [write_shard(plan, 0)]
    with pytest.raises(IndexMismatchError, match="shard-000001.tar has no result"):
        finalize(plan, results)
    assert not (tmp_path / "o" / "index.json").exists()
    idx = finalize(plan, results + [write_shard(plan, 1)])
    assert idx.num_samples == 60


def test_plan_and_results_are_picklable(small_image_folder: Path, tmp_path: Path) -> None:
    import pickle

    plan = plan_pack(small_image_folder, tmp_path / "o", samples_per_shard=30)
    plan2 = pickle.loads(pickle.dumps(plan))
    assert plan2 == plan
    result = pickle.loads(pickle.dumps(write_shard(plan2, 1)))
    idx = finalize(plan, [write_shard(plan, 0), result])
    assert idx.num_samples == 60


def test_rerun_of_complete_dataset_is_a_no_op(small_image_folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "o"
    pack(small_image_folder, dst, samples_per_shard=20)
    before = {p.name: p.stat().st_mtime_ns for p in dst.iterdir()}
    idx = pack(small_image_folder, dst, samples_per_shard=20)
    assert idx.num_samples == 60 and {p.name: p.stat().st_mtime_ns for p in dst.iterdir()} == before
    with pytest.raises(DestinationError, match="already holds a complete dataset.*--overwrite"):
        pack(small_image_folder, dst, samples_per_shard=7)
    idx = pack(small_image_folder, dst, samples_per_shard=7, overwrite=True)
    assert len(idx.shards) == 9 and len(list(dst.glob("shard-*.tar"))) == 9
    assert fastfeed.verify(dst).ok


# ---------------------------------------------------------------- DALI index
def test_dali_index_matches_dali_extra_reference(shared_data: Path, tmp_path: Path) -> None:
    """Rebuild DALI_extra's reference tar member by member and compare the index text."""
    ref = (shared_data / "dali-index" / "v1.2.idx").read_text()
    writer_cls = FORMATS["tar"][0]
    w = writer_cls(tmp_path / "t.tar")
    for line in ref.splitlines()[1:]:
        tok = line.split()
        members = {tok[i]: tok[i + 3] for i in range(0, len(tok), 4)}
        key = members["jpg"].rsplit(".", 1)[0]
        cls_dir, name = key.split("/")[-2:]
        jpg = (shared_data / "imagenet-sample" / cls_dir / f"{name}.jpg").read_bytes()
        w.add(key, {"cls": cls_dir.encode(), "jpg": jpg})
    w.close()
    assert w.dali_index() == ref
    v11 = (shared_data / "dali-index" / "v1.1.idx").read_text()
    assert [" ".join(t for i, t in enumerate(line.split()) if i % 4 != 3) for line in ref.splitlines()[1:]] \
        == v11.splitlines()[1:]


def test_dali_index_falls_back_to_v11_for_names_with_spaces(tmp_path: Path) -> None:
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    (src / "my photo.jpg").write_bytes(messy_images()["tiny.jpg"][0])
    (src / "other.jpg").write_bytes(messy_images()["gray.jpg"][0])
    idx = pack(tmp_path / "src", tmp_path / "o", shuffle=False)
    text = (tmp_path / "o" / idx.shards[0].dali_index).read_text().splitlines()
    assert text[0] == "v1.1 2" and all(len(line.split()) == 6 for line in text[1:])
    assert fastfeed.verify(tmp_path / "o").ok


# ---------------------------------------------------------------- verify and info
def test_verify_reports_damage(small_image_folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "o"
    idx = pack(small_image_folder, dst, samples_per_shard=20)
    assert fastfeed.verify(dst, workers=2).ok
    shard = dst / idx.shards[1].name
    raw = bytearray(shard.read_bytes())
    off, size = idx.offsets[int(idx.shard_starts[1])]
    raw[off + 1024 + 400: off + 1024 + 2000] = bytes(1600)  # inside the first sample's JPEG data
    shard.write_bytes(bytes(raw))
    (dst / idx.shards[2].name).unlink()
    report = fastfeed.verify(dst)
    assert not report.ok
    text = "\n".join(report.problems)
    assert f"{idx.shards[1].name}: sha256 differs" in text
    assert f"{idx.shards[2].name}: missing" in text
    (dst / "offsets.npy").unlink()
    assert "offsets.npy: sidecar" in fastfeed.verify(dst).problems[0]


def test_info_summary(small_image_folder: Path, tmp_path: Path) -> None:
    pack(small_image_folder, tmp_path / "o", samples_per_shard=25, format="lmdb")
    d = fastfeed.info(tmp_path / "o")
    assert d["num_samples"] == 60 and d["num_shards"] == 3 and d["format"] == "lmdb"
    assert d["samples_per_shard"] == {"min": 20, "max": 20} and d["num_classes"] == 3
    assert d["samples_per_class"] == {"min": 20, "max": 20} and d["num_skipped"] == 0


# ---------------------------------------------------------------- CLI (in-process)
def test_cli_pack_info_verify(small_image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "o"
    rc = main(["pack", str(small_image_folder), str(dst), "--samples-per-shard", "16", "--workers", "1",
               "--no-shuffle", "--format", "lmdb"])
    out = capsys.readouterr()
    assert rc == 0 and "packed 60 samples into 4 lmdb shard(s)" in out.out
    assert out.err == ""  # no progress bar without a terminal
    assert main(["info", str(dst), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_samples"] == 60 and d["options"]["shuffle"] is False
    assert main(["info", str(dst)]) == 0
    assert "60 in 4 shard(s) of 15, " in capsys.readouterr().out
    assert main(["verify", str(dst), "--workers", "1"]) == 0
    assert "ok: 4 shard(s), 60 samples, 60 images decoded" in capsys.readouterr().out
    (dst / "shard-000003.lmdb").write_bytes(b"garbage")
    assert main(["verify", str(dst), "--workers", "1"]) == 1
    assert "shard-000003.lmdb" in capsys.readouterr().err


def test_cli_errors_exit_2_with_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(tmp_path / "nope"), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "fastfeed pack: error:" in err and "nope: does not exist" in err
    assert main(["pack", str(tmp_path), str(tmp_path / "o"), "--workers", "many"]) == 2
    assert "--workers 'many'" in capsys.readouterr().err
    assert main(["info", str(tmp_path)]) == 2
    assert "no index" in capsys.readouterr().err


def test_cli_options_reach_pack(tmp_path: Path) -> None:
    write_messy_folder(tmp_path / "src")
    rc = main(["pack", str(tmp_path / "src"), str(tmp_path / "o"), "--max-side", "32", "--quality", "70",
               "--seed", "5", "--shard-size", "2KB", "--workers", "1"])
    assert rc == 0
    idx = DatasetIndex.load(tmp_path / "o")
    assert idx.options["max_side"] == 32 and idx.options["quality"] == 70 and idx.options["seed"] == 5
    assert len(idx.shards) > 1 and idx.options["shard_size"] == 2000
    assert all(max(Image.open(io.BytesIO(s[f])).size) <= 32
               for s in shard_samples(tmp_path / "o") for f in ("jpg", "png") if f in s)


def test_import_fastfeed_stays_light() -> None:
    import subprocess
    import sys

    code = "import fastfeed, sys; fastfeed.pack; print('PIL' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.stdout.split() == ["False", "False"]


def test_fast_tar_header_equals_tarfile() -> None:
    from fastfeed.formats.tar import _header, _tarfile_header

    names = ["a", "n01440764/n01440764_10026.jpg", "x" * 100, "y" * 101, "caf\u00e9/b.jpg",
             "with space.txt", "deep/" * 19 + "k.cls"]
    for name in names:
        for size in (0, 1, 511, 512, 100_000, 8**11 - 1, 8**11):
            assert _header(name, size) == _tarfile_header(name, size), (name, size)


def test_progress_bar_on_a_terminal(small_image_folder: Path, tmp_path: Path) -> None:
    import fcntl
    import pty
    import struct
    import sys
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the terminal
        try:
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
            os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
            os.execv(sys.executable, [sys.executable, "-m", "fastfeed", "pack", str(small_image_folder),
                                      str(tmp_path / "o"), "--workers", "1"])
        finally:
            os._exit(127)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "pack: 100%" in text and "/60.0 [" in text and "file/s" in text and "MB/s" in text
