"""The ``fastfeed`` command: the parser of every command, and :func:`main`, which maps what a
command raises to the exit code.

Exit codes (also in ``fastfeed --help``, defined in :mod:`fastfeed.cli.command`): 0 ok; 1 the
check found problems (``verify``, ``doctor --fail-if-input-bound``); 2 a usage error (bad
arguments, or a :class:`~fastfeed.errors.FastfeedError` from the library: one line on stderr);
3 an unexpected internal error (one line, ``-v`` shows the traceback); 130 interrupted.

Example:
    >>> sorted(build_parser()._subparsers._group_actions[0].choices)
    ['balance', 'doctor', 'info', 'pack', 'shapes', 'tune', 'verify']
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from fastfeed import __version__
import fastfeed.cli.balance as balance
import fastfeed.cli.dataset as dataset
import fastfeed.cli.diagnosis as diagnosis
import fastfeed.cli.shapes as shapes
import fastfeed.cli.tuning as tuning
from fastfeed.cli.args import add_verbose
from fastfeed.cli.command import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, Command
from fastfeed.errors import FastfeedError

__all__ = ["COMMANDS", "build_parser", "main"]

#: Every command, in the order ``fastfeed --help`` shows them.
COMMANDS: tuple[Command, ...] = (dataset.PACK, dataset.INFO, dataset.VERIFY, shapes.COMMAND, tuning.COMMAND,
                                 balance.COMMAND, diagnosis.COMMAND)

_EPILOG = """exit codes:
  0    ok
  1    the check found problems: verify found damage; doctor --fail-if-input-bound found the input bound
  2    usage error: bad arguments, or an error fastfeed explains (what, where, how to fix)
  3    unexpected internal error (a bug): run again with -v for the traceback
  130  interrupted

Progress goes to stderr: a bar on a terminal, else a line every 30 s (SLURM and CI logs).
-v works before or after the command."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (used by :func:`main` and the docs).

    Example:
        >>> build_parser().parse_args(["info", "/data/ff", "-v"]).verbose
        True
    """
    parser = argparse.ArgumentParser(
        prog="fastfeed",
        description="Pack, load, tune and diagnose input pipelines for multi-GPU PyTorch training.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fastfeed {__version__}")
    add_verbose(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add(p)
        add_verbose(p, after_command=True)  # -v after the command too
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fastfeed`` command line; returns the exit code (see the module docstring).

    Args:
        argv: the arguments after ``fastfeed`` (default: ``sys.argv[1:]``).

    Example:
        >>> main(["--version"])  # doctest: +SKIP
        fastfeed 0.1.0
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2, message already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="fastfeed: %(message)s",
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args))
    except FastfeedError as e:
        print(f"fastfeed {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a bug: one line (exit 3), the traceback with -v
        if args.verbose:
            import traceback

            traceback.print_exc()
        hint = "the traceback is above" if args.verbose else "run again with -v for the traceback"
        print(f"fastfeed {args.command}: internal error: {type(e).__name__}: {e} ({hint}; please report it)",
              file=sys.stderr)
        return EXIT_INTERNAL
