"""Region-of-interest JPEG decoding (fastfeed._jpegroi) and the anti-aliased resize.

The region path must give the same crop as decoding the whole image (within decoder
tolerance: libjpeg's fancy upsampling differs by a few levels on the crop's first
column/row), for every EXIF orientation, subsampling, progressive and grayscale files and
every DCT scale; it must decline what it does not handle (CMYK, truncated or corrupt data)
so that the full decoders decide as before, and never crash on bad bytes.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from fastfeed.decode import roi
from fastfeed.decode.geometry import NUM_UNIFORMS, random_resized_crop, uniforms
from fastfeed.decode.image import ImageDecoder, _orient, turbo_available
from fastfeed.errors import SampleError
from tools.synth import make_jpeg

needs_roi = pytest.mark.skipif(not (roi.available() and turbo_available()),
                               reason="fastfeed._jpegroi not built, or no [turbo]")


def encode(im: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", **kw)
    return buf.getvalue()


def photo(size: tuple[int, int], seed: int = 0, texture: float = 28.0) -> Image.Image:
    data = make_jpeg(np.random.default_rng(seed), size, quality=95, texture=texture)
    return Image.open(io.BytesIO(data)).convert("RGB")


def decoders() -> tuple[ImageDecoder, ImageDecoder]:
    """(region decoder, whole-image decoder) of the turbo backend."""
    region, whole = ImageDecoder("turbo"), ImageDecoder("turbo")
    region._load()
    whole._load()
    whole._roi = False
    assert region._roi
    return region, whole


def both(data: bytes, box: tuple[int, int, int, int], out: int = 64) -> tuple[np.ndarray, np.ndarray]:
    region, whole = decoders()
    a, b = np.empty((out, out, 3), np.uint8), np.empty((out, out, 3), np.uint8)
    region.decode_into(data, a, lambda h, w: box, flip=False)
    whole.decode_into(data, b, lambda h, w: box, flip=False)
    return a.astype(int), b.astype(int)


def close(a: np.ndarray, b: np.ndarray) -> None:
    d = np.abs(a - b)
    assert d.mean() < 0.5 and d.max() <= 24, (d.mean(), d.max())


# --------------------------------------------------------------------- pure geometry
@pytest.mark.parametrize("orientation", range(1, 9))
def test_stored_rect_inverts_the_orientation(orientation: int) -> None:
    rng = np.random.default_rng(orientation)
    for _ in range(100):
        H, W = (int(v) for v in rng.integers(1, 40, 2))
        stored = np.arange(H * W * 3).reshape(H, W, 3)
        upright = _orient(stored, orientation)
        uh, uw = upright.shape[:2]
        top, left = int(rng.integers(0, uh)), int(rng.integers(0, uw))
        h, w = int(rng.integers(1, uh - top + 1)), int(rng.integers(1, uw - left + 1))
        y, x, sh, sw = roi.stored_rect((top, left, h, w), orientation=orientation, stored_hw=(H, W))
        assert 0 <= y and y + sh <= H and 0 <= x and x + sw <= W
        assert np.array_equal(_orient(stored[y:y + sh, x:x + sw], orientation), upright[top:top + h, left:left + w])


def test_extension_is_built_where_it_can_be() -> None:
    """CI installs from pyproject alone: with headers and a compiler present, it must have built."""
    if not os.path.exists("/usr/include/jpeglib.h"):
        pytest.skip("no libjpeg headers: the optional extension is expected to be missing")
    assert roi.available(), "fastfeed._jpegroi did not build: run `pip install -e .` and read its warnings"


# --------------------------------------------------------------------- same pixels as a full decode
@needs_roi
@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
@pytest.mark.parametrize("progressive", [False, True])
def test_random_crops_match_the_whole_image_path(subsampling: int, progressive: bool) -> None:
    data = encode(photo((333, 251), seed=subsampling), quality=90, subsampling=subsampling,
                  progressive=progressive)
    u = uniforms(seed=1, epoch=0, ids=np.arange(12), n=NUM_UNIFORMS)
    for row in u:
        box = random_resized_crop(251, 333, row)
        close(*both(data, box, out=48))


@needs_roi
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_match(orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(photo((160, 120), seed=orientation), quality=92, exif=exif.tobytes())
    uh, uw = (160, 120) if orientation >= 5 else (120, 160)
    for box in [(0, 0, uh, uw), (5, 17, 60, 90), (uh - 41, uw - 33, 41, 33), (uh // 3, 3, uh // 2, uw - 6)]:
        close(*both(data, box, out=32))


@needs_roi
@pytest.mark.parametrize("crop", [200, 300, 600, 950])  # DCT scale 1/1, 1/2, 1/4, 1/8 for a 112 output
def test_dct_scales_match(crop: int) -> None:
    data = make_jpeg(np.random.default_rng(4), (1203, 1001), quality=90, texture=6.0)
    top, left = (1001 - crop) // 3, (1203 - crop) // 5
    close(*both(data, (top, left, crop, crop), out=112))


@needs_roi
def test_grayscale_and_odd_sizes_match() -> None:
    gray = encode(photo((97, 61)).convert("L"), quality=90)
    close(*both(gray, (3, 5, 50, 70), out=24))
    tiny = encode(photo((9, 7)), quality=90)
    close(*both(tiny, (1, 2, 5, 6), out=8))
    arr = roi.decode_crop(gray, 1, (3, 5, 50, 70))
    assert arr is not None and arr.shape == (50, 70, 3)
    assert np.array_equal(arr[..., 0], arr[..., 1]) and np.array_equal(arr[..., 1], arr[..., 2])


# --------------------------------------------------------------------- what it declines
@needs_roi
def test_cmyk_goes_to_the_full_decoders() -> None:
    data = encode(photo((64, 48)).convert("CMYK"), quality=95)
    head = roi.header(data)
    assert head is not None and head[:2] == (48, 64) and head[2] is False
    assert roi.decode_crop(data, 1, (0, 0, 8, 8)) is None
    a, b = both(data, (4, 4, 40, 40), out=16)
    assert np.array_equal(a, b)


@needs_roi
def test_truncated_file_is_an_error_wherever_the_crop_is() -> None:
    """A crop above the missing part would decode; the file is still reported as broken."""
    data = make_jpeg(np.random.default_rng(5), (200, 160))
    cut = data[: len(data) * 2 // 3]
    assert roi.decode_crop(cut, 1, (0, 0, 160, 200)) is None  # libjpeg's warning declines it
    region, _ = decoders()
    dst = np.empty((16, 16, 3), np.uint8)
    with pytest.raises(SampleError, match="cannot decode the image"):
        region.decode_into(cut, dst, lambda h, w: (0, 0, 16, 16), flip=False)


@needs_roi
def test_corrupt_bytes_never_crash() -> None:
    data = bytearray(make_jpeg(np.random.default_rng(6), (120, 90), quality=90))
    rng = np.random.default_rng(7)
    region, _ = decoders()
    dst = np.empty((16, 16, 3), np.uint8)
    outcomes = set()
    for _ in range(150):
        bad = bytearray(data)
        for pos in rng.integers(2, len(bad) - 2, int(rng.integers(1, 6))):
            bad[pos] = int(rng.integers(0, 256))
        got = roi.decode_crop(bytes(bad), 1, (10, 10, 60, 80))
        assert got is None or got.shape == (60, 80, 3)
        outcomes.add(got is None)
        try:
            region.decode_into(bytes(bad), dst, lambda h, w: (0, 0, min(h, 40), min(w, 40)), flip=False)
            outcomes.add("decoded")
        except SampleError as e:
            assert "cannot decode the image" in str(e)
            outcomes.add("error")
    assert True in outcomes and "decoded" in outcomes  # both branches were exercised
    for junk in (b"", b"\xff\xd8", b"\xff\xd8\xff\xe0junk\xff\xd9", b"not a jpeg at all"):
        assert roi.header(junk) is None
        assert roi.decode_crop(junk, 1, (0, 0, 1, 1)) is None


@needs_roi
def test_crop_outside_the_image_is_refused() -> None:
    data = make_jpeg(np.random.default_rng(8), (64, 48))
    assert roi.decode_crop(data, 1, (40, 0, 9, 10)) is None
    assert roi.decode_crop(data, 2, (0, 0, 24, 33)) is None  # 1/2 scale is 24 x 32
    assert roi.decode_crop(data, 2, (0, 0, 24, 32)).shape == (24, 32, 3)
    with pytest.raises(ValueError, match="scale_denom"):
        roi._module().decode_crop(data, np.empty(3, np.uint8), 3, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="buffer"):
        roi._module().decode_crop(data, np.empty(5, np.uint8), 1, 0, 0, 2, 2)


@needs_roi
def test_threads_decode_concurrently_and_agree() -> None:
    datas = [make_jpeg(np.random.default_rng(10 + i), (300, 200), quality=90) for i in range(8)]
    want = [roi.decode_crop(d, 1, (20, 30, 150, 200)) for d in datas]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda d: roi.decode_crop(d, 1, (20, 30, 150, 200)), datas * 3))
    assert all(np.array_equal(g, want[i % 8]) for i, g in enumerate(got))


@pytest.mark.skipif(not turbo_available(), reason="[turbo]")
def test_without_the_extension_the_full_decoders_do_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(roi, "_MODULE", None)
    monkeypatch.setattr(roi, "_LOADED", True)
    assert not roi.available()
    dec = ImageDecoder("turbo")
    data = make_jpeg(np.random.default_rng(9), (120, 90))
    dst = np.empty((32, 32, 3), np.uint8)
    dec.decode_into(data, dst, lambda h, w: (10, 10, 60, 60), flip=False)
    assert not dec._roi and dst.std() > 0


# --------------------------------------------------------------------- resize
@pytest.mark.skipif(not turbo_available(), reason="[turbo]")
@pytest.mark.parametrize("shape", [(230, 460), (224, 1000), (700, 300), (500, 500)])
def test_large_shrinks_are_anti_aliased(shape: tuple[int, int]) -> None:
    """1-pixel stripes shrunk >= 2x come out flat grey, as with area averaging."""
    import cv2

    dec = ImageDecoder("turbo")
    dec._load()
    h, w = shape
    stripes = np.zeros((h, w, 3), np.uint8)
    stripes[:, ::2] = 255
    stripes[::2] = 255 - stripes[::2]  # a checkerboard of single pixels
    dst = np.empty((112, 112, 3), np.uint8)
    dec._resize_crop(stripes, dst, flip=False)
    assert abs(dst.astype(float).mean() - 127.5) < 3 and dst.astype(float).std() < 12
    textured = np.asarray(photo((w, h), seed=3, texture=4.0))  # smooth: filters may differ on noise
    dec._resize_crop(textured, dst, flip=False)
    area = cv2.resize(textured, (112, 112), interpolation=cv2.INTER_AREA)
    assert np.abs(dst.astype(int) - area.astype(int)).mean() < 3


# --------------------------------------------------------------------- restart markers (pack --jpeg-restarts)
def _decoded(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def _markers(data: bytes) -> list[int]:
    """The marker codes of a JPEG's header segments, up to its scan."""
    out, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        m = data[pos + 1]
        out.append(m)
        if m == 0xDA:
            break
        pos += 2 + int.from_bytes(data[pos + 2: pos + 4], "big")
    return out


@needs_roi
@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
@pytest.mark.parametrize("progressive", [False, True])
def test_add_restarts_is_lossless_and_keeps_exif(subsampling: int, progressive: bool) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(photo((203, 141), seed=subsampling), quality=90, subsampling=subsampling,
                  progressive=progressive, exif=exif.tobytes())
    rst = roi.add_restarts(data)
    assert 0xDD in _markers(rst) and 0xC0 in _markers(rst)  # a restart interval; baseline
    assert np.array_equal(_decoded(rst), _decoded(data))  # the same DCT coefficients
    assert Image.open(io.BytesIO(rst)).getexif().get(0x0112) == 6
    assert len(rst) < 1.1 * len(data)


@needs_roi
@pytest.mark.parametrize("size", [(333, 251), (97, 61), (16, 16), (17, 9), (640, 480)])
def test_restart_crops_match_the_general_path(size: tuple[int, int]) -> None:
    rng = np.random.default_rng(size[0])
    for subsampling in (0, 1, 2):
        data = encode(photo(size, seed=subsampling), quality=90, subsampling=subsampling)
        rst = roi.add_restarts(data)
        m = roi._module()
        used = 0
        for denom in (1, 2, 4, 8):
            sh, sw = -(-size[1] // denom), -(-size[0] // denom)
            for _ in range(8):
                h, w = int(rng.integers(1, sh + 1)), int(rng.integers(1, sw + 1))
                top, left = int(rng.integers(0, sh - h + 1)), int(rng.integers(0, sw - w + 1))
                a, b = np.empty((h, w, 3), np.uint8), np.empty((h, w, 3), np.uint8)
                assert m.decode_crop(data, a, denom, top, left, h, w) is False  # no restart markers
                used += m.decode_crop(rst, b, denom, top, left, h, w)
                d = np.abs(a.astype(int) - b)
                # the same blocks; fancy upsampling at the cut's edges may differ by a few levels
                assert d.mean() < 1.0 and d.max() <= 24, (denom, top, left, h, w, d.mean(), d.max())
        if size[0] > 32 and size[1] > 32:
            assert used > 0  # the fast path ran


@needs_roi
@pytest.mark.parametrize("size", [(333, 251), (97, 61), (17, 9)])
def test_wide_rows_are_the_same_pixels_without_the_copy(size: tuple[int, int]) -> None:
    """decode_crop(..., wide=True) lets libjpeg write whole-iMCU rows into the scratch."""
    rng = np.random.default_rng(size[1])
    m = roi._module()
    for subsampling in (0, 1, 2):
        data = encode(photo(size, seed=subsampling), quality=90, subsampling=subsampling)
        for src in (data, roi.add_restarts(data)):
            for denom in (1, 2, 4, 8):
                sh, sw = -(-size[1] // denom), -(-size[0] // denom)
                for _ in range(6):
                    h, w = int(rng.integers(1, sh + 1)), int(rng.integers(1, sw + 1))
                    top, left = int(rng.integers(0, sh - h + 1)), int(rng.integers(0, sw - w + 1))
                    want = np.empty((h, w, 3), np.uint8)
                    used = m.decode_crop(src, want, denom, top, left, h, w)
                    scratch = np.zeros(roi.scratch_size(h, w), np.uint8)
                    used_wide, cols, skip = m.decode_crop(src, scratch, denom, top, left, h, w, True)
                    assert used_wide == used and cols >= w and 0 <= skip <= cols - w
                    got = roi.decode_crop(src, denom, (top, left, h, w), scratch)
                    assert got is not None and np.shares_memory(got, scratch)
                    assert np.array_equal(got, want), (denom, top, left, h, w)
                    # too small a scratch for wide rows: the packed layout, the same pixels
                    small = np.empty(h * w * 3, np.uint8)
                    assert np.array_equal(roi.decode_crop(src, denom, (top, left, h, w), small), want)


@needs_roi
def test_restart_grayscale_and_orientation_through_the_decoder() -> None:
    gray = roi.add_restarts(encode(photo((97, 61)).convert("L"), quality=90))
    arr = roi.decode_crop(gray, 1, (20, 30, 30, 40))
    full = _decoded(gray)
    assert arr is not None and np.abs(arr.astype(int) - full[20:50, 30:70]).max() <= 2
    exif = Image.Exif()
    exif[0x0112] = 8
    data = encode(photo((160, 120), seed=3), quality=92, exif=exif.tobytes())
    rst = roi.add_restarts(data)
    for box in [(5, 17, 60, 90), (100, 20, 50, 70)]:
        a, _ = both(data, box, out=32)
        b, _ = both(rst, box, out=32)
        close(a, b)


@needs_roi
def test_restart_file_damage_is_still_an_error() -> None:
    rst = roi.add_restarts(make_jpeg(np.random.default_rng(5), (200, 160)))
    cut = rst[: len(rst) * 2 // 3]  # no EOI: never cut by segments; the decoder reports the file
    out = np.empty((16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match="Premature end"):  # not cut by segments: libjpeg reads on and fails
        roi._module().decode_crop(cut, out, 1, 100, 100, 16, 16)
    region, _ = decoders()
    with pytest.raises(SampleError, match="cannot decode the image"):
        region.decode_into(cut, out, lambda h, w: (0, 0, 16, 16), flip=False)
    bad = bytearray(rst)
    bad[len(bad) // 2:len(bad) // 2 + 40] = b"\xff\xd3" * 20  # restart markers out of sequence
    try:
        used = roi._module().decode_crop(bytes(bad), out, 1, 0, 0, 16, 16)
    except ValueError:
        used = False
    assert used is False  # never cut from a scan whose markers do not add up
    with pytest.raises(ValueError):
        roi.add_restarts(b"\xff\xd8\xff\xe0 not a jpeg")


@needs_roi
def test_corrupt_restart_files_never_crash() -> None:
    """The segment cutter parses markers itself: damaged headers, scans and markers anywhere."""
    data = roi.add_restarts(make_jpeg(np.random.default_rng(9), (200, 150), quality=90))
    rng = np.random.default_rng(10)
    m = roi._module()
    cut_used = 0
    for _ in range(400):
        bad = bytearray(data)
        n = int(rng.integers(1, 6))
        for pos in rng.integers(2, len(bad) - 2, n):
            bad[pos] = int(rng.choice([0xFF, 0xD0, 0xDD, 0xDA, 0xD9, 0x00, int(rng.integers(0, 256))]))
        if rng.random() < 0.2:  # truncations too
            bad = bad[: int(rng.integers(4, len(bad)))]
        h, w = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        top, left = int(rng.integers(0, 150 - h)), int(rng.integers(0, 200 - w))
        out = np.empty((h, w, 3), np.uint8)
        try:
            cut_used += bool(m.decode_crop(bytes(bad), out, int(rng.choice([1, 2])), top // 2, left // 2, h // 2 + 1,
                                           w // 2 + 1))
        except ValueError:
            pass
    assert cut_used > 0  # damage outside the crop's segments, with markers intact, still cuts
