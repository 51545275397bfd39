"""Images stored as pixels (``pack --store raw``): made at pack time, cropped without a decode when loading.

A raw image is the field :data:`~fastfeed.formats.naming.RAW_FIELD` (``rgb8``): uint8 RGB,
``height x width x 3``, row-major (HWC), nothing else: no header, no pickle. Its shape lives in
the index (``shapes.npy``), and the loader hands it to the decoder as the sample's
``"__shape__"`` entry.

- :func:`to_pixels` is the pack side: decode an image file as the CPU loader decodes it
  (:class:`~fastfeed.decode.image.ImageDecoder`: EXIF orientation applied; grayscale, CMYK,
  palette, alpha and 16-bit images to 8-bit RGB), then bound its longer side to ``max_side``
  with OpenCV's ``INTER_AREA`` (aspect kept, sides rounded as :func:`fit_size` says).
- :func:`pixels` is the load side: the bytes as an ``(h, w, 3)`` view, refused with a
  :class:`~fastfeed.errors.SampleError` that names the expected byte count when the length
  does not match the shape (a truncated or replaced sample).
- :func:`crop_into` crops a view of those pixels and resizes it into the batch buffer with
  the same resize as the JPEG path (:func:`~fastfeed.decode.resize.resize_into`), so for a
  dataset packed without ``max_side`` the crop box of a sample, a function of ``(seed, epoch,
  sample)`` and of the upright image size, is the same whichever way it was stored.

Example:
    >>> import numpy as np
    >>> from tools.synth import make_jpeg
    >>> arr = to_pixels(make_jpeg(np.random.default_rng(0), (64, 48)), max_side=32)
    >>> arr.shape, arr.dtype.name
    ((24, 32, 3), 'uint8')
    >>> view = pixels(arr.tobytes(), (24, 32))
    >>> dst = np.empty((16, 16, 3), np.uint8)
    >>> crop_into(view, dst, lambda h, w: (0, 0, h, w), flip=False)
    >>> pixels(b"123", (24, 32))
    Traceback (most recent call last):
    ...
    fastfeed.errors.SampleError: raw pixels (field rgb8): 3 bytes, expected 2304 (24 x 32 x 3, from shapes.npy); the sample is truncated or does not belong to this index: run `fastfeed verify`, re-pack
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

from fastfeed.decode.resize import resize_into, resize_into_pillow
from fastfeed.errors import SampleError
from fastfeed.formats.naming import RAW_FIELD
from fastfeed.formats.span import FileSpan

__all__ = ["RAW_FIELD", "SpanPixels", "crop_into", "fit_size", "is_pixels", "pixels", "raw_bytes", "to_pixels"]

_DECODERS: dict[int, Any] = {}


def fit_size(height: int, width: int, max_side: int | None) -> tuple[int, int]:
    """(height, width) with the longer side bounded by ``max_side``, aspect kept (sides rounded, >= 1).

    Example:
        >>> fit_size(375, 500, 256), fit_size(100, 80, 256), fit_size(10, 4000, 64)
        ((192, 256), (100, 80), (1, 64))
    """
    if max_side is None or max(height, width) <= max_side:
        return int(height), int(width)
    scale = max_side / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def raw_bytes(height: int, width: int) -> int:
    """Bytes of a raw image of that shape (3 per pixel).

    Example:
        >>> raw_bytes(375, 500)
        562500
    """
    return 3 * int(height) * int(width)


def _decoder() -> Any:
    """This process's :class:`~fastfeed.decode.image.ImageDecoder` (for the pack side only)."""
    dec = _DECODERS.get(os.getpid())
    if dec is None:
        # imported here, not above: fastfeed.decode.image brings torch (decode.path), which the
        # loader needs anyway and ``fastfeed.pack`` must not load for its start-up time
        from fastfeed.decode.image import ImageDecoder

        dec = ImageDecoder.__new__(ImageDecoder)
        dec.__setstate__({"backend": "auto"})  # no decode-path log line from every pack worker
        _DECODERS.clear()
        _DECODERS[os.getpid()] = dec
    return dec


_CV2: dict[int, Any] = {}


def _cv2() -> Any:
    """OpenCV, single-threaded in this process (as in the loader: one decode per process); None without it."""
    pid = os.getpid()
    if pid in _CV2:
        return _CV2[pid]
    try:
        import cv2
    except ImportError:  # pragma: no cover - OpenCV is a core dependency
        cv2 = None
    if cv2 is not None and cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
    _CV2.clear()
    _CV2[pid] = cv2
    return cv2


def to_pixels(data: bytes, max_side: int | None = None) -> np.ndarray:
    """Decode an image file to a C-contiguous uint8 ``(h, w, 3)`` RGB array, upright, longer side <= ``max_side``.

    Raises:
        SampleError: the bytes are not a readable image (the message says why).
    """
    arr = _decoder().decode(data)
    h, w = arr.shape[:2]
    th, tw = fit_size(h, w, max_side)
    if (th, tw) != (h, w):
        cv2 = _cv2()
        if cv2 is not None:
            arr = cv2.resize(arr, (tw, th), interpolation=cv2.INTER_AREA)
        else:  # pragma: no cover - OpenCV is a core dependency
            from PIL import Image

            arr = np.asarray(Image.fromarray(arr).resize((tw, th), Image.BOX))
    return np.ascontiguousarray(arr, dtype=np.uint8)


class SpanPixels:
    """Raw pixels of shape ``(h, w, 3)`` still in their shard (a :class:`~fastfeed.formats.span.FileSpan`):
    :func:`crop_into` reads only the crop's rows; ``np.asarray`` or :meth:`copy` reads them all."""

    __slots__ = ("span", "shape")

    def __init__(self, span: FileSpan, h: int, w: int) -> None:
        self.span, self.shape = span, (h, w, 3)

    def rows(self, top: int, count: int) -> np.ndarray:
        """Rows ``top .. top + count`` as a ``(count, w, 3)`` view of this thread's reused buffer
        (valid until the next call in the thread)."""
        row = 3 * self.shape[1]
        out = _row_buffer(count * row)
        self.span.readinto(memoryview(out), top * row)
        return out.reshape(count, self.shape[1], 3)

    def copy(self) -> np.ndarray:
        """All pixels, in a new writable array."""
        return self.rows(0, self.shape[0]).copy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.copy()
        return arr if dtype is None else arr.astype(dtype, copy=False)


_BUFFERS = threading.local()


def _row_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of this thread's reusable read buffer (grown as needed, never shrunk)."""
    buf = getattr(_BUFFERS, "buf", None)
    if buf is None or buf.size < nbytes:
        buf = _BUFFERS.buf = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
    return buf[:nbytes]


def pixels(data: bytes | memoryview | FileSpan, shape: Sequence[int] | None) -> np.ndarray | SpanPixels:
    """The raw image ``data`` as a read-only ``(h, w, 3)`` uint8 view (no copy); a sample
    still in its shard (a :class:`~fastfeed.formats.span.FileSpan`) as :class:`SpanPixels`,
    read when cropped.

    Raises:
        SampleError: no shape (the sample was read without its index), or a byte count
            that does not match it.
    """
    if shape is None:
        raise SampleError(f"field {RAW_FIELD} holds raw pixels whose shape is in the dataset's shapes.npy, and "
                          "this sample came without it; load the dataset by its folder (with index.json), not "
                          "by its shard files")
    h, w = int(shape[0]), int(shape[1])
    need = raw_bytes(h, w)
    if len(data) != need or need == 0:
        raise SampleError(f"raw pixels (field {RAW_FIELD}): {len(data)} bytes, expected {need} ({h} x {w} x 3, "
                          "from shapes.npy); the sample is truncated or does not belong to this index: run "
                          "`fastfeed verify`, re-pack")
    if type(data) is FileSpan:
        return SpanPixels(data, h, w)
    return np.frombuffer(data, dtype=np.uint8).reshape(h, w, 3)


def is_pixels(data: Any) -> bool:
    """True for what :func:`pixels` returns (an array, or pixels still in their shard)."""
    return isinstance(data, (np.ndarray, SpanPixels))


def crop_into(arr: np.ndarray | SpanPixels, dst: np.ndarray, box: Callable[[int, int], tuple[int, int, int, int]],
              *, flip: bool) -> None:
    """Crop ``box(h, w)`` of the upright ``arr`` (a view, no copy), resize it into ``dst`` (HWC), flip.

    Args:
        arr: ``(h, w, 3)`` uint8 pixels (from :func:`pixels`); from :class:`SpanPixels`
            only the crop's rows are read.
        dst: a C-contiguous ``(out_h, out_w, 3)`` uint8 array to fill (a row of the batch buffer).
        box: chooses the crop ``(top, left, height, width)`` from ``(h, w)``.
        flip: mirror the result horizontally.
    """
    h, w = arr.shape[:2]
    top, left, ch, cw = box(h, w)
    if type(arr) is SpanPixels:
        top, arr = 0, arr.rows(top, ch)
    cv2 = _cv2()
    if cv2 is not None:
        resize_into(cv2, arr[top: top + ch, left: left + cw], dst, flip)
    else:  # pragma: no cover - OpenCV is a core dependency
        ah = arr.shape[0]  # h, or the crop's rows read from the shard
        resize_into_pillow(np.ascontiguousarray(arr), (top / ah, left / w, ch / ah, cw / w), dst, flip)
