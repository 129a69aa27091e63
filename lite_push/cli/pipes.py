"""What a ``lite-push`` command does when the reader of its output goes
away (``lite-push dlq list ... | head -1``): it stops there, quietly, as Unix
tools do.

Python ignores SIGPIPE, so a write to a pipe whose reader has closed raises
``BrokenPipeError`` instead of ending the process.  The command's ``main``
catches it and calls :func:`closed_pipe_exit`, which does what the Python
documentation advises (the note on SIGPIPE in the ``signal`` module): point
the closed stream at ``/dev/null``, so that the interpreter's flush at exit
raises nothing more, and exit.  The exit status is 141, ``128 + SIGPIPE``:
what a shell reports for a Unix tool that SIGPIPE ended (``yes | head -1``),
as ``lite-push`` reports 130 for Ctrl-C.

Only a closed standard output or standard error is taken as the reader
going away; a ``BrokenPipeError`` from anything else (a socket, a child
process's pipe) is a failure, and raised again.
"""

from __future__ import annotations

import os
import select
import sys
from typing import IO

__all__ = ["SIGPIPE_EXIT", "closed_pipe_exit", "closed_std_streams"]

#: The exit status after the reader went away: 128 + SIGPIPE (13).
SIGPIPE_EXIT = 128 + 13


def _fd(stream: IO[str] | None) -> int | None:
    """The file descriptor of ``stream``, if it has one."""
    try:
        return None if stream is None else stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both; a closed stream, ValueError
        return None


def _reader_gone(fd: int) -> bool:
    """Whether ``fd`` is the write end of a pipe (or socket) whose reader
    has closed it: poll reports an error (or a hang-up) on it."""
    if not hasattr(select, "poll"):  # no poll(): take the error at its word
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def closed_std_streams() -> list[int]:
    """The file descriptors of standard output and standard error whose
    reader went away."""
    fds = {fd for fd in (_fd(sys.stdout), _fd(sys.stderr)) if fd is not None}
    return sorted(fd for fd in fds if _reader_gone(fd))


def closed_pipe_exit(error: BrokenPipeError) -> int:
    """The exit status of a command whose output's reader went away
    (:data:`SIGPIPE_EXIT`), after pointing the closed standard streams at
    ``/dev/null``; ``error`` is raised again when it came from neither."""
    closed = closed_std_streams()
    if not closed:
        raise error
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in closed:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return SIGPIPE_EXIT
