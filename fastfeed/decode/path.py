"""Which JPEG decode path the CPU decoder takes on this install, said once in one log line.

Three paths, best first (a plain ``pip install .`` from the clone gives the first where a C compiler and
libjpeg-turbo's headers are present):

- ``region``: simplejpeg + OpenCV (core dependencies) and the C extension
  ``fastfeed._jpegroi``: every JPEG crop decodes only its region; restart-marked JPEGs
  (``fastfeed pack``'s default) only the crop's segments.
- ``restart-cut``: the extension is not built (no C compiler or libjpeg-turbo headers at
  install): restart-marked JPEGs are cut in Python (:func:`fastfeed.decode.roi.cut_restarts`),
  plain JPEGs decoded whole.
- ``pillow``: simplejpeg or OpenCV does not import (or ``decode_backend="pillow"``).

The line also names the bilinear resize (:func:`fastfeed.decode.resize.kernel`: the C
extension ``fastfeed._resize`` or OpenCV).

Example:
    >>> decode_path("pillow").name
    'pillow'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch.utils.data import get_worker_info

from fastfeed.decode import resize, roi
from fastfeed.dist import resolve_world
from fastfeed.errors import ConfigError

__all__ = ["BACKENDS", "DecodePath", "decode_path", "report_path", "turbo_available"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "turbo", "pillow")


def _missing_turbo() -> list[str]:
    """The turbo libraries that do not import (empty: simplejpeg and OpenCV both do)."""
    missing = []
    for name in ("simplejpeg", "cv2"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def turbo_available() -> bool:
    """True when simplejpeg and OpenCV import (core dependencies; absent only when removed)."""
    return not _missing_turbo()


# CPU per image of each path relative to the default one (simplejpeg + OpenCV + the
# extension on restart-marked JPEGs), RandomResizedCrop 224 of ~500x375 q90 JPEGs on one
# core; measured by benchmarks/decode_per_core.py (figures in benchmarks/RESULTS.md, issue 17).
_COST_PY_CUT = "about 1.3x"
_COST_FULL = "about 1.6x"
_COST_PILLOW = "about 3x"
# How to get the extension built: the headers that fastfeed/_jpegroi.c includes (jpeglib.h; Debian's
# libturbojpeg0-dev has only turbojpeg.h), then a rebuild from the clone (fastfeed is on no index).
_BUILD_FIX = ("to build it, install a C compiler and libjpeg-turbo's headers (Debian: apt-get install gcc "
              "libjpeg62-turbo-dev; Ubuntu: apt-get install gcc libjpeg-turbo8-dev; libturbojpeg0-dev has no "
              "jpeglib.h), then reinstall from the fastfeed clone: pip install --no-deps --force-reinstall . "
              "(pip install --no-deps -e . for an editable install)")


@dataclass(frozen=True)
class DecodePath:
    """Which JPEG decode path the CPU decoder takes on this install, and what it costs."""

    #: ``region`` (the extension crops every JPEG), ``restart-cut`` (restart-marked JPEGs
    #: cropped in Python, others decoded whole), ``pillow``
    name: str
    #: one log line: the path, what it falls back from and to, the cost, the fix
    message: str
    #: True when this is not the default path (a library or the extension is missing)
    degraded: bool


def decode_path(backend: str = "auto") -> DecodePath:
    """The decode path ``ImageDecoder(backend)`` takes here (see the module docstring).

    Example:
        >>> decode_path("pillow").name
        'pillow'
    """
    if backend not in BACKENDS:
        raise ConfigError(f"decode_backend={backend!r}; choose one of {', '.join(BACKENDS)}")
    missing = [] if backend == "pillow" else _missing_turbo()
    if backend == "pillow" or missing:
        why = "decode_backend='pillow'" if backend == "pillow" else f"{' and '.join(missing)} not importable"
        fix = "" if backend == "pillow" else "; pip install simplejpeg opencv-python-headless"
        return DecodePath("pillow", f"decode: Pillow ({why}); {_COST_PILLOW} the CPU per image of the "
                          f"default path (simplejpeg + OpenCV, crops decoded by region){fix}", backend != "pillow")
    resized = f"; bilinear resize: {resize.kernel()}"
    if roi.available():
        return DecodePath("region", "decode: simplejpeg + OpenCV; JPEG crops decoded by region "
                          "(fastfeed._jpegroi; restart-marked JPEGs, fastfeed pack's default, cut by segment)"
                          + resized, False)
    return DecodePath("restart-cut", "decode: simplejpeg + OpenCV without fastfeed._jpegroi (not built: no C compiler "
                      "or libjpeg-turbo headers when fastfeed was installed); crops of restart-marked JPEGs "
                      f"(fastfeed pack's default) are cut in Python, {_COST_PY_CUT} the CPU per image; plain "
                      f"JPEGs are decoded whole, {_COST_FULL}{resized}; {_BUILD_FIX}", True)


_REPORTED = False


def report_path(backend: str) -> None:
    """Log :func:`decode_path` once per process, in the main process of rank 0 only."""
    global _REPORTED
    if _REPORTED:
        return
    if get_worker_info() is not None:
        return
    try:
        rank, _ = resolve_world()
    except ConfigError:  # a broken RANK/WORLD_SIZE is the loader's error to report, not this line's
        rank = 0
    _REPORTED = True
    if rank != 0:
        return
    path = decode_path(backend)
    log.log(logging.WARNING if path.degraded else logging.INFO, "%s", path.message)
