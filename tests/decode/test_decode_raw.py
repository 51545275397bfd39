"""Raw pixels (``rgb8``): the byte-count check, and crops equal to the JPEG path's for the same box."""

from __future__ import annotations

import numpy as np
import pytest

from fastfeed.decode.cpu import CpuDecoder, RawDecoder
from fastfeed.decode.geometry import NUM_UNIFORMS, dct_denominator, random_resized_crop, uniforms
from fastfeed.decode.image import ImageDecoder
from fastfeed.decode.raw import crop_into, fit_size, pixels, to_pixels
from fastfeed.errors import SampleError
from _raw_data import coded_photo


def test_pixels_checks_the_byte_count_against_the_shape() -> None:
    arr = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    view = pixels(arr.tobytes(), (2, 3))
    assert (view == arr).all() and not view.flags.writeable
    with pytest.raises(SampleError, match=r"17 bytes, expected 18 \(2 x 3 x 3, from shapes.npy\)"):
        pixels(arr.tobytes()[:-1], (2, 3))
    with pytest.raises(SampleError, match="load the dataset by its folder"):
        pixels(arr.tobytes(), None)


def test_fit_size_keeps_the_aspect() -> None:
    assert fit_size(375, 500, 500) == (375, 500)
    assert fit_size(1000, 10, 100) == (100, 1)


@pytest.mark.parametrize("seed", range(6))
def test_raw_crop_matches_the_jpeg_crop_of_the_same_box(seed: int) -> None:
    data = coded_photo((150, 110), seed)
    dec = ImageDecoder("auto")
    full = to_pixels(data)
    u = uniforms(seed=seed, epoch=0, ids=np.array([seed]), n=NUM_UNIFORMS)[0]

    def box(h: int, w: int) -> tuple[int, int, int, int]:
        return random_resized_crop(h, w, u)

    a, b = np.empty((32, 32, 3), np.uint8), np.empty((32, 32, 3), np.uint8)
    dec.decode_into(data, a, box, flip=bool(seed % 2))
    crop_into(full, b, box, flip=bool(seed % 2))
    diff = np.abs(a.astype(int) - b.astype(int))
    top, left, ch, cw = box(110, 150)
    if dct_denominator(ch, cw, 32, 32) == 1:  # the JPEG path decodes at full size: the same pixels
        assert diff.mean() < 0.1 and diff.max() <= 4  # (a region decode upsamples chroma at its edges)
    # a DCT-scaled decode (1/2) differs from a full decode + resize in fine detail (the noisy blue),
    # not in the position code (red, green) that a wrong box would shift
    assert diff[..., :2].mean() < 3 and diff.mean() < 8, diff.mean(axis=(0, 1))
    crop_into(full, b, lambda h, w: (0, 0, h // 2, w // 2), flip=False)  # another box is far off
    assert np.abs(a.astype(int) - b.astype(int))[..., :2].mean() > 10


def test_cpu_decoder_batches_mix_raw_and_jpeg_samples() -> None:
    datas = [coded_photo((96, 72), i) for i in range(4)]
    jpeg = [{"__key__": f"k{i}", "jpg": d} for i, d in enumerate(datas)]
    raw = []
    for i, d in enumerate(datas):
        arr = to_pixels(d)
        raw.append({"__key__": f"k{i}", "rgb8": arr.tobytes(), "__shape__": arr.shape[:2]} if i % 2 else jpeg[i])
    dec = CpuDecoder(image_size=24, seed=3)
    ids = np.arange(4)
    a = dec.decode_batch(jpeg, ids, 1, None, None)["image"].numpy().astype(int)
    b = dec.decode_batch(raw, ids, 1, None, None)["image"].numpy().astype(int)
    assert a.shape == b.shape == (4, 3, 24, 24)
    assert (a[0::2] == b[0::2]).all() and np.abs(a - b)[:, :2].mean() < 3  # the position code: the same boxes
    one = dec.decode_sample(raw[1], 1, 1, None)["image"]
    assert np.abs(one.astype(int) - b[1].transpose(1, 2, 0)).max() == 0
    bad = dict(raw[1], rgb8=raw[1]["rgb8"][:-3])
    failed: list = []
    dec.decode_batch([raw[0], bad], ids[:2], 1, None, lambda j, e: failed.append((j, str(e))))
    assert failed and failed[0][0] == 1 and "expected" in failed[0][1]


def test_decode_none_gives_hwc_arrays() -> None:
    arr = to_pixels(coded_photo((40, 30), 0))
    s = {"__key__": "a", "rgb8": arr.tobytes(), "__shape__": (30, 40)}
    batch = RawDecoder().decode_batch([s, {"__key__": "b", "jpg": b"\xff\xd8x"}], np.arange(2), 0, None, None)
    assert batch["rgb8"][0].shape == (30, 40, 3) and (batch["rgb8"][0] == arr).all() and batch["rgb8"][1] is None
    assert batch["jpg"] == [None, b"\xff\xd8x"] and "__shape__" not in batch
