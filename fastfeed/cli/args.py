"""The arguments several commands share, and their conversion into library arguments.

- :func:`add_verbose`, :func:`add_json`: ``-v`` (before or after the command) and ``--json``;
- :func:`add_sizes` / :func:`resolve_sizes`: ``--batch-size`` / ``--image-size`` with the
  defaults ``tune`` and ``doctor`` share (:mod:`fastfeed.tuning.defaults`);
- :func:`add_demand`: ``--target-rate`` / ``--step-time``, what training consumes;
- :func:`add_option_flags` / :func:`option_args`: the options of a class of option fields
  (``pack``'s :class:`~fastfeed.packing.options.PackOptions`) as flags, and back into keywords;
- :func:`add_loader_flags` / :func:`loader_args`: the loader options as flags (``--decode``,
  ``--num-workers``, ``--prefetch-factor``, ``--cache-dir``) and back into ``loader()``
  keywords, grouped options in their group;
- :func:`auto_int`: ``auto`` or a whole number.

The option flags read the options' one definition (:mod:`fastfeed._options`: the ``flag=`` of
each option) through one flag builder: no option's flag is written here.

Example:
    >>> import argparse
    >>> p = argparse.ArgumentParser(prog="x")
    >>> add_loader_flags(p, ("decode", "num_workers"))
    >>> loader_args(p.parse_args(["--decode", "none", "--num-workers", "4"]), ("decode", "num_workers"))
    {'decode': None, 'num_workers': 4}
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Sequence

from fastfeed._options import Spec, specs
from fastfeed.errors import ConfigError, FastfeedError

__all__ = ["add_demand", "add_json", "add_loader_flags", "add_option_flags", "add_sizes", "add_verbose", "auto_int",
           "loader_args", "option_args", "resolve_sizes"]

_VERBOSE_HELP = "log progress details and show tracebacks"


def add_verbose(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """``-v`` / ``--verbose``; ``after_command``: on a subcommand's parser, where its absence
    keeps the value given before the command (``argparse.SUPPRESS``).

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_verbose(p)
        >>> p.parse_args(["-v"]).verbose
        True
    """
    default: Any = argparse.SUPPRESS if after_command else False
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=_VERBOSE_HELP)


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json``: print WHAT (``summary``, ``report``, ``result``) as JSON on stdout.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_json(p, "report")
        >>> p.parse_args([]).json
        False
    """
    parser.add_argument("--json", action="store_true", help=f"print the {what} as JSON")


def auto_int(value: str, flag: str) -> int | str:
    """``"auto"``, or ``value`` as an int.

    Raises:
        ConfigError: neither (``--workers 'x': write a number or auto``).

    Example:
        >>> auto_int("auto", "--workers"), auto_int("4", "--workers")
        ('auto', 4)
    """
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r}: write a number or auto") from None


# ---------------------------------------------------------------- sizes and demand (tune, doctor)
def add_sizes(parser: argparse.ArgumentParser) -> None:
    """``--batch-size`` / ``--image-size`` with the defaults tune and doctor share
    (:mod:`fastfeed.tuning.defaults`); :func:`resolve_sizes` reads them.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_sizes(p)
        >>> p.parse_args(["--image-size", "none"]).image_size
        'none'
    """
    from fastfeed.tuning.defaults import DEFAULT_BATCH_SIZE, DEFAULT_IMAGE_SIZE

    parser.add_argument("--batch-size", type=int, default=None, metavar="B",
                        help=f"per-rank batch size training uses (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--image-size", default=None, metavar="PX",
                        help=f"output image size training uses, or none for no resizing (default "
                             f"{DEFAULT_IMAGE_SIZE} when the data has images)")


def resolve_sizes(args: argparse.Namespace, decode: str | None, cache_dir: Any = None) -> tuple[int | None, Any]:
    """(batch size, image size) to pass on for ``args.dst``; prints one line on stderr saying what
    was assumed (``assumed --image-size 224 --batch-size 64 (the data has images); ...``).

    Raises:
        ConfigError: an ``--image-size`` that is neither a number nor ``none``.

    Example:
        >>> resolve_sizes(argparse.Namespace(dst="/data/ff", batch_size=None, image_size=None), "cpu")  # doctest: +SKIP
        (64, 224)
    """
    from fastfeed.formats.naming import holds_pixels
    from fastfeed.packed.reader import resolve_index
    from fastfeed.tuning.defaults import resolve_defaults

    size: Any = "auto"
    if args.image_size is not None:
        if args.image_size.lower() == "none":
            size = None
        else:
            try:
                size = int(args.image_size)
            except ValueError:
                raise ConfigError(f"--image-size {args.image_size!r}: write a number of pixels or none") from None
    try:
        index = resolve_index(args.dst, cache_dir=cache_dir)
    except FastfeedError:  # the command itself reports it, with its own advice
        return args.batch_size, size
    chosen = resolve_defaults(has_images=any(holds_pixels(f) for f in index.fields), batch_size=args.batch_size,
                              image_size=size, decode=decode)
    if chosen.line():
        print(chosen.line(), file=sys.stderr, flush=True)
    return chosen.batch_size, chosen.image_size


def add_demand(parser: argparse.ArgumentParser, rate_help: str) -> None:
    """``--target-rate`` / ``--step-time`` (one or neither): what the training consumes.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_demand(p, "samples/s one rank consumes")
        >>> p.parse_args(["--step-time", "0.25"]).step_time
        0.25
    """
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--target-rate", type=float, default=None, metavar="SAMPLES_PER_S", help=rate_help)
    goal.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                      help="one rank's training step time per batch (demand = batch size / step time)")


# ---------------------------------------------------------------- flags from the options' definitions
def add_option_flags(parser: argparse.ArgumentParser, cls: Any, names: Sequence[str]) -> None:
    """Add the flags of the options ``names`` of ``cls`` (a class of :func:`fastfeed._options.option`
    fields, such as :class:`fastfeed.packing.options.PackOptions`), in that order.

    Each flag, its help line (the doc line and the default), placeholder and choices come from
    the option's one definition (``flag=``, ``metavar=``, ``choices=``, and the extras
    ``switch``, ``exclusive``, ``flag_default`` of :class:`fastfeed._options.Spec`). A switch
    whose default is None says nothing of its default: its doc line says what None means.
    :func:`option_args` reads the values back.

    Example:
        >>> from fastfeed.packing.options import PackOptions
        >>> p = argparse.ArgumentParser(prog="x")
        >>> add_option_flags(p, PackOptions, ("shard_size", "samples_per_shard"))
        >>> print(p.format_usage().strip())
        usage: x [-h] [--shard-size SIZE | --samples-per-shard N]
    """
    _add_flags(parser, [(name, *_option_of(cls, name)) for name in names])


def option_args(args: argparse.Namespace, cls: Any, names: Sequence[str]) -> dict[str, Any]:
    """The keywords of the options ``names`` of ``cls`` from the flags :func:`add_option_flags` added.

    Raises:
        ConfigError: a value its flag does not accept (``--seed 'x': write a whole number``).

    Example:
        >>> from fastfeed.packing.options import PackOptions
        >>> p = argparse.ArgumentParser()
        >>> add_option_flags(p, PackOptions, ("workers", "seed", "shuffle"))
        >>> option_args(p.parse_args(["--seed", "3", "--no-shuffle"]), PackOptions, ("workers", "seed", "shuffle"))
        {'workers': 'auto', 'seed': 3, 'shuffle': False}
    """
    return {name: _flag_value(args, name, _option_of(cls, name)[1]) for name in names}


def _option_of(cls: Any, name: str) -> tuple[dataclasses.Field[Any], Spec]:
    """The field and spec of the option ``name`` of ``cls``."""
    for f, spec in specs(cls):
        if f.name == name:
            return f, spec
    raise KeyError(f"{cls.__name__} has no option {name!r}")


def _add_flags(parser: argparse.ArgumentParser, options: Sequence[tuple[str, dataclasses.Field[Any], Spec]]) -> None:
    """The one flag builder: a flag per ``(dest, field, spec)``; flags of one ``exclusive`` name in
    one mutually exclusive group."""
    exclusive: dict[str, Any] = {}
    for name, f, spec in options:
        if spec.flag is None:
            raise ValueError(f"option {name!r} has no command-line flag (no flag= in its definition)")
        key = spec.get("exclusive")
        if key is not None and key not in exclusive:
            exclusive[key] = parser.add_mutually_exclusive_group()
        target = parser if key is None else exclusive[key]
        target.add_argument(spec.flag, dest=name, **_flag_kwargs(f, spec))


def _flag_kwargs(f: dataclasses.Field[Any], spec: Spec) -> dict[str, Any]:
    """``add_argument``'s keywords for one option: a switch, or a text its ``parse`` reads."""
    default = spec.get("flag_default", f.default)
    switch = spec.get("switch")
    if switch == "on":
        if default is not False:
            raise ValueError(f"option {f.name!r}: switch='on' needs the default False, not {default!r}")
        return {"action": "store_true", "help": spec.doc}
    if switch == "negatable":
        shown = "" if default is None else f" (default {'on' if default else 'off'})"
        return {"action": argparse.BooleanOptionalAction, "default": default, "help": spec.doc + shown}
    if switch is not None:
        raise ValueError(f"option {f.name!r}: switch={switch!r}; use 'negatable' or 'on'")
    text = None if default is None else str(default)
    return {"default": text, "metavar": spec.metavar, "choices": None if spec.choices is None else list(spec.choices),
            "help": f"{spec.doc} (default {'none' if text is None else text})"}


def _flag_value(args: argparse.Namespace, name: str, spec: Spec) -> Any:
    """The value of one option's flag, read by its ``parse`` (a switch's as it is)."""
    value = getattr(args, name)
    try:
        return value if value is None or spec.parse is None else spec.parse(value)
    except ConfigError as e:
        raise ConfigError(f"{spec.flag} {e}") from None


# ---------------------------------------------------------------- loader settings (tune, doctor)
def _flag_of(name: str) -> tuple[str | None, Any, Any]:
    """The loader option ``name`` (flat or former spelling): (its group keyword or None, its field, its spec)."""
    from fastfeed.loading.options import find_option

    key, f, spec = find_option(name)
    if spec.flag is None:
        raise ValueError(f"loader option {name!r} has no command-line flag (fastfeed.loading.options)")
    return key, f, spec


def add_loader_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """Add the flags of the ``loader()`` options ``names``, in that order.

    Each flag, its help line, placeholder and choices come from the option's one definition
    (:mod:`fastfeed.loading.options`), through the one flag builder :func:`add_option_flags`
    uses: a new option with a ``flag=`` is a new flag of every command that lists it.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_loader_flags(p, ("prefetch_factor",))
        >>> p.parse_args([]).prefetch_factor
        'auto'
    """
    _add_flags(parser, [(name, *_flag_of(name)[1:]) for name in names])


def loader_args(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The ``loader()`` keywords of the options ``names`` from the parsed flags; grouped options as
    a dict of their group (``{"workers": {"prefetch_factor": 4}}``).

    Raises:
        ConfigError: a value its flag does not accept (``--num-workers 'x': write a number or auto``).

    Example:
        >>> loader_args(argparse.Namespace(num_workers="auto", prefetch_factor="4", decode="none"),
        ...             ("decode", "num_workers", "prefetch_factor"))
        {'decode': None, 'num_workers': 'auto', 'workers': {'prefetch_factor': 4}}
    """
    out: dict[str, Any] = {}
    for name in names:
        key, f, spec = _flag_of(name)
        value = _flag_value(args, name, spec)
        if key is None:
            out[name] = value
        else:
            out.setdefault(key, {})[f.name] = value
    return out
