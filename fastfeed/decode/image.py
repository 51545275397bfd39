"""Image decoding for the CPU path: DCT-scaled JPEG decode, crop and resize into a buffer.

Two backends, picked by ``backend``:

- ``"turbo"``: JPEGs through simplejpeg (libjpeg-turbo, ``fastdct``) and crops resized
  with OpenCV (both core dependencies). Other formats, CMYK/YCCK JPEGs and anything
  simplejpeg rejects go through Pillow, then OpenCV.
- ``"pillow"``: Pillow only (``Image.draft`` for the DCT scaling, ``Image.resize`` with
  a crop box).
- ``"auto"`` (default): ``"turbo"`` when simplejpeg and OpenCV import, else ``"pillow"``.

Either way the crop is chosen first, on the header's size, and the JPEG is decoded at
the smallest power-of-two DCT reduction (1/2, 1/4, 1/8) that still leaves the crop at
least as large as the output, which is much cheaper than a full decode plus resize.
With ``"turbo"``, only the crop's region of a JPEG is decoded: by the extension
``fastfeed._jpegroi`` when it is built (:mod:`fastfeed.decode.roi`), else, for JPEGs with
restart markers (``fastfeed pack``'s default), by cutting the crop's segments out in
Python and decoding those with simplejpeg. :func:`decode_path` says which path is on;
the first decoder of a process (the main process of rank 0) logs it in one line.
EXIF orientation is applied (the crop is drawn on the upright image); grayscale, CMYK,
palette, alpha and 16-bit images come out as 8-bit RGB (alpha dropped, as
``Image.convert("RGB")`` does).

Example:
    >>> import numpy as np
    >>> from tools.synth import make_jpeg
    >>> dec = ImageDecoder("pillow")
    >>> dst = np.empty((32, 32, 3), np.uint8)
    >>> dec.decode_into(make_jpeg(np.random.default_rng(0), (64, 48)), dst,
    ...                 lambda h, w: (0, 0, h, w), flip=False)
    >>> dec.decode(make_jpeg(np.random.default_rng(0), (64, 48))).shape
    (48, 64, 3)
"""

from __future__ import annotations

import io
import logging
import os
import struct
from typing import Any, Callable

import numpy as np

from fastfeed.decode import roi
from fastfeed.decode._exif import jpeg_orientation
from fastfeed.decode.geometry import dct_denominator
from fastfeed.decode.path import BACKENDS, DecodePath, decode_path, report_path, turbo_available
from fastfeed.decode.resize import resize_into, resize_into_pillow
from fastfeed.errors import ConfigError, SampleError, missing_dependency

# resize_into lives in fastfeed.decode.resize; importable from here too
__all__ = ["BACKENDS", "Box", "DecodePath", "ImageDecoder", "decode_path", "resize_into", "turbo_available"]

log = logging.getLogger(__name__)

#: Given the upright image's (height, width), return the crop (top, left, height, width).
Box = Callable[[int, int], tuple[int, int, int, int]]

_JPEG_MAGIC = b"\xff\xd8\xff"
_JPEG_EOI = b"\xff\xd9"
_EXIF_ORIENTATION = 0x0112


# What Pillow / simplejpeg / OpenCV raise on bad bytes (Pillow: OSError incl.
# UnidentifiedImageError, SyntaxError, EOFError, struct.error or IndexError on broken
# headers, DecompressionBombError; simplejpeg: ValueError; OpenCV: cv2.error)
_BAD_IMAGE: tuple[type[BaseException], ...] = (
    OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error,
)


def _bad(e: BaseException, data: bytes) -> SampleError:
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        why = f"not an image format Pillow can read; its {len(data)} bytes start with {bytes(data[:8])!r}"
    else:
        why = f"{type(e).__name__}: {e}"
    return SampleError(f"cannot decode the image ({why})")


def _orient(arr: np.ndarray, orientation: int) -> np.ndarray:
    """Apply an EXIF orientation (1..8) to an HWC array; returns a contiguous array."""
    if orientation == 2:
        arr = arr[:, ::-1]
    elif orientation == 3:
        arr = arr[::-1, ::-1]
    elif orientation == 4:
        arr = arr[::-1]
    elif orientation == 5:
        arr = arr.transpose(1, 0, 2)
    elif orientation == 6:
        arr = arr.transpose(1, 0, 2)[:, ::-1]
    elif orientation == 7:
        arr = arr[::-1, ::-1].transpose(1, 0, 2)
    elif orientation == 8:
        arr = arr.transpose(1, 0, 2)[::-1]
    return np.ascontiguousarray(arr)


def _to_rgb(im: Any) -> Any:
    """Any Pillow image as mode RGB (8 bits per channel)."""
    from PIL import Image

    mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        arr = np.asarray(im).astype(np.uint32) >> 8  # 16-bit samples to 8 bits
        return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        return Image.fromarray(np.clip(np.asarray(im), 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode in ("P", "PA") and "transparency" in im.info:
        return im.convert("RGBA").convert("RGB")
    return im.convert("RGB")


def _pixel_box(rel: tuple[float, float, float, float], H: int, W: int) -> tuple[int, int, int, int]:
    """A crop given as fractions (top, left, height, width) of an H x W image, in pixels
    ``(y0, x0, y1, x1)``."""
    y0 = min(H - 1, int(rel[0] * H))
    x0 = min(W - 1, int(rel[1] * W))
    y1 = max(y0 + 1, min(H, int(round((rel[0] + rel[2]) * H))))
    x1 = max(x0 + 1, min(W, int(round((rel[1] + rel[3]) * W))))
    return y0, x0, y1, x1


class ImageDecoder:
    """Decode image bytes to RGB uint8 arrays, optionally cropping and resizing into ``dst``.

    Args:
        backend: ``"auto"``, ``"turbo"`` or ``"pillow"`` (see the module docstring).

    Not thread-safe; make one per worker process (it is cheap, and picklable before use).
    The first one made in a process (the main process of rank 0) logs :func:`decode_path`.
    """

    def __init__(self, backend: str = "auto") -> None:
        self._setup(backend)
        report_path(backend)

    def _setup(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"decode_backend={backend!r}; choose one of {', '.join(BACKENDS)}")
        if backend == "turbo" and not turbo_available():
            raise missing_dependency("simplejpeg", "turbo", "decode_backend='turbo'")
        self.backend = backend
        self._loaded_pid = -1
        self._sj: Any = None
        self._cv2: Any = None
        self._roi = False  # the extension crops every JPEG
        self._cut = False  # restart-marked JPEGs are cut in Python (roi.cut_restarts)
        self._scratch = np.empty(0, np.uint8)  # reused by the region decoder
        self._errors: tuple[type[BaseException], ...] = _BAD_IMAGE

    def __getstate__(self) -> dict[str, Any]:
        return {"backend": self.backend}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["backend"])  # no log line: the process that made it logged

    @property
    def uses_turbo(self) -> bool:
        """True when JPEGs go through simplejpeg + OpenCV."""
        self._load()
        return self._sj is not None

    def _load(self) -> None:
        if self._loaded_pid == os.getpid():
            return
        self._loaded_pid = os.getpid()
        from PIL import Image

        self._errors = (*_BAD_IMAGE, Image.DecompressionBombError)
        if self.backend == "pillow" or (self.backend == "auto" and not turbo_available()):
            self._sj = self._cv2 = None
            self._roi = self._cut = False
            return
        import cv2
        import simplejpeg

        # One decode per process, single-threaded OpenCV in every process that decodes (the
        # main one too): its threads only contend with the other workers, and a thread pool
        # that exists when DataLoader forks its workers can hang them in OpenCV's next call.
        if cv2.getNumThreads() != 1:
            cv2.setNumThreads(1)
        self._sj, self._cv2 = simplejpeg, cv2
        self._roi = roi.available()
        self._cut = not self._roi
        self._errors = (*self._errors, cv2.error)

    # ------------------------------------------------------------------ full decode
    def decode(self, data: bytes) -> np.ndarray:
        """The whole image, upright, as an RGB uint8 ``(H, W, 3)`` array.

        Raises:
            SampleError: the bytes are not a readable image (the message says why).
        """
        self._load()
        try:
            return self._decode(data)
        except self._errors as e:
            raise _bad(e, data) from None

    def _decode(self, data: bytes) -> np.ndarray:
        if self._sj is not None and data[:3] == _JPEG_MAGIC:
            arr = self._turbo(data, 1)
            if arr is not None:
                return arr
        arr, _ = self._pillow(data, lambda h, w: (0, 0, h, w), None)
        return arr

    def _turbo(self, data: bytes, d: int, hw: tuple[int, int] | None = None,
               orientation: int | None = None) -> np.ndarray | None:
        """simplejpeg decode at reduction 1/d, upright; None when Pillow should do it."""
        try:
            if hw is None:
                h, w, colorspace, _ = self._sj.decode_jpeg_header(data)
                if colorspace in ("CMYK", "YCCK"):
                    return None
            else:
                h, w = hw
            arr = self._sj.decode_jpeg(
                data, "RGB", fastdct=True, min_height=-(-h // d), min_width=-(-w // d)
            )
        except ValueError:  # anything libjpeg-turbo rejects gets a second chance in Pillow
            return None
        if orientation is None:
            orientation = jpeg_orientation(data)
        return arr if orientation == 1 else _orient(arr, orientation)

    # ------------------------------------------------------------------ crop + resize
    def decode_into(self, data: bytes, dst: np.ndarray, box: Box, *, flip: bool) -> None:
        """Decode, crop ``box(h, w)`` of the upright image, resize into ``dst`` (HWC), flip.

        Args:
            data: encoded image bytes.
            dst: a C-contiguous ``(out_h, out_w, 3)`` uint8 array to fill.
            box: chooses the crop from the upright image size.
            flip: mirror the result horizontally.

        Raises:
            SampleError: the bytes are not a readable image (the message says why).
        """
        self._load()
        try:
            self._decode_into(data, dst, box, flip)
        except self._errors as e:
            raise _bad(e, data) from None

    def _decode_into(self, data: bytes, dst: np.ndarray, box: Box, flip: bool) -> None:
        out_h, out_w = dst.shape[:2]
        if (self._roi or self._cut) and data[:3] == _JPEG_MAGIC and self._roi_into(data, dst, box, flip):
            return
        if self._sj is not None and data[:3] == _JPEG_MAGIC:
            try:
                h, w, colorspace, _ = self._sj.decode_jpeg_header(data)
            except ValueError:
                colorspace = "?"
            if colorspace not in ("CMYK", "YCCK", "?"):
                orientation = jpeg_orientation(data)
                oh, ow = (w, h) if orientation >= 5 else (h, w)
                top, left, ch, cw = box(oh, ow)
                arr = self._turbo(data, dct_denominator(ch, cw, out_h, out_w), (h, w), orientation)
                if arr is not None:
                    self._resize_cv2(arr, (top / oh, left / ow, ch / oh, cw / ow), dst, flip)
                    return
        arr, rel = self._pillow(data, box, (out_h, out_w))
        if self._cv2 is not None:
            self._resize_cv2(arr, rel, dst, flip)
        else:
            self._resize_pillow(arr, rel, dst, flip)

    def _roi_into(self, data: bytes, dst: np.ndarray, box: Box, flip: bool) -> bool:
        """Decode only the crop (:mod:`fastfeed.decode.roi`); False leaves it to the full decoders.

        Only for JPEGs that end with their EOI marker (zero padding allowed): a truncated
        file (or one with other data after the image) goes to the full decoders, so whether
        it is an error does not depend on where this epoch's crop falls.
        """
        if not bytes(data[-64:]).rstrip(b"\0").endswith(_JPEG_EOI):
            return False
        if self._roi:
            head = roi.header(data)
            if head is None or not head[2]:
                return False
            h, w = head[0], head[1]
        else:
            try:
                h, w, colorspace, _ = self._sj.decode_jpeg_header(data)
            except ValueError:
                return False
            if colorspace in ("CMYK", "YCCK"):
                return False
        orientation = jpeg_orientation(data)
        oh, ow = (w, h) if orientation >= 5 else (h, w)
        top, left, ch, cw = box(oh, ow)
        out_h, out_w = dst.shape[:2]
        d = dct_denominator(ch, cw, out_h, out_w)
        sh, sw = -(-h // d), -(-w // d)  # libjpeg's scaled size
        H, W = (sw, sh) if orientation >= 5 else (sh, sw)
        y0, x0, y1, x1 = _pixel_box((top / oh, left / ow, ch / oh, cw / ow), H, W)
        rect = (y0, x0, y1 - y0, x1 - x0)
        if orientation != 1:
            rect = roi.stored_rect(rect, orientation=orientation, stored_hw=(sh, sw))
        crop = self._crop_ext(data, d, rect) if self._roi else self._crop_cut(data, d, rect)
        if crop is None:
            return False
        if orientation != 1:
            crop = _orient(crop, orientation)
        self._resize_crop(crop, dst, flip)
        return True

    def _crop_ext(self, data: bytes, d: int, rect: tuple[int, int, int, int]) -> np.ndarray | None:
        need = roi.scratch_size(rect[2], rect[3])
        if self._scratch.size < need:
            self._scratch = np.empty(need, np.uint8)
        return roi.decode_crop(data, d, rect, self._scratch)

    def _crop_cut(self, data: bytes, d: int, rect: tuple[int, int, int, int]) -> np.ndarray | None:
        """The crop of a restart-marked JPEG through :func:`roi.cut_restarts` + simplejpeg."""
        cut = roi.cut_restarts(data, d, rect)
        if cut is None:
            return None
        try:
            sub = self._sj.decode_jpeg(cut.jpeg, "RGB", fastdct=True,
                                       min_height=-(-cut.height // d), min_width=-(-cut.width // d))
        except ValueError:
            return None
        top, left, h, w = cut.top, cut.left, rect[2], rect[3]
        if sub.shape[0] < top + h or sub.shape[1] < left + w:
            return None
        return sub[top: top + h, left: left + w]

    def _pillow(self, data: bytes, box: Box, out: tuple[int, int] | None
                ) -> tuple[np.ndarray, tuple[float, float, float, float]]:
        """Pillow decode (DCT-drafted when ``out`` allows); returns the upright array and
        the crop as fractions (top, left, height, width) of it."""
        from PIL import Image

        im = Image.open(io.BytesIO(data))
        w, h = im.size
        if im.format == "JPEG":
            orientation = jpeg_orientation(data)
        else:
            orientation = int(im.getexif().get(_EXIF_ORIENTATION, 1) or 1)
            orientation = orientation if 1 <= orientation <= 8 else 1
        oh, ow = (w, h) if orientation >= 5 else (h, w)
        top, left, ch, cw = box(oh, ow)
        if out is not None and im.format == "JPEG":
            d = dct_denominator(ch, cw, out[0], out[1])
            if d > 1:
                im.draft("RGB", (max(1, w // d), max(1, h // d)))
        arr = np.asarray(_to_rgb(im))
        if orientation != 1:
            arr = _orient(arr, orientation)
        return arr, (top / oh, left / ow, ch / oh, cw / ow)

    def _resize_cv2(self, arr: np.ndarray, rel: tuple[float, float, float, float],
                    dst: np.ndarray, flip: bool) -> None:
        y0, x0, y1, x1 = _pixel_box(rel, *arr.shape[:2])
        self._resize_crop(arr[y0:y1, x0:x1], dst, flip)

    def _resize_crop(self, crop: np.ndarray, dst: np.ndarray, flip: bool) -> None:
        resize_into(self._cv2, crop, dst, flip)

    @staticmethod
    def _resize_pillow(arr: np.ndarray, rel: tuple[float, float, float, float],
                       dst: np.ndarray, flip: bool) -> None:
        resize_into_pillow(arr, rel, dst, flip)

