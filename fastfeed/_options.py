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
import textwrap
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Iterator, TypeVar

from fastfeed.errors import ConfigError

__all__ = ["Spec", "as_bool", "at_least", "auto_or_int", "callable_or_none", "check_int", "doc_lines", "fill_doc",
           "group", "is_group", "one_of", "option", "parse_int", "specs"]

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
    default (a function's signature shows its own).
    """
    chosen = dict((f.name, (f, s)) for f, s in specs(cls))
    order = list(names) if names is not None else list(chosen)
    out = []
    for name in order:
        f, s = chosen[name]
        text = s.doc.rstrip(".") + (f" (default {_default_text(f)})." if defaults else ".")
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
def check_int(name: str, value: Any, minimum: int, *, or_auto: bool = False) -> int:
    """``value`` if it is an integer >= ``minimum`` (not a bool).

    Raises:
        ConfigError: ``seed=-1 must be an integer >= 0``.

    Example:
        >>> check_int("seed", 3, 0)
        3
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        also = " (or 'auto')" if or_auto else ""
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}{also}")
    return value


def at_least(minimum: int, *, auto: bool = False, none: bool = False) -> Check:
    """A check: an integer >= ``minimum``; ``"auto"`` and/or None kept as they are when allowed.

    Example:
        >>> at_least(1, auto=True)("auto", "num_threads"), at_least(0)(2, "seed")
        ('auto', 2)
    """
    def check(value: Any, name: str) -> Any:
        if (auto and value == "auto") or (none and value is None):
            return value
        return check_int(name, value, minimum, or_auto=auto)
    return check


def as_bool(value: Any, name: str) -> bool:
    """A check: the value's truth (``pad=0`` is False)."""
    return bool(value)


def one_of(choices: Any, what: str) -> Check:
    """A check: one of ``choices`` (``what`` says which, for the message).

    Example:
        >>> one_of(("NCHW", "NHWC"), "'NCHW' or 'NHWC'")("NHWC", "Dali.layout")
        'NHWC'
    """
    def check(value: Any, name: str) -> Any:
        if value not in choices:
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
