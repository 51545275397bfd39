"""The arguments several commands share, and their conversion into library arguments.

- :func:`add_verbose`, :func:`add_json`: ``-v`` (before or after the command) and ``--json``;
- :func:`add_sizes` / :func:`resolve_sizes`: ``--batch-size`` / ``--image-size`` with the
  defaults ``tune`` and ``doctor`` share (:mod:`fastfeed.tuning.defaults`);
- :func:`add_demand`: ``--target-rate`` / ``--step-time``, what training consumes;
- :func:`add_loader_flags` / :func:`loader_args`: the loader options as flags (``--decode``,
  ``--num-workers``, ``--prefetch-factor``, ``--cache-dir``) and back into ``loader()``
  keywords. Both read the options' one definition (:mod:`fastfeed.loading.options`, the
  ``flag=`` of each option): no flag is written here;
- :func:`auto_int`: ``auto`` or a whole number.

Example:
    >>> import argparse
    >>> p = argparse.ArgumentParser(prog="x")
    >>> add_loader_flags(p, ("decode", "num_workers"))
    >>> loader_args(p.parse_args(["--decode", "none", "--num-workers", "4"]), ("decode", "num_workers"))
    {'decode': None, 'num_workers': 4}
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from fastfeed.errors import ConfigError, FastfeedError

__all__ = ["add_demand", "add_json", "add_loader_flags", "add_sizes", "add_verbose", "auto_int", "loader_args",
           "resolve_sizes"]

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
    (:mod:`fastfeed.loading.options`): a new option with a ``flag=`` is a new flag of every
    command that lists it.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_loader_flags(p, ("prefetch_factor",))
        >>> p.parse_args([]).prefetch_factor
        'auto'
    """
    for name in names:
        _, f, spec = _flag_of(name)
        default = None if f.default is None else str(f.default)
        parser.add_argument(spec.flag, dest=name, default=default, metavar=spec.metavar,
                            choices=None if spec.choices is None else list(spec.choices),
                            help=f"{spec.doc} (default {'none' if default is None else default})")


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
        text = getattr(args, name)
        try:
            value = text if text is None or spec.parse is None else spec.parse(text)
        except ConfigError as e:
            raise ConfigError(f"{spec.flag} {e}") from None
        if key is None:
            out[name] = value
        else:
            out.setdefault(key, {})[f.name] = value
    return out
