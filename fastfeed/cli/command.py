"""What a command is, and what its runner returns: :class:`Command` and the exit codes.

A command module declares one :class:`Command` per command it holds (its name, its one-line
help, the function that adds its arguments and the runner); :mod:`fastfeed.cli.app` lists them
in the order ``fastfeed --help`` shows.

Example:
    >>> import argparse
    >>> hello = Command("hello", "say hello", lambda p: None, lambda args: EXIT_OK)
    >>> hello.run(argparse.Namespace())
    0
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

__all__ = ["EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "Command"]

#: ok
EXIT_OK = 0
#: the check found problems (``verify`` found damage; ``doctor --fail-if-input-bound`` found the input bound)
EXIT_PROBLEMS = 1
#: a usage error: bad arguments, or a :class:`~fastfeed.errors.FastfeedError` (one line on stderr)
EXIT_USAGE = 2
#: an unexpected internal error (a bug): one line on stderr, the traceback with ``-v``
EXIT_INTERNAL = 3
#: interrupted (Ctrl-C)
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Command:
    """One ``fastfeed`` subcommand.

    Attributes:
        name: the word on the command line (``pack``).
        help: one line, for ``fastfeed --help`` and the top of ``fastfeed NAME --help``.
        add: adds the command's arguments to its parser.
        run: calls the library, prints the result's ``text()`` (or ``to_json()`` with
            ``--json``) and returns the exit code.
    """

    name: str
    help: str
    add: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
