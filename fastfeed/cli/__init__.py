"""The ``fastfeed`` command: a thin argparse layer over the public functions.

- :mod:`~fastfeed.cli.app`: the parser, the list of commands, and :func:`main` (the exit codes);
- :mod:`~fastfeed.cli.command`: what a command is (:class:`~fastfeed.cli.command.Command`) and
  the exit codes it returns;
- :mod:`~fastfeed.cli.args`: the arguments several commands share (sizes, demand, the loader
  settings, ``--json``, ``-v``);
- one module per command group, each declaring its commands' arguments and runners:
  :mod:`~fastfeed.cli.dataset` (``pack``, ``info``, ``verify``), :mod:`~fastfeed.cli.tuning`
  (``tune``), :mod:`~fastfeed.cli.balance` (``balance``), :mod:`~fastfeed.cli.diagnosis` (``doctor``).

Every command prints its result's ``text()``, or ``to_json()`` with ``--json``, on stdout;
progress goes to stderr: a bar on a terminal, else a line every
:data:`fastfeed._progress.PROGRESS_EVERY` seconds (batch jobs have no terminal). Exit codes
(also in ``fastfeed --help``): 0 ok; 1 the check found problems (``verify``, ``doctor
--fail-if-input-bound``); 2 a usage error (bad arguments, or a
:class:`~fastfeed.errors.FastfeedError` from the library: one line on stderr); 3 an
unexpected internal error (one line, ``-v`` shows the traceback); 130 interrupted.

Example:
    >>> from fastfeed.cli import EXIT_OK, main
    >>> main(["--version"]) == EXIT_OK  # doctest: +SKIP
    fastfeed 0.1.0
    True
"""

from __future__ import annotations

from fastfeed.cli.app import build_parser, main
from fastfeed.cli.command import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE

__all__ = ["EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "build_parser", "main"]
