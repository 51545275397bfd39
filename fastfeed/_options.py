"""One definition per option: its type, default, check, doc line and CLI flag in one place.

An option is a dataclass field made by :func:`option`; its metadata (:class:`Spec`) holds
the doc line, the check, the command-line flag and the spelling it had before it was
grouped. :func:`group` turns a class of such fields into a frozen, keyword-only dataclass
that checks every value when it is built and writes its ``Attributes:`` docstring from the
doc lines, so the reference, ``help()``, the CLI's ``--help`` and the checks all read the
same definition. :func:`fill_doc` does the same for a function's ``Args:`` section.

Example:
    >>> @group
    ... class Retry:
    ...     '''How a read is retried.'''
    ...     attempts: int = option(3, "tries before giving up", check=lambda v, name: int(v))
    >>> Retry(attempts="5").attempts
    5
    >>> print(Retry.__doc__.splitlines()[-1].strip())
    attempts: tries before giving up (default 3).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import textwrap
from dataclasses import MISSING, dataclass, field, fields
from numbers import Integral, Real
from typing import Any, Callable, Iterator, Mapping, TypeVar

from fastfeed.errors import ConfigError

__all__ = ["MAX_COUNT", "Spec", "as_bool", "at_least", "auto_or_int", "callable_or_none", "check_int", "doc_lines",
           "fill_doc", "group", "is_group", "mapping_or_none", "number", "one_of", "option", "parse_int",
           "path_or_none", "specs", "text_or_none"]

T = TypeVar("T")
#: ``check(value, name) -> value``: returns the value to store (normalised), raises ConfigError.
Check = Callable[[Any, str], Any]
_KEY = "fastfeed"


@dataclass(frozen=True)
class Spec:
    """What one option is, besides its name, type and default (the field's).

    Attributes:
        doc: one line for the docs, ``help()`` and ``--help``.
        check: validates and normalises a value (None: taken as given).
        flag: the command-line flag (``"--num-workers"``), None for none.
        parse: turns the flag's text into a value (default: the text).
        metavar: the flag's placeholder in ``--help``.
        choices: the flag's allowed texts.
        legacy: the flat ``loader()`` keyword this option had before it was grouped
            (None: the field's own name; ``""``: none, an option born in its group).
        extra: anything a backend needs to know about the option (read by name). The flag
            builder (:func:`fastfeed.cli.args.add_option_flags`) reads three: ``switch``
            (``"negatable"``: ``--x`` / ``--no-x``; ``"on"``: ``--x`` alone turns it on),
            ``exclusive`` (flags with the same name exclude each other) and ``flag_default``
            (the flag's default when it differs from the option's, as the flag's text).
    """

    doc: str
    check: Check | None = None
    flag: str | None = None
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    legacy: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        """An ``extra`` entry by name."""
        return dict(self.extra).get(key, default)


def option(default: Any = MISSING, doc: str = "", *, check: Check | None = None, flag: str | None = None,
           parse: Callable[[str], Any] | None = None, metavar: str | None = None,
           choices: tuple[str, ...] | None = None, legacy: str | None = None, **extra: Any) -> Any:
    """A dataclass field carrying its :class:`Spec` (see the module docstring).

    Example:
        >>> f = option(2, "batches in flight per worker", flag="--prefetch-factor")
        >>> f.default, f.metadata["fastfeed"].flag
        (2, '--prefetch-factor')
    """
    spec = Spec(doc=doc, check=check, flag=flag, parse=parse, metavar=metavar, choices=choices, legacy=legacy,
                extra=tuple(sorted(extra.items())))
    return field(default=default, metadata={_KEY: spec})


def specs(cls: Any) -> Iterator[tuple[dataclasses.Field[Any], Spec]]:
    """The fields of a dataclass made with :func:`option`, in order, with their specs."""
    for f in fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is not None:
            yield f, spec


def is_group(value: Any) -> bool:
    """True for a class made by :func:`group` or an instance of one."""
    return getattr(value, "__fastfeed_group__", False) is True


def _default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is MISSING:
        return "required"
    value = f.default
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return "(" + ", ".join(f"{v:.4g}" for v in value) + ")"
    return repr(value)


def doc_lines(cls: Any, *, indent: int = 4, names: Any = None, defaults: bool = True) -> str:
    """Google-style lines ``name: doc (default X).`` for the options of ``cls``.

    ``names``: only these fields (in this order); default all. ``defaults``: name the
    default (a function's signature shows its own), unless the doc line already says what
    the default does (``"(default: when CUDA is available)"``): each default is said once.

    Example:
        >>> @group
        ... class Demo:
        ...     size: int = option(3, "items per batch")
        ...     pin: bool | None = option(None, "pinned copies (default: when CUDA is available)")
        >>> print(doc_lines(Demo, indent=0))
        size: items per batch (default 3).
        pin: pinned copies (default: when CUDA is available).
    """
    chosen = dict((f.name, (f, s)) for f, s in specs(cls))
    order = list(names) if names is not None else list(chosen)
    out = []
    for name in order:
        f, s = chosen[name]
        said = re.search(r"\bdefault\b", s.doc) is not None
        text = s.doc.rstrip(".") + (f" (default {_default_text(f)})." if defaults and not said else ".")
        line = f"{name}: {text}"
        out.append(textwrap.fill(line, width=100, initial_indent=" " * indent, break_on_hyphens=False,
                                 subsequent_indent=" " * (indent + 4)))
    return "\n".join(out)


def group(cls: type[T] | None = None, *, qualified: bool = True) -> Any:
    """Make ``cls`` a frozen keyword-only dataclass whose values are checked when built.

    Every field's ``check`` runs in field order; then ``cls._check_together(self)`` if the
    class defines it (for rules between fields), which returns a dict of normalised values
    or None. The class docstring gains an ``Attributes:`` section written from the fields'
    doc lines, and ``repr`` shows only the values that differ from the defaults.

    ``qualified``: a check names the option ``Class.field`` (an object users build, such as
    ``fastfeed.Crop``); with ``@group(qualified=False)``, by its bare name (the flat keywords
    of a function, such as ``pack()``'s).

    Example:
        >>> @group(qualified=False)
        ... class Limits:
        ...     '''How much at most.'''
        ...     files: int = option(10, "files at most", check=at_least(1))
        >>> Limits(files=0)
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: files=0 must be an integer >= 1
    """
    if cls is None:
        return lambda c: _make_group(c, qualified)
    return _make_group(cls, qualified)


def _make_group(cls: type[T], qualified: bool) -> type[T]:
    own_post = getattr(cls, "__post_init__", None)

    def __post_init__(self: Any) -> None:
        prefix = f"{type(self).__name__}." if qualified else ""
        for f, spec in specs(type(self)):
            if spec.check is not None:
                object.__setattr__(self, f.name, spec.check(getattr(self, f.name), prefix + f.name))
        together = getattr(type(self), "_check_together", None)
        if together is not None:
            for name, value in (together(self) or {}).items():
                object.__setattr__(self, name, value)
        if own_post is not None:
            own_post(self)

    def __repr__(self: Any) -> str:
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                   if f.default is MISSING or getattr(self, f.name) != f.default]
        return f"{type(self).__name__}({', '.join(changed)})"

    cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
    made = dataclass(frozen=True, kw_only=True, repr=False)(cls)
    made.__repr__ = __repr__  # type: ignore[method-assign]
    made.__fastfeed_group__ = True  # type: ignore[attr-defined]
    summary = (cls.__doc__ or "").rstrip()
    made.__doc__ = f"{summary}\n\n    Attributes:\n{doc_lines(made, indent=8)}\n"
    return made


def fill_doc(fn: T, cls: Any, *, names: Any, marker: str = "{options}") -> T:
    """Put the doc lines of ``names`` (options of ``cls``) where ``marker`` stands in ``fn``'s docstring.

    The marker's own indentation is kept.
    """
    doc = fn.__doc__ or ""  # type: ignore[attr-defined]
    for line in doc.splitlines():
        if line.strip() == marker:
            indent = len(line) - len(line.lstrip())
            fn.__doc__ = doc.replace(line, doc_lines(cls, indent=indent, names=names,  # type: ignore[attr-defined]
                                                     defaults=False))
            fn.__fastfeed_doc__ = True  # type: ignore[attr-defined]  # the docs read this docstring at run time
            return fn
    raise ValueError(f"{getattr(fn, '__name__', fn)}'s docstring has no line {marker!r}")


# ---------------------------------------------------------------------- checks shared by options
#: The largest count an option takes where no smaller bound is natural (batch sizes, worker
#: processes, shuffle windows: 2**40): far beyond any real value, and small enough that a count
#: times a world size (:data:`fastfeed.dist.MAX_WORLD_SIZE`, 2**20) fits a 64-bit integer.
MAX_COUNT = 1 << 40


def check_int(name: str, value: Any, minimum: int, *, or_auto: bool = False, most: int | None = None) -> int:
    """``value`` as an int if it is an integer >= ``minimum`` (<= ``most``; numpy's too, not a bool).

    Raises:
        ConfigError: ``seed=-1 must be an integer >= 0``.

    Example:
        >>> check_int("seed", 3, 0)
        3
        >>> check_int("batch_size", 2**63, 1, most=MAX_COUNT)
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: batch_size=9223372036854775808 must be an integer from 1 to 1099511627776
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum or \
            (most is not None and value > most):
        also = " (or 'auto')" if or_auto else ""
        above = most is not None and isinstance(value, Integral) and not isinstance(value, bool) and value > most
        rule = f"from {minimum} to {most}" if above else f">= {minimum}"
        raise ConfigError(f"{name}={value!r} must be an integer {rule}{also}")
    return int(value)


def at_least(minimum: int, *, auto: bool = False, none: bool = False, most: int | None = None) -> Check:
    """A check: an integer >= ``minimum`` (<= ``most``); ``"auto"`` and/or None kept as they are when allowed.

    Example:
        >>> at_least(1, auto=True)("auto", "num_threads"), at_least(0)(2, "seed")
        ('auto', 2)
    """
    def check(value: Any, name: str) -> Any:
        if (auto and isinstance(value, str) and value == "auto") or (none and value is None):
            return value
        return check_int(name, value, minimum, or_auto=auto, most=most)
    return check


def number(low: float, high: float = math.inf, *, none: bool = False, above: bool = False, unit: str = "") -> Check:
    """A check: a real number (numpy's too, not a bool) from ``low`` (excluded with ``above``) to ``high``, as a float.

    Example:
        >>> number(0, above=True)(2, "headroom"), number(0, 1)(0.5, "load")
        (2.0, 0.5)
        >>> number(0, above=True, unit="seconds")(float("nan"), "step_time")
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: step_time=nan must be a finite number > 0 (seconds)
        >>> number(0)(10**400, "jitter")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: jitter=1000...000 must be a finite number >= 0
    """
    def check(value: Any, name: str) -> float | None:
        if none and value is None:
            return None
        real = isinstance(value, Real) and not isinstance(value, bool)
        finite = real and _finite(value)
        if not (finite and (value > low if above else value >= low) and value <= high):
            rule = f"> {low:g}" if above else f">= {low:g}"
            rule = rule if high == math.inf else f"{rule} and <= {high:g}"
            what = "a finite number" if real and not finite else "a number"
            raise ConfigError(f"{name}={value!r} must be {what} {rule}{f' ({unit})' if unit else ''}")
        return float(value)
    return check


def _finite(value: Real) -> bool:
    """True for a finite real number; False for nan, inf and an integer too large for a float (10**400)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def text_or_none(value: Any, name: str) -> str | None:
    """A check: a non-empty string, or None.

    Example:
        >>> text_or_none("jpg", "Crop.image_field"), text_or_none(None, "Crop.image_field")
        ('jpg', None)
    """
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name}={value!r} must be a name (a non-empty string), or None")
    return value


def path_or_none(value: Any, name: str) -> Any:
    """A check: a path (a string or ``os.PathLike``), or None; kept as given.

    Example:
        >>> path_or_none("/tmp/cache", "cache_dir")
        '/tmp/cache'
    """
    if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
        raise ConfigError(f"{name}={value!r} must be a path (a string or os.PathLike), or None")
    return value


def mapping_or_none(value: Any, name: str) -> Any:
    """A check: a mapping (a dict), or None; kept as given.

    Example:
        >>> mapping_or_none({"anon": True}, "Storage.options")
        {'anon': True}
    """
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"{name}={value!r} must be a dict of options (or None)")
    return value


def as_bool(value: Any, name: str) -> bool:
    """A check: True or False (an integer's truth too: ``pad=0`` is False; numpy's bools; None is False).

    A string is refused rather than read by its truth (``shuffle="false"`` would be True).

    Example:
        >>> as_bool(0, "pad"), as_bool(True, "shuffle")
        (False, True)
        >>> as_bool("false", "shuffle")
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: shuffle='false' must be True or False
    """
    if value is None or isinstance(value, Integral) or type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise ConfigError(f"{name}={value!r} must be True or False")


def one_of(choices: Any, what: str) -> Check:
    """A check: one of ``choices`` (``what`` says which, for the message).

    Example:
        >>> one_of(("NCHW", "NHWC"), "'NCHW' or 'NHWC'")("NHWC", "Dali.layout")
        'NHWC'
    """
    def check(value: Any, name: str) -> Any:
        # only plain values are compared: `in` on an array or a set would be an error of its own
        if not (value is None or isinstance(value, (str, int, float))) or value not in choices:
            raise ConfigError(f"{name}={value!r} must be {what}")
        return value
    return check


def callable_or_none(value: Any, name: str) -> Any:
    """A check: a function, or None."""
    if value is not None and not callable(value):
        raise ConfigError(f"{name}={value!r} is not callable; pass a function or None")
    return value


def parse_int(text: str) -> int:
    """A flag's reading of a whole number.

    Example:
        >>> parse_int("42")
        42
    """
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{text!r}: write a whole number") from None


def auto_or_int(text: str) -> int | str:
    """A flag's reading of ``auto`` or a whole number.

    Example:
        >>> auto_or_int("auto"), auto_or_int("4")
        ('auto', 4)
    """
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{text!r}: write a number or auto") from None
