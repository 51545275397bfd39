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

__all__ = ["Spec", "doc_lines", "fill_doc", "group", "is_group", "option", "specs"]

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
            (default: the field's own name).
        extra: anything a backend needs to know about the option (read by name).
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
        out.append(textwrap.fill(line, width=100, initial_indent=" " * indent,
                                 subsequent_indent=" " * (indent + 4)))
    return "\n".join(out)


def group(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen keyword-only dataclass whose values are checked when built.

    Every field's ``check`` runs in field order; then ``cls._check_together(self)`` if the
    class defines it (for rules between fields), which returns a dict of normalised values
    or None. The class docstring gains an ``Attributes:`` section written from the fields'
    doc lines, and ``repr`` shows only the values that differ from the defaults.
    """
    own_post = getattr(cls, "__post_init__", None)

    def __post_init__(self: Any) -> None:
        for f, spec in specs(type(self)):
            if spec.check is not None:
                object.__setattr__(self, f.name, spec.check(getattr(self, f.name), f"{type(self).__name__}.{f.name}"))
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
