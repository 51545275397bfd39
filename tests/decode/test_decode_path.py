"""The default install's decode path, its fallbacks, and pack's default restart markers (issue 17).

- restart-marked JPEGs are cropped by segment in Python when the extension is missing,
  with exactly the pixels of the whole-image decode;
- the decode path is logged once per process (main process, rank 0), naming the path,
  its fallback and the fix; ``roi.available()`` is True only when the region path is on;
- the loader works with the extension, or simplejpeg and OpenCV, hidden (a subprocess
  that blocks their import);
- a default ``fastfeed.pack`` stores JPEGs with restart markers and the same pixels, or,
  without the extension, the source bytes and one warning.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastfeed
import fastfeed.cli
from fastfeed.decode import path as path_mod
from fastfeed.decode import roi
from fastfeed.decode.image import ImageDecoder, decode_path, turbo_available
from fastfeed.errors import SampleError
from tools.synth import make_image_folder, make_jpeg

from _pack_data import messy_images, shard_samples, write_messy_folder

REPO = Path(__file__).resolve().parents[2]
needs_turbo = pytest.mark.skipif(not turbo_available(), reason="simplejpeg/OpenCV not installed")
needs_ext = pytest.mark.skipif(not roi.built(), reason="fastfeed._jpegroi not built")


def _with_restarts(size: tuple[int, int], seed: int, subsampling: int = 2, orientation: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    im = Image.open(io.BytesIO(make_jpeg(rng, size, quality=95))).convert("RGB")
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90, subsampling=subsampling, exif=exif.tobytes())
    return roi.add_restarts(buf.getvalue())


def _decoder(*, ext: bool, cut: bool) -> ImageDecoder:
    dec = ImageDecoder("turbo")
    dec._load()
    dec._roi, dec._cut = ext, cut
    return dec


# --------------------------------------------------------------------- the Python restart cut
@needs_ext
@needs_turbo
@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_restart_cut_gives_the_pixels_of_the_whole_decode(subsampling: int, orientation: int) -> None:
    data = _with_restarts((333, 251), seed=subsampling * 10 + orientation, subsampling=subsampling,
                          orientation=orientation)
    cut, whole = _decoder(ext=False, cut=True), _decoder(ext=False, cut=False)
    rng = np.random.default_rng(orientation)
    for out in (224, 96, 40, 20):  # DCT scales 1, 2, 4, 8
        for _ in range(6):
            t, l, h, w = rng.uniform(0, 0.5), rng.uniform(0, 0.5), rng.uniform(0.1, 0.5), rng.uniform(0.1, 0.5)
            box = lambda H, W: (int(t * H), int(l * W), max(1, int(h * H)), max(1, int(w * W)))  # noqa: E731
            a, b = np.empty((out, out, 3), np.uint8), np.empty((out, out, 3), np.uint8)
            cut.decode_into(data, a, box, flip=True)
            whole.decode_into(data, b, box, flip=True)
            assert np.array_equal(a, b), (out, t, l, h, w)


@needs_ext
@needs_turbo
@pytest.mark.parametrize("subsampling", [0, 1, 2])
@pytest.mark.parametrize("denom", [1, 2, 4, 8])
def test_restart_cut_of_thin_crops_at_segment_edges(subsampling: int, denom: int) -> None:
    """1-2 pixel crops on and next to segment boundaries and the image's edges: the
    sub-image's context (and libjpeg's plain upsampling of tiny components) must not show."""
    import simplejpeg

    data = _with_restarts((361, 245), seed=40 + subsampling, subsampling=subsampling)
    sh, sw = -(-245 // denom), -(-361 // denom)
    whole = simplejpeg.decode_jpeg(data, "RGB", fastdct=True, min_height=sh, min_width=sw)
    seg = max(1, 16 // denom)
    cols = sorted({min(sw - 1, max(0, c)) for k in range(0, sw + seg, seg) for c in (k - 1, k, k + 1)})
    rows = sorted({min(sh - 1, max(0, r)) for k in range(0, sh + seg, seg) for r in (k - 1, k)})[::3]
    for y in rows:
        for x in cols:
            h, w = min(2, sh - y), min(1 + (x % 2), sw - x)
            cut = roi.cut_restarts(data, denom, (y, x, h, w))
            if cut is None:
                continue
            sub = simplejpeg.decode_jpeg(cut.jpeg, "RGB", fastdct=True, min_height=-(-cut.height // denom),
                                         min_width=-(-cut.width // denom))
            assert np.array_equal(sub[cut.top: cut.top + h, cut.left: cut.left + w], whole[y: y + h, x: x + w]), \
                (y, x, h, w)


@needs_ext
@needs_turbo
@pytest.mark.parametrize("kind", ["gray", "progressive-source", "odd-size"])
def test_restart_cut_handles_gray_progressive_and_odd_sizes(kind: str) -> None:
    rng = np.random.default_rng(7)
    im = Image.open(io.BytesIO(make_jpeg(rng, (97, 61) if kind == "odd-size" else (300, 200), quality=95)))
    buf = io.BytesIO()
    (im.convert("L") if kind == "gray" else im).save(buf, format="JPEG", quality=90,
                                                      progressive=kind == "progressive-source")
    data = roi.add_restarts(buf.getvalue())
    assert roi.cut_restarts(data, 1, (20, 20, 30, 30)) is not None
    cut, whole = _decoder(ext=False, cut=True), _decoder(ext=False, cut=False)
    for out in (48, 16, 8):
        a, b = np.empty((out, out, 3), np.uint8), np.empty((out, out, 3), np.uint8)
        cut.decode_into(data, a, lambda H, W: (H // 4, W // 3, H // 2, W // 2), flip=False)
        whole.decode_into(data, b, lambda H, W: (H // 4, W // 3, H // 2, W // 2), flip=False)
        assert np.array_equal(a, b), out


@needs_ext
@needs_turbo
def test_restart_cut_of_corrupt_data_fails_as_the_whole_decode_does() -> None:
    data = bytearray(_with_restarts((320, 240), seed=3))
    truncated = bytes(data[: len(data) * 2 // 3])
    data[len(data) // 2: len(data) // 2 + 400] = bytes(400)  # zeroed entropy data, markers gone
    cut, whole = _decoder(ext=False, cut=True), _decoder(ext=False, cut=False)
    for bad in (bytes(data), truncated):
        outcomes = []
        for dec in (cut, whole):
            dst = np.empty((64, 64, 3), np.uint8)
            try:
                dec.decode_into(bad, dst, lambda H, W: (H // 3, W // 3, H // 2, W // 2), flip=False)
                outcomes.append(dst.copy())
            except SampleError:
                outcomes.append(None)
        assert (outcomes[0] is None) == (outcomes[1] is None)
        if outcomes[0] is not None:
            assert np.array_equal(outcomes[0], outcomes[1])


@needs_ext
@needs_turbo
def test_restart_cut_is_smaller_and_keeps_only_the_crop() -> None:
    import simplejpeg

    data = _with_restarts((640, 480), seed=1)
    rect = (200, 300, 100, 120)  # rows 200..299, columns 300..419 at full scale
    got = roi.cut_restarts(data, 1, rect)
    assert got is not None and len(got.jpeg) < len(data) / 4
    sub = simplejpeg.decode_jpeg(got.jpeg, "RGB", fastdct=True)
    assert sub.shape[:2] == (got.height, got.width)
    whole = simplejpeg.decode_jpeg(data, "RGB", fastdct=True)
    top, left, h, w = rect
    assert np.array_equal(sub[got.top: got.top + h, got.left: got.left + w], whole[top: top + h, left: left + w])


@needs_ext
def test_restart_cut_declines_what_it_cannot_cut() -> None:
    plain = make_jpeg(np.random.default_rng(2), (320, 240))
    rst = roi.add_restarts(plain)
    assert roi.cut_restarts(plain, 1, (10, 10, 50, 50)) is None  # no restart markers
    assert roi.cut_restarts(rst[: len(rst) // 2], 1, (10, 10, 50, 50)) is None  # truncated
    assert roi.cut_restarts(rst, 1, (0, 0, 50, 320)) is None  # the whole width from the top: nothing to cut
    buf = io.BytesIO()
    Image.open(io.BytesIO(plain)).save(buf, format="JPEG", progressive=True)
    assert roi.cut_restarts(buf.getvalue(), 1, (10, 10, 50, 50)) is None
    assert roi.cut_restarts(b"\xff\xd8\xff\xe0 garbage", 1, (0, 0, 8, 8)) is None
    assert roi.cut_restarts(rst, 1, (10, 10, 50, 50)) is not None


# --------------------------------------------------------------------- the log line, truthful reports
_CHILD = textwrap.dedent("""
    import logging, sys
    for name in sys.argv[2].split(",") if sys.argv[2] else []:
        sys.modules[name] = None  # the import fails as if the package were not installed
    logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    import json
    import fastfeed
    from fastfeed.decode import roi
    from fastfeed.decode.image import ImageDecoder, decode_path
    ImageDecoder(); ImageDecoder("auto")
    dl = fastfeed.loader(sys.argv[1], batch_size=4, image_size=32, num_workers=2, shuffle=True,
                         multiprocessing_context="spawn")
    shapes, spread = [], []
    for epoch in range(2):
        dl.set_epoch(epoch)
        for b in dl:
            shapes.append(list(b["image"].shape))
            spread.append(float(b["image"].float().std()))
    print("RESULT " + json.dumps({"path": decode_path().name, "available": roi.available(),
                                  "built": roi.built(), "shapes": shapes, "min_std": min(spread)}))
""")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decode_path")
    make_image_folder(root / "src", num_images=12, num_classes=2, size=(160, 120), workers=1)
    fastfeed.pack(root / "src", root / "ff", samples_per_shard=6)
    return root / "ff"


def _run_child(packed: Path, hidden: str) -> tuple[dict, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(packed), hidden], capture_output=True, text=True,
                         env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("LOG ") and " decode: " in ln]
    return result, lines


def _check_batches(result: dict) -> None:
    assert sum(s[0] for s in result["shapes"]) == 24  # 12 images x 2 epochs
    assert all(s[1:] == [3, 32, 32] for s in result["shapes"])
    assert result["min_std"] > 1  # real pixels, not a zero buffer


@needs_turbo
def test_pillow_fallback_logs_once_and_the_loader_works(packed: Path) -> None:
    result, lines = _run_child(packed, "simplejpeg")
    assert len(lines) == 1, lines  # two decoders, a loader, two spawned workers, two epochs: one line
    assert lines[0].startswith("LOG WARNING fastfeed.decode.path decode: Pillow (simplejpeg not importable)")
    assert "pip install simplejpeg opencv-python-headless" in lines[0]
    assert "the CPU per image of the default path" in lines[0]
    assert result["path"] == "pillow" and not result["available"]  # truthful even with the extension built
    _check_batches(result)


@needs_turbo
def test_without_the_extension_logs_once_and_cuts_restarts_in_python(packed: Path) -> None:
    result, lines = _run_child(packed, "fastfeed._jpegroi")
    assert len(lines) == 1, lines
    assert lines[0].startswith("LOG WARNING fastfeed.decode.path decode: simplejpeg + OpenCV without "
                               "fastfeed._jpegroi")
    assert "cut in Python" in lines[0] and "libturbojpeg0-dev" in lines[0]
    assert result["path"] == "restart-cut" and not result["available"] and not result["built"]
    _check_batches(result)


@needs_ext
@needs_turbo
def test_default_path_logs_one_info_line(packed: Path) -> None:
    result, lines = _run_child(packed, "")
    assert len(lines) == 1 and lines[0].startswith("LOG INFO fastfeed.decode.path decode: simplejpeg + OpenCV; "
                                                   "JPEG crops decoded by region"), lines
    assert result["path"] == "region" and result["available"]
    _check_batches(result)


def test_decode_path_names_the_pillow_backend_without_a_warning() -> None:
    path = decode_path("pillow")
    assert path.name == "pillow" and not path.degraded and "decode_backend='pillow'" in path.message


def test_the_line_is_logged_once_per_process(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(path_mod, "_REPORTED", False)
    with caplog.at_level(logging.INFO, logger="fastfeed.decode.path"):
        for _ in range(3):
            ImageDecoder()
        ImageDecoder("pillow")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode: ")]
    assert lines == [decode_path().message]


def test_other_ranks_stay_quiet(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(path_mod, "_REPORTED", False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.INFO, logger="fastfeed.decode.path"):
        ImageDecoder()
    assert not [r for r in caplog.records if r.getMessage().startswith("decode: ")]


# --------------------------------------------------------------------- pack's default
@needs_ext
def test_default_pack_stores_restart_markers_with_the_same_pixels(tmp_path: Path) -> None:
    write_messy_folder(tmp_path / "src")
    idx = fastfeed.pack(tmp_path / "src", tmp_path / "o")
    assert idx.num_samples == 9 and fastfeed.verify(tmp_path / "o").ok
    assert json.loads((tmp_path / "o" / "index.json").read_text())["options"].get("jpeg_restarts") is True
    originals = messy_images()
    restarted = 0
    for s in shard_samples(tmp_path / "o"):
        field = "png" if "png" in s else "jpg"
        src = originals[s["__key__"].split("/")[1] + "." + field][0]
        a, b = Image.open(io.BytesIO(src)), Image.open(io.BytesIO(s[field]))
        assert np.array_equal(np.asarray(a), np.asarray(b)), s["__key__"]  # lossless
        if s[field] != src:
            assert b"\xff\xdd\x00\x04\x00\x01" in s[field][:2000]  # DRI: one restart per MCU
            restarted += 1
    assert restarted >= 4


def test_default_pack_without_the_extension_keeps_the_source_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(roi, "built", lambda: False)
    write_messy_folder(tmp_path / "src")
    with caplog.at_level(logging.WARNING, logger="fastfeed.pack"):
        fastfeed.pack(tmp_path / "src", tmp_path / "o")
    warned = [r.getMessage() for r in caplog.records if "restart markers" in r.getMessage()]
    assert len(warned) == 1 and "fastfeed._jpegroi is not built" in warned[0]
    assert "jpeg_restarts" not in json.loads((tmp_path / "o" / "index.json").read_text())["options"]
    originals = messy_images()
    for s in shard_samples(tmp_path / "o"):
        field = "png" if "png" in s else "jpg"
        assert s[field] == originals[s["__key__"].split("/")[1] + "." + field][0]


def test_no_jpeg_restarts_keeps_the_source_bytes(tmp_path: Path) -> None:
    write_messy_folder(tmp_path / "src")
    assert fastfeed.cli.main(["pack", str(tmp_path / "src"), str(tmp_path / "o"), "--no-jpeg-restarts"]) == 0
    originals = messy_images()
    for s in shard_samples(tmp_path / "o"):
        field = "png" if "png" in s else "jpg"
        assert s[field] == originals[s["__key__"].split("/")[1] + "." + field][0]
