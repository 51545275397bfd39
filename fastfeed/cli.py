"""The ``fastfeed`` command: a thin argparse layer over the public functions.

Each subcommand has an ``_add_<command>(sub)`` that declares its arguments and a
``_run_<command>(args) -> int`` that calls the library and prints. Errors from the
library (:class:`~fastfeed.errors.FastfeedError`) become one line on stderr and exit 2.

Example:
    >>> from fastfeed.cli import main
    >>> main(["--version"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

from fastfeed import __version__
from fastfeed.errors import FastfeedError

__all__ = ["build_parser", "main"]

Runner = Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------- pack / info / verify
# (section owned by the pack issue)


# ---------------------------------------------------------------- balance
# (section owned by the samplers issue)


# ---------------------------------------------------------------- tune
# (section owned by the tune issue)


# ---------------------------------------------------------------- doctor
# (section owned by the doctor issue)


# ---------------------------------------------------------------- wiring
#: (name, help, add-arguments function, runner), in the order shown by --help.
COMMANDS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], Runner]] = []


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (used by :func:`main` and the docs)."""
    parser = argparse.ArgumentParser(
        prog="fastfeed",
        description="Pack, load, tune and diagnose input pipelines for multi-GPU PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"fastfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_, add, run in COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        add(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="fastfeed: %(message)s",
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except FastfeedError as e:
        print(f"fastfeed {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
