"""One pixel limit at pack time for every image format and store mode, and the bound of the loader's
``image_size`` (issue 27, part 2): a 20000 x 20000 image is refused from its header, in milliseconds and
without the memory a decode would take; a raised ``max_pixels`` is the one limit (Pillow's own check
does not refuse what it admitted); ``image_size=100000`` is a ConfigError, not a 30 GB allocation."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastfeed
from fastfeed.errors import BadFileError, ConfigError
from fastfeed.loading.options import loader_options
from fastfeed.packing.api import pack

REPO = Path(__file__).resolve().parents[2]


def _encoded(fmt: str, size: tuple[int, int] = (200, 200), seed: int = 0) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt)
    return buf.getvalue()


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / "c" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "c" / name).write_bytes(data)
    return root


# ---------------------------------------------------------------- huge images: refused from the header
#: Run in a fresh interpreter, so that its peak memory is this pack's alone: a JPEG and a PNG whose
#: headers say 20000 x 20000 (a few hundred bytes each, as a decompression bomb is), packed in every
#: store mode, raise and skip; prints each case's message, time and growth of the peak RSS.
_HUGE = r'''
import io, json, resource, struct, sys, time, zlib
from pathlib import Path
from PIL import Image
import fastfeed
from fastfeed.errors import BadFileError

def small(fmt):
    buf = io.BytesIO(); Image.new("RGB", (16, 16), (9, 99, 199)).save(buf, fmt); return bytearray(buf.getvalue())

def huge_jpeg():
    d = small("JPEG"); i = d.index(b"\xff\xc0"); struct.pack_into(">HH", d, i + 5, 20000, 20000); return bytes(d)

def huge_png():
    d = small("PNG"); struct.pack_into(">II", d, 16, 20000, 20000)
    struct.pack_into(">I", d, 29, zlib.crc32(bytes(d[12:29]))); return bytes(d)

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

root = Path(sys.argv[1]); out = []
(root / "warm" / "c").mkdir(parents=True)
(root / "warm" / "c" / "ok.jpg").write_bytes(bytes(small("JPEG")))
fastfeed.pack(root / "warm", root / "warm-ff")  # imports and first-use costs, outside the measure
for name, data in (("huge.jpg", huge_jpeg()), ("huge.png", huge_png())):
    for store in ("jpeg", "raw", "mixed:0.5"):
        src = root / f"{name}-{store}"
        (src / "c").mkdir(parents=True)
        (src / "c" / name).write_bytes(data)
        (src / "c" / "note.txt").write_text("a sample without an image: nothing else to decode")
        before, t0 = peak_mb(), time.perf_counter()
        try:
            fastfeed.pack(src, root / f"{name}-{store}-ff", store=store, input="files")
            msg = None
        except BadFileError as e:
            msg = str(e)
        seconds = time.perf_counter() - t0
        idx = fastfeed.pack(src, root / f"{name}-{store}-skip", store=store, input="files", on_error="skip")
        out.append({"name": name, "store": store, "msg": msg, "seconds": seconds, "grew_mb": peak_mb() - before,
                    "skip": [idx.num_samples, [s["path"] for s in idx.skipped]]})
print(json.dumps(out))
'''


def test_huge_images_are_refused_from_the_header_in_every_store_mode(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-W", "error", "-c", _HUGE, str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    cases = json.loads(run.stdout.splitlines()[-1])
    assert [(c["name"], c["store"]) for c in cases] == [(n, s) for n in ("huge.jpg", "huge.png")
                                                        for s in ("jpeg", "raw", "mixed:0.5")]
    for c in cases:
        where = f"{c['name']} --store {c['store']}"
        assert c["msg"] is not None, where
        assert c["msg"].startswith(f"{tmp_path / (c['name'] + '-' + c['store'])}/c/{c['name']}: 20000 x 20000 image "
                                   "(400.0 megapixels) is over the pixel limit of 89,478,485 (max_pixels); "), where
        assert "pass --max-pixels 400000000 to allow it (decoding it then takes ~1.2 GB of memory)" in c["msg"], where
        assert c["msg"].endswith("or pass --on-error skip"), where
        jpeg = c["name"].endswith(".jpg")
        if jpeg:  # a JPEG can be stored smaller: decoded DCT-scaled (as a JPEG: raw pixels decode it whole)
            assert f"pass {'--store jpeg ' if c['store'] == 'raw' else ''}--max-side 5000 to store it" in c["msg"], where
        else:
            assert "--max-side" not in c["msg"], where  # a PNG is decoded whole whatever max_side says
        assert c["seconds"] < 1.0, where  # a decode of 400 megapixels takes seconds, and 1.2 GB
        assert c["grew_mb"] < 50, where
        assert c["skip"] == [1, [f"c/{c['name']}"]], where


# ---------------------------------------------------------------- every format, real images
@pytest.mark.parametrize("fmt,ext", [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"), ("GIF", "gif"),
                                     ("BMP", "bmp")])
def test_the_limit_applies_to_every_format(tmp_path: Path, fmt: str, ext: str) -> None:
    src = _folder(tmp_path / "src", {f"a.{ext}": _encoded(fmt), f"b.{ext}": _encoded(fmt, (50, 40), seed=1)})
    for store in ("jpeg", "raw"):
        with pytest.raises(BadFileError, match=rf"c/a.{ext}: 200 x 200 image \(40,000 pixels\) is over the pixel "
                                               r"limit of 10,000 \(max_pixels\); .*pass --max-pixels 40000"):
            pack(src, tmp_path / f"o-{store}", max_pixels=10_000, store=store)
        idx = pack(src, tmp_path / f"skip-{store}", max_pixels=10_000, store=store, on_error="skip")
        assert idx.num_samples == 1 and [s["path"] for s in idx.skipped] == [f"c/a.{ext}"]
    assert pack(src, tmp_path / "raised", max_pixels=40_000).num_samples == 2


def test_max_side_lets_a_large_jpeg_in_decoded_dct_scaled(tmp_path: Path) -> None:
    """What the limit counts is what pack decodes: a JPEG resized by max_side is decoded at 1/2 to 1/8 of
    its sides (200 x 200 for max_side 64 -> 100 x 100), a PNG and a raw image whole."""
    src = _folder(tmp_path / "src", {"a.jpg": _encoded("JPEG")})
    with pytest.raises(BadFileError, match=r"pass --max-side 100 to store it smaller"):
        pack(src, tmp_path / "o", max_pixels=10_000)
    idx = pack(src, tmp_path / "o2", max_pixels=10_000, max_side=64)
    assert idx.num_samples == 1 and idx.image_sizes.tolist() == [[64, 64]]
    with pytest.raises(BadFileError, match=r"200 x 200 image \(40,000 pixels\) is over .*pass --store jpeg "
                                           r"--max-side 100 to store it smaller"):
        pack(src, tmp_path / "o3", max_pixels=10_000, max_side=64, store="raw")  # raw pixels: decoded whole
    png = _folder(tmp_path / "png", {"a.png": _encoded("PNG")})
    with pytest.raises(BadFileError, match=r"over the pixel limit of 10,000 \(max_pixels\); pass --max-pixels 40000"):
        pack(png, tmp_path / "o4", max_pixels=10_000, max_side=64)
    with pytest.raises(BadFileError, match=r"decoded for --max-side 64 at 10,000 pixels, is over the pixel limit "
                                           r"of 9,999"):
        pack(src, tmp_path / "o5", max_pixels=9_999, max_side=64)


def test_a_raised_limit_is_the_one_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow refuses images over twice its MAX_IMAGE_PIXELS (and warns over it: an error here); what
    max_pixels admitted is decoded with that check lifted, and the setting is restored afterwards."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    src = _folder(tmp_path / "src", {"a.png": _encoded("PNG"), "b.jpg": _encoded("JPEG", seed=2)})
    for store in ("raw", "jpeg", "mixed:0.5"):
        idx = pack(src, tmp_path / store, store=store, max_side=64, max_pixels=50_000)
        assert idx.num_samples == 2 and Image.MAX_IMAGE_PIXELS == 1000, store
    assert pack(src, tmp_path / "default", max_side=64).num_samples == 2  # 40,000 pixels: within the default
    assert Image.MAX_IMAGE_PIXELS == 1000
    assert fastfeed.verify(tmp_path / "raw", decode=False).ok


def test_max_pixels_is_one_option(capsys: pytest.CaptureFixture[str]) -> None:
    from fastfeed.packing.options import MAX_PIXELS, PackOptions

    assert MAX_PIXELS == 89_478_485 and PackOptions.create().max_pixels == MAX_PIXELS
    assert "max_pixels" not in PackOptions.create().output_options()  # existing packs keep their job
    assert PackOptions.create(max_pixels=4 * 10**8).output_options()["max_pixels"] == 4 * 10**8
    for bad in (0, -1, 1.5, "many", True):
        with pytest.raises(ConfigError, match=r"max_pixels=.*: must be an integer >= 1 \(pixels, width x height\)"):
            PackOptions.create(max_pixels=bad)


# ---------------------------------------------------------------- the loader's image_size
@pytest.mark.parametrize("size", [100000, (8193, 224), (224, 10**12)])
def test_an_absurd_image_size_is_a_config_error(size: object) -> None:
    with pytest.raises(ConfigError, match=r"image_size=.*: a side of at most 8192 pixels .* GB.*pass the size the "
                                          r"model takes \(e.g. 224\), or image_size=None"):
        loader_options(batch_size=2, image_size=size, rank=0, world_size=1)


def test_image_size_bound_at_the_loaders_boundary(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src", {"a.jpg": _encoded("JPEG", (64, 48))})
    pack(src, tmp_path / "ff")
    with pytest.raises(ConfigError, match=r"image_size=100000: a side of at most 8192 pixels \(one 100000 x 100000 "
                                          r"RGB image is 30.0 GB"):
        fastfeed.loader(tmp_path / "ff", batch_size=1, image_size=100000, num_workers=0, rank=0, world_size=1)
    assert loader_options(batch_size=1, image_size=8192, rank=0, world_size=1).image_size == (8192, 8192)
    batch = next(iter(fastfeed.loader(tmp_path / "ff", batch_size=1, image_size=32, num_workers=0, rank=0,
                                      world_size=1)))
    assert tuple(batch["image"].shape) == (1, 3, 32, 32)
