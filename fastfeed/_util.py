"""Small shared helpers: sizes, durations and ``on_error`` modes as users write them."""

from __future__ import annotations

import math
import numbers
import re
import warnings

from fastfeed.errors import ConfigError

__all__ = ["ON_ERROR", "check_on_error", "format_bytes", "parse_duration", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}


def parse_size(value: str | int | float, what: str = "size") -> int:
    """Parse ``"256MB"``, ``"1.5GiB"`` or a number of bytes.

    Example:
        >>> parse_size("256MB"), parse_size("1KiB"), parse_size(10)
        (256000000, 1024, 10)
        >>> parse_size(10**400, "cache_size")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: cache_size=1000...000 is not a size; write a finite number of bytes, e.g. ...
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ConfigError(f"{what}={value!r} is not a size; write e.g. 256MB, 1GiB or 1000000")
    if isinstance(value, numbers.Real):
        if not _finite(value):
            raise ConfigError(f"{what}={value!r} is not a size; write a finite number of bytes, e.g. 256MB, 1GiB or "
                              "1000000")
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"{what}={value!r} is not a size; write e.g. 256MB, 1GiB or 1000000")
        scaled = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if not math.isfinite(scaled):
            raise ConfigError(f"{what}={value!r} is not a size; write e.g. 256MB, 1GiB or 1000000")
        n = int(scaled)
    if n <= 0:
        raise ConfigError(f"{what}={value!r} must be positive")
    return n


def parse_duration(value: str | int | float, what: str = "duration") -> float:
    """Parse ``"60s"``, ``"2m"``, ``"0.5"`` (seconds).

    Example:
        >>> parse_duration("2m"), parse_duration("1.5s"), parse_duration(3)
        (120.0, 1.5, 3.0)
        >>> parse_duration(10**400, "timeout")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: timeout=1000...000 is not a duration; write a finite number of seconds, ...
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ConfigError(f"{what}={value!r} is not a duration; write e.g. 60s, 2m or 30")
    if isinstance(value, numbers.Real):
        if not _finite(value):
            raise ConfigError(f"{what}={value!r} is not a duration; write a finite number of seconds, e.g. 60s, "
                              "2m or 30")
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|)\s*", str(value))
    if m is None:
        raise ConfigError(f"{what}={value!r} is not a duration; write e.g. 60s, 2m or 30")
    scale = {"ms": 1e-3, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    seconds = float(m.group(1)) * scale
    if not math.isfinite(seconds):
        raise ConfigError(f"{what}={value!r} is not a duration; write a finite number of seconds, e.g. 60s, 2m or 30")
    return seconds


def _finite(value: numbers.Real) -> bool:
    """True for a finite real number; False for nan, inf and an integer too large for a float (10**400)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def format_bytes(n: float) -> str:
    """Human-readable bytes (decimal units), e.g. ``1.5 GB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


#: What ``on_error`` may be, for ``pack`` and ``loader()`` alike: stop at the first bad
#: input with an error naming it, or skip it (counted and reported).
ON_ERROR = ("raise", "skip")
_OLD_ON_ERROR = {"fail": "raise"}


def check_on_error(value: str, what: str = "on_error") -> str:
    """Validate an ``on_error`` mode: ``"raise"`` or ``"skip"``.

    The old spelling ``"fail"`` (``pack`` before 0.2) still means ``"raise"``, with a
    :class:`FutureWarning` that says so.

    Example:
        >>> check_on_error("skip")
        'skip'
    """
    if not isinstance(value, str):
        raise ConfigError(f"{what}={value!r}; use 'raise' (stop at the first bad input) or 'skip' "
                          "(leave it out, counted and reported)")
    if value in _OLD_ON_ERROR:
        new = _OLD_ON_ERROR[value]
        warnings.warn(f"{what}={value!r} is the old spelling of {new!r}; pass {what}={new!r}",
                      FutureWarning, stacklevel=3)
        return new
    if value not in ON_ERROR:
        raise ConfigError(f"{what}={value!r}; use 'raise' (stop at the first bad input) or 'skip' "
                          "(leave it out, counted and reported)")
    return value
