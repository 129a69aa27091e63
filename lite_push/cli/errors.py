"""What every ``lite-push`` command shares: the program name and the
one-line error the user sees."""

from __future__ import annotations

import sys

__all__ = ["PROG", "CliError", "exit_code", "one_line"]

PROG = "lite-push"


class CliError(Exception):
    """A one-line error for the user; ``code`` is the exit status (2: bad
    arguments or settings, 1: a failure while running)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """``text`` with its whitespace (newlines included) folded to single spaces."""
    return " ".join(text.split())


def exit_code(e: SystemExit) -> int:
    """The exit status a ``SystemExit`` (argparse's ``--help``, ``--version``) stands for."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1
