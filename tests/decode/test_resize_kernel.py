"""The bilinear resize kernel (``fastfeed._resize``) and ``resize_into``'s use of it.

The kernel is checked against an independent float64 bilinear resize written here with
OpenCV's pixel-centre coordinates, against OpenCV itself, and its AVX2 and SSSE3 paths
against its scalar path (the same integers by construction), over many shapes: odd and even, up and
down, 1-pixel sides, crops that are views of larger images (any row stride), outputs
wider than the kernel's stack tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

cv2 = pytest.importorskip("cv2")
from fastfeed.decode import resize  # noqa: E402

try:
    from fastfeed import _resize
except ImportError:  # pragma: no cover - built by `pip install -e .` wherever a C compiler is
    _resize = None

needs_ext = pytest.mark.skipif(_resize is None, reason="fastfeed._resize not built")
needs_simd = pytest.mark.skipif(_resize is None or _resize.simd() == "scalar", reason="no SSSE3 here")


def reference(src: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """Bilinear resize in float64 with OpenCV's mapping (x + 0.5) * scale - 0.5, clamped at the borders."""
    h, w = src.shape[:2]

    def axis(n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        f = (np.arange(n) + 0.5) * (m / n) - 0.5
        i = np.floor(f).astype(int)
        frac = f - i
        frac[i < 0], i[i < 0] = 0.0, 0
        hi = i >= m - 1
        frac[hi], i[hi] = 0.0, m - 1
        return i, np.minimum(i + 1, m - 1), frac

    y0, y1, fy = axis(oh, h)
    x0, x1, fx = axis(ow, w)
    s = src.astype(np.float64)
    rows = s[y0] * (1 - fy)[:, None, None] + s[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return out


def images(rng: np.random.Generator, h: int, w: int) -> dict[str, np.ndarray]:
    noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    return {"noise": noise, "smooth": cv2.GaussianBlur(noise, (0, 0), 2.0) if min(h, w) > 1 else noise}


def _ext(src: np.ndarray, oh: int, ow: int, flip: bool = False) -> np.ndarray:
    dst = np.empty((oh, ow, 3), np.uint8)
    _resize.resize(src, dst, flip)
    return dst


@needs_ext
@pytest.mark.parametrize("shape,out", [
    ((375, 500), (224, 224)), ((447, 447), (224, 224)), ((224, 224), (224, 224)), ((100, 90), (224, 224)),
    ((1, 1), (7, 5)), ((1, 9), (3, 4)), ((9, 1), (4, 3)), ((5, 7), (1, 1)), ((33, 65), (17, 33)),
    ((300, 300), (223, 225)), ((20, 2100), (8, 1100)), ((6000, 20), (3001, 11)),
])
def test_matches_float_bilinear_and_opencv(shape: tuple[int, int], out: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape) + sum(out))
    for name, img in images(rng, *shape).items():
        got = _ext(img, *out).astype(np.int16)
        ref = reference(img, *out)
        err = np.abs(got - ref)
        # 7-bit weights (each off by <= 0.5/127: <= 1 level) and a rounding in each of the two
        # passes: within 3 levels of exact bilinear (2.2 measured on noise, OpenCV 0.8), < 0.5 on
        # average (0.37; OpenCV 0.27)
        assert err.max() <= 3.0, (name, err.max())
        assert err.mean() < 0.5, (name, err.mean())
        ocv = cv2.resize(img, out[::-1], interpolation=cv2.INTER_LINEAR).astype(np.int16)
        assert np.abs(got - ocv).mean() < 0.5, name


@needs_ext
def test_constant_image_stays_constant_and_extremes_are_exact() -> None:
    for v in (0, 1, 127, 254, 255):
        img = np.full((37, 53, 3), v, np.uint8)
        assert (_ext(img, 24, 31) == v).all()
        assert (_ext(img, 24, 31, flip=True) == v).all()


@needs_ext
@pytest.mark.parametrize("shape,out", [((375, 500), (224, 224)), ((31, 17), (8, 9)), ((2, 3), (5, 5)),
                                       ((64, 64), (64, 1)), ((40, 3000), (20, 1501))])
def test_flip_is_the_mirror(shape: tuple[int, int], out: tuple[int, int]) -> None:
    img = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    assert np.array_equal(_ext(img, *out, flip=True), _ext(img, *out)[:, ::-1])


@needs_ext
def test_crop_views_read_only_the_crop() -> None:
    """A crop is a view with the big image's row stride; the pixels around it must not matter."""
    rng = np.random.default_rng(2)
    big = rng.integers(0, 256, (400, 520, 3), dtype=np.uint8)
    for top, left, h, w in [(0, 0, 400, 520), (13, 7, 250, 301), (399, 519, 1, 1), (100, 518, 50, 2), (0, 1, 3, 519)]:
        view = big[top:top + h, left:left + w]
        assert np.array_equal(_ext(view, 64, 80), _ext(np.ascontiguousarray(view), 64, 80))
        poisoned = big.copy()
        poisoned[:, :left], poisoned[:, left + w:], poisoned[:top], poisoned[top + h:] = 0, 255, 0, 255
        assert np.array_equal(_ext(poisoned[top:top + h, left:left + w], 64, 80), _ext(view, 64, 80))


LEVELS = ("scalar", "ssse3", "avx2")


@needs_simd
@settings(max_examples=150, deadline=None)
@given(h=st.integers(1, 300), w=st.integers(1, 300), oh=st.integers(1, 240), ow=st.integers(1, 240),
       flip=st.booleans(), seed=st.integers(0, 2**31))
def test_every_instruction_set_gives_the_scalar_integers(h: int, w: int, oh: int, ow: int, flip: bool,
                                                         seed: int) -> None:
    img = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    best = _resize.simd()
    got = {}
    try:
        for level in LEVELS[: LEVELS.index(best) + 1]:
            _resize.limit(level)
            assert _resize.simd() == level
            got[level] = _ext(img, oh, ow, flip)
    finally:
        _resize.limit("avx2")
    for level, out in got.items():
        assert np.array_equal(out, got["scalar"]), level


@needs_ext
def test_limit_names_the_choices() -> None:
    with pytest.raises(ValueError, match="scalar, ssse3 or avx2"):
        _resize.limit("neon")


@needs_ext
def test_does_not_write_outside_dst() -> None:
    """The SIMD stores write 8 bytes for 6: a batch row's neighbours must be untouched."""
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (90, 70, 3), dtype=np.uint8)
    for ow in (1, 2, 3, 7, 8, 33):
        batch = np.full((3, 11, ow, 3), 77, np.uint8)
        _resize.resize(img, batch[1], True)
        assert (batch[0] == 77).all() and (batch[2] == 77).all()


@needs_ext
def test_bad_buffers_are_refused_with_what_is_wrong() -> None:
    img = np.zeros((10, 10, 3), np.uint8)
    dst = np.empty((5, 5, 3), np.uint8)
    with pytest.raises(ValueError, match="3 channels"):
        _resize.resize(np.zeros((10, 10, 4), np.uint8), dst)
    with pytest.raises(ValueError, match="uint8"):
        _resize.resize(img.astype(np.float32), dst)
    with pytest.raises(ValueError, match="3 adjacent bytes"):
        _resize.resize(img[:, ::2], dst)
    with pytest.raises(ValueError, match="empty"):
        _resize.resize(img[:0], dst)
    with pytest.raises((ValueError, BufferError)):
        _resize.resize(img, np.empty((5, 5, 3), np.uint8)[:, ::-1])  # not C-contiguous
    readonly = np.empty((5, 5, 3), np.uint8)
    readonly.setflags(write=False)
    with pytest.raises((ValueError, BufferError)):
        _resize.resize(img, readonly)


@needs_ext
def test_threads_resize_at_once() -> None:
    """The GIL is released while it runs: threads give the same results as one thread."""
    rng = np.random.default_rng(4)
    imgs = [rng.integers(0, 256, (int(rng.integers(50, 400)), int(rng.integers(50, 400)), 3), dtype=np.uint8)
            for _ in range(16)]
    want = [_ext(im, 224, 224, k % 2 == 1) for k, im in enumerate(imgs)]
    got: list[np.ndarray | None] = [None] * len(imgs)

    def work(k: int) -> None:
        for _ in range(5):
            got[k] = _ext(imgs[k], 224, 224, k % 2 == 1)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(imgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_resize_into_uses_the_kernel_or_opencv() -> None:
    """``resize_into`` (the JPEG and raw paths' resize) matches exact bilinear either way; the
    environment switch turns the kernel off, in a fresh process."""
    rng = np.random.default_rng(5)
    img = cv2.GaussianBlur(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8), (0, 0), 1.5)
    crop = img[20:300, 30:400]  # < 2x each side: one bilinear step
    dst = np.empty((224, 224, 3), np.uint8)
    resize.resize_into(cv2, crop, dst, flip=True)
    assert np.abs(dst[:, ::-1].astype(np.int16) - reference(crop, 224, 224)).max() <= 3.0
    expected = (f"fastfeed._resize ({_resize.simd()})" if _resize is not None and _resize.simd() != "scalar"
                else "OpenCV INTER_LINEAR")
    assert resize.kernel() == expected
    code = "from fastfeed.decode import resize; print(resize.kernel())"
    env = dict(os.environ, **{resize.NO_EXTENSION_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "OpenCV INTER_LINEAR"
