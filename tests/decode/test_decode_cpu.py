"""CPU decode: crops, DCT-scaled decode, EXIF orientation, colour modes, determinism, fields."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image, ImageOps

from fastfeed.decode._exif import jpeg_orientation
from fastfeed.decode.cpu import CpuDecoder, RawDecoder, pick_image_field
from fastfeed.decode.geometry import (
    FLIP,
    NUM_UNIFORMS,
    center_crop,
    dct_denominator,
    random_resized_crop,
    uniforms,
)
from fastfeed.decode.image import ImageDecoder, turbo_available
from fastfeed.errors import SampleError
from tools.synth import make_jpeg

BACKENDS = ["pillow", pytest.param("turbo", marks=pytest.mark.skipif(not turbo_available(), reason="[turbo]"))]


def encode(im: Image.Image, fmt: str = "JPEG", **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def blocks(h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    """An image of flat 8x8 blocks: JPEG keeps it nearly exact, so comparisons are tight."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, (h // 8, w // 8, 3)).astype(np.uint8).repeat(8, 0).repeat(8, 1)


def ref_decode(data: bytes) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")).astype(int)


# --------------------------------------------------------------------- geometry
def test_uniforms_are_a_function_of_seed_epoch_sample() -> None:
    a = uniforms(seed=3, epoch=1, ids=np.arange(100), n=NUM_UNIFORMS)
    b = uniforms(seed=3, epoch=1, ids=np.arange(100)[::-1], n=NUM_UNIFORMS)[::-1]
    assert np.array_equal(a, b) and a.min() >= 0 and a.max() < 1
    assert not np.array_equal(a, uniforms(seed=3, epoch=2, ids=np.arange(100), n=NUM_UNIFORMS))
    assert abs(a.mean() - 0.5) < 0.02


def test_random_resized_crop_boxes() -> None:
    u = uniforms(seed=0, epoch=0, ids=np.arange(2000), n=NUM_UNIFORMS)
    areas, ratios = [], []
    for row in u:
        top, left, h, w = random_resized_crop(375, 500, row)
        assert 0 <= top and top + h <= 375 and 0 <= left and left + w <= 500 and h > 0 and w > 0
        areas.append(h * w / (375 * 500))
        ratios.append(w / h)
    assert 0.07 < min(areas) and max(areas) <= 1.0 and 0.4 < np.mean(areas) < 0.6
    assert min(ratios) > 0.7 and max(ratios) < 1.4
    # the fallback (no try fits) is a central crop with the ratio clamped
    assert random_resized_crop(10, 1000, np.full(NUM_UNIFORMS, 0.999)) == (0, 493, 10, 13)


def test_center_crop_and_dct() -> None:
    assert center_crop(256, 256, 224, 224) == (16, 16, 224, 224)
    assert center_crop(100, 100, 224, 224)[2:] == (88, 88)
    assert [dct_denominator(s, s, 224, 224) for s in (300, 448, 1000, 3000)] == [1, 2, 4, 8]


# --------------------------------------------------------------------- image decoding
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(backend: str, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(Image.fromarray(blocks()), quality=95, exif=exif.tobytes())
    assert jpeg_orientation(data) == orientation
    got = ImageDecoder(backend).decode(data).astype(int)
    ref = ref_decode(data)
    assert got.shape == ref.shape and np.abs(got - ref).mean() < 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_colour_modes_come_out_rgb(backend: str) -> None:
    dec = ImageDecoder(backend)
    base = Image.fromarray(blocks())
    p = base.convert("P")
    cases = {
        "cmyk": encode(base.convert("CMYK"), quality=95),
        "gray": encode(base.convert("L"), quality=95),
        "png-rgba": encode(base.convert("RGBA"), "PNG"),
        "png-palette-transparency": encode(p, "PNG", transparency=0),
        "png-16bit": encode(Image.fromarray((blocks()[..., 0].astype(np.uint16) * 257)), "PNG"),
        "webp": encode(base, "WEBP", lossless=True),
        "bmp": encode(base, "BMP"),
    }
    for name, data in cases.items():
        arr = dec.decode(data)
        assert arr.dtype == np.uint8 and arr.shape == (48, 64, 3), name
        if name in ("cmyk", "png-rgba", "webp", "bmp"):
            assert np.abs(arr.astype(int) - ref_decode(data)).mean() < 2, name
    assert np.abs(dec.decode(cases["png-16bit"])[..., 0].astype(int) - blocks()[..., 0]).max() <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_dct_scaled_crop_matches_full_decode(backend: str) -> None:
    rng = np.random.default_rng(1)
    data = make_jpeg(rng, (1200, 900), quality=92, texture=4.0)
    dec = ImageDecoder(backend)
    full = Image.open(io.BytesIO(data)).convert("RGB")
    dst = np.empty((112, 112, 3), np.uint8)
    box = (100, 200, 700, 700)  # top, left, h, w: room for a 1/4 reduction
    dec.decode_into(data, dst, lambda h, w: box, flip=False)
    ref = np.asarray(full.resize((112, 112), Image.BILINEAR, box=(200, 100, 900, 800))).astype(int)
    assert np.abs(dst.astype(int) - ref).mean() < 4
    flipped = np.empty_like(dst)
    dec.decode_into(data, flipped, lambda h, w: box, flip=True)
    assert np.array_equal(flipped, dst[:, ::-1])


def test_backends_agree() -> None:
    if not turbo_available():
        pytest.skip("[turbo] not installed")
    data = make_jpeg(np.random.default_rng(2), (500, 375), texture=6.0)
    out = {}
    for backend in ("pillow", "turbo"):
        dst = np.empty((64, 64, 3), np.uint8)
        ImageDecoder(backend).decode_into(data, dst, lambda h, w: (20, 30, 300, 300), flip=False)
        out[backend] = dst.astype(int)
    assert np.abs(out["pillow"] - out["turbo"]).mean() < 4


@pytest.mark.parametrize("data", [b"", b"\xff\xd8\xff\xe0junk", b"GIF89a....", b"\x89PNG\r\n\x1a\n" + b"\0" * 30])
def test_garbage_is_a_sample_error(data: bytes) -> None:
    with pytest.raises(SampleError, match="cannot decode the image"):
        ImageDecoder().decode(data)


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_jpeg_is_an_error_not_a_grey_image(backend: str) -> None:
    data = make_jpeg(np.random.default_rng(3), (200, 150))
    with pytest.raises(SampleError, match="cannot decode the image"):
        ImageDecoder(backend).decode(data[: len(data) // 2])
    dst = np.empty((32, 32, 3), np.uint8)
    with pytest.raises(SampleError, match="cannot decode the image"):
        ImageDecoder(backend).decode_into(data[: len(data) // 2], dst, lambda h, w: (0, 0, h, w), flip=False)


def test_exif_parser_survives_garbage() -> None:
    rng = np.random.default_rng(0)
    head = b"\xff\xd8\xff\xe1\x00\x40Exif\x00\x00"
    for _ in range(300):
        junk = head + rng.integers(0, 256, int(rng.integers(0, 80)), dtype=np.uint8).tobytes()
        assert 1 <= jpeg_orientation(junk) <= 8
    assert jpeg_orientation(b"not a jpeg") == 1


# --------------------------------------------------------------------- batches
def samples(n: int) -> list[dict]:
    return [{"__key__": f"k{i}", "jpg": make_jpeg(np.random.default_rng(i), (60, 45)), "cls": b"%d" % (i % 4),
             "json": json.dumps({"i": i}).encode(), "txt": b"t%d" % i, "pyd": b"\x80\x04K\x01."} for i in range(n)]


def test_crops_do_not_depend_on_batch_composition() -> None:
    dec = CpuDecoder(image_size=16, seed=7)
    ss = samples(6)
    ids = np.arange(100, 106)
    whole = dec.decode_batch(ss, ids, 3, None, None)
    halves = [dec.decode_batch(ss[a:a + 3], ids[a:a + 3], 3, None, None) for a in (0, 3)]
    assert np.array_equal(whole["image"].numpy(), np.concatenate([h["image"].numpy() for h in halves]))
    other_epoch = dec.decode_batch(ss, ids, 4, None, None)
    assert not np.array_equal(whole["image"].numpy(), other_epoch["image"].numpy())
    flips = uniforms(seed=7, epoch=3, ids=np.arange(1000), n=NUM_UNIFORMS)[:, FLIP] < 0.5
    assert 0.4 < flips.mean() < 0.6


def test_batch_fields_and_labels() -> None:
    b = CpuDecoder(image_size=(10, 14), seed=0).decode_batch(samples(4), np.arange(4), 0, None, None)
    assert tuple(b["image"].shape) == (4, 3, 10, 14) and b["label"].tolist() == [0, 1, 2, 3]
    assert b["__key__"] == ["k0", "k1", "k2", "k3"] and b["json"][2] == {"i": 2} and b["txt"][1] == "t1"
    assert b["pyd"][0] == b"\x80\x04K\x01."  # pickles stay bytes, never unpickled
    assert "cls" not in b
    sidecar = CpuDecoder(image_size=8).decode_batch(samples(2), np.arange(2), 0, np.array([7, -1]), None)
    assert sidecar["label"].tolist() == [7, -1]


def test_eval_mode_is_the_center_crop() -> None:
    data = make_jpeg(np.random.default_rng(5), (80, 60))
    ss = [{"__key__": "a", "jpg": data}]
    dec = CpuDecoder(image_size=16, augment=False)
    a = dec.decode_batch(ss, np.array([0]), 0, None, None)["image"]
    b = dec.decode_batch(ss, np.array([9]), 5, None, None)["image"]
    assert a.equal(b)
    dst = np.empty((16, 16, 3), np.uint8)
    dec.images.decode_into(data, dst, lambda h, w: center_crop(h, w, 16, 16), flip=False)
    assert np.array_equal(a[0].permute(1, 2, 0).numpy(), dst)


def test_failed_samples_go_to_fail() -> None:
    ss = samples(3)
    ss[1]["jpg"] = b"\xff\xd8\xff broken"
    failed = []
    b = CpuDecoder(image_size=8).decode_batch(ss, np.arange(3), 0, None, lambda j, e: failed.append((j, str(e))))
    assert b["__key__"] == ["k0", "k2"] and b["image"].shape[0] == 2 and b["json"] == [{"i": 0}, {"i": 2}]
    assert failed and failed[0][0] == 1 and "cannot decode" in failed[0][1]
    with pytest.raises(SampleError):
        CpuDecoder(image_size=8).decode_batch(ss, np.arange(3), 0, None, None)


def test_raw_decoder_and_image_field_choice() -> None:
    b = RawDecoder().decode_batch(samples(2), np.arange(2), 0, np.array([3, 4]), None)
    assert b["jpg"][0][:2] == b"\xff\xd8" and b["label"].tolist() == [3, 4] and b["cls"] == [b"0", b"1"]
    assert pick_image_field(["png", "jpg", "seg.png"]) == "jpg"
    assert pick_image_field(["left.png", "txt"]) == "left.png"


def test_explicit_image_field() -> None:
    ss = samples(2)
    for s in ss:
        s["seg.png"] = s.pop("jpg")  # still JPEG bytes: the field name picks, the bytes decode
    b = CpuDecoder(image_size=8, image_field="seg.png").decode_batch(ss, np.arange(2), 0, None, None)
    assert b["image"].shape[0] == 2 and "seg.png" not in b
    with pytest.raises(SampleError, match="no field 'left.jpg'.*it has"):
        CpuDecoder(image_size=8, image_field="left.jpg").decode_batch(ss, np.arange(2), 0, None, None)
