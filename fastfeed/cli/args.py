"""The arguments several commands share, and their conversion into library arguments.

- :func:`add_verbose`, :func:`add_json`: ``-v`` (before or after the command) and ``--json``;
- :func:`add_sizes` / :func:`resolve_sizes`: ``--batch-size`` / ``--image-size`` with the
  defaults ``tune`` and ``doctor`` share (:mod:`fastfeed.tuning.defaults`);
- :func:`add_demand`: ``--target-rate`` / ``--step-time``, what training consumes;
- :func:`add_loader_flags` / :func:`loader_args`: the loader settings as flags (``--decode``,
  ``--num-workers``, ``--prefetch-factor``, ``--cache-dir``) and back into ``loader()``
  keywords. They read one table, :data:`LOADER_FLAGS`: the only place a loader flag is defined;
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
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

from fastfeed.errors import ConfigError, FastfeedError

__all__ = ["LOADER_FLAGS", "LoaderFlag", "add_demand", "add_json", "add_loader_flags", "add_sizes",
           "add_verbose", "auto_int", "loader_args", "resolve_sizes"]

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
@dataclass(frozen=True)
class LoaderFlag:
    """One ``loader()`` setting as a flag (the fields of ``fastfeed._options.Spec`` that a flag needs).

    Attributes:
        flag: the flag (``--num-workers``).
        default: its text when absent (parsed like a given one).
        doc: its ``--help`` line.
        parse: the flag's text -> the ``loader()`` value.
        metavar: the placeholder in ``--help``.
        choices: the allowed texts.
    """

    flag: str
    default: str | None
    doc: str
    parse: Callable[[Any], Any]
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


def _decode(text: str) -> str | None:
    return None if text == "none" else text


def _as_given(value: Any) -> Any:
    return value


#: loader() keyword -> its flag: the one definition of the loader flags of tune and doctor.
LOADER_FLAGS: dict[str, LoaderFlag] = {
    "decode": LoaderFlag("--decode", "cpu", "decode mode: cpu, dali or none (raw bytes; default cpu)", _decode,
                         choices=("cpu", "dali", "none")),
    "num_workers": LoaderFlag("--num-workers", "auto", "loader workers (default auto: the tuned setting, else "
                              "loader()'s heuristic)", partial(auto_int, flag="--num-workers"), metavar="N"),
    "prefetch_factor": LoaderFlag("--prefetch-factor", "auto", "batches in flight per worker",
                                  partial(auto_int, flag="--prefetch-factor"), metavar="N"),
    "cache_dir": LoaderFlag("--cache-dir", None, "local shard cache for remote data, as in loader()", _as_given),
}


def add_loader_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """Add the flags of the ``loader()`` settings ``names`` (keys of :data:`LOADER_FLAGS`), in that order.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_loader_flags(p, ("prefetch_factor",))
        >>> p.parse_args([]).prefetch_factor
        'auto'
    """
    for name in names:
        f = LOADER_FLAGS[name]
        parser.add_argument(f.flag, dest=name, default=f.default, metavar=f.metavar,
                            choices=None if f.choices is None else list(f.choices), help=f.doc)


def loader_args(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The ``loader()`` keywords of the settings ``names``, from the parsed flags.

    Raises:
        ConfigError: a value its flag does not accept (``--num-workers 'x': write a number or auto``).

    Example:
        >>> loader_args(argparse.Namespace(num_workers="auto", cache_dir=None), ("num_workers", "cache_dir"))
        {'num_workers': 'auto', 'cache_dir': None}
    """
    return {name: LOADER_FLAGS[name].parse(getattr(args, name)) for name in names}
