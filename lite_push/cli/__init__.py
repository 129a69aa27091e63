"""The ``lite-push`` command.

``lite-push demo``       the embedded broker, a producer and a consumer, with
                         live stats and a Prometheus endpoint
``lite-push consume``    run a listener (``module:function``) as a service
                         (``--processes N``: on N cores)
``lite-push topic create | list | describe``
                         make a topic of N queues; list the topics with
                         their queue counts and stored messages; one
                         topic's queues with their first and end offsets
``lite-push produce``    send each line of standard input to a topic
                         (``KEY SEP BODY`` with ``--key-separator``)
``lite-push dlq list``   show a group's dead letters
``lite-push dlq resend`` send dead letters back to their topics
``lite-push group describe``       a group's committed offset, end, lag, owner
                                   and in-flight count per queue; its members
``lite-push group reset-offsets``  move a group's committed offsets (first,
                                   last, a time); a dry run without ``--execute``

Modules of the topic commands: ``topic`` (``topic create | list |
describe``, over ``queues``: a topic's queues and their stored offsets; a
topic the source does not have exits 1, as for ``consume``) and ``produce``
(standard input in batches, a key's messages in input order; a signal stops
it between two batches, saying how many messages were sent).

Bad arguments and bad settings print one line, ``lite-push: error: ...``, on
stderr and exit with status 2; a source that fails at run time exits 1.  A
command whose output's reader goes away (``lite-push dlq list | head -1``)
stops there without a word and exits 141, as Unix tools do (:mod:`pipes`).
Settings of ``consume`` and ``dlq`` come from flags, ``LITE_PUSH_*``
environment variables and a TOML file, in that order of precedence
(:mod:`lite_push.cli.settings`).

Modules: ``parser`` (the commands and their options), ``settings`` (flags,
environment, file), ``sources`` (the ``--source`` URL), ``plan`` (what
``consume`` builds, from its settings), ``consume``, ``consume_processes``
(``consume --processes N``: N member processes under one supervisor),
``dlq``, ``errors`` (the one-line error), ``pipes`` (a closed output pipe).  The benchmarks are run from the source
checkout (``python benchmarks/bench.py``), not through this command.

The group commands: ``group`` (``group describe`` and ``group
reset-offsets``, over the source's
:class:`~lite_push.sources.group_admin.GroupAdmin`: they join no group and
commit as no member), ``reset_plan`` (their ``--to`` and ``--queue``, and
the new offsets), ``from_notice`` (``consume --from`` on a group that has
committed offsets logs one WARNING that it does not apply there).  Their
``--source``, ``--group`` and ``--topic`` come from flags, the environment
and the ``--config`` file as ``dlq``'s do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .._errors import ConfigError
from .errors import PROG, CliError, exit_code, one_line
from .parser import build_parser
from .pipes import closed_pipe_exit
from .plan import load_listener
from .sources import open_source

__all__ = ["PROG", "CliError", "build_parser", "load_listener", "main", "open_source"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lite-push`` with ``argv`` (default ``sys.argv[1:]``); return
    the exit status."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError as e:  # the reader of our output went away (| head)
        return closed_pipe_exit(e)


def _run(args_list: list[str]) -> int:
    try:
        args = build_parser().parse_args(args_list)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except CliError as e:
        print(f"{PROG}: error: {one_line(str(e))}", file=sys.stderr)
        return e.code
    except ConfigError as e:
        print(f"{PROG}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help, --version
        return exit_code(e)
    except KeyboardInterrupt:
        return 130
