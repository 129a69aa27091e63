"""The ``lite-push`` argument parser: every command, its options and help.

Argument errors are one line (:class:`~lite_push.cli.errors.CliError`, exit
status 2), never argparse's usage dump.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any, NoReturn

from .._version import __version__
from ..demo import add_arguments, count_arg, non_negative_number, run_args
from . import produce, topic
from .consume import FROM, cmd_consume
from .dlq import cmd_dlq_list, cmd_dlq_resend
from .errors import PROG, CliError
from .group import cmd_group_describe, cmd_group_reset

__all__ = ["DEMO_METRICS_PORT", "build_parser"]

#: The default port of ``lite-push demo``'s metrics endpoint.
DEMO_METRICS_PORT = 9464


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump): they
    raise :class:`CliError`, which ``main`` prints and turns into 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog[len(PROG) :].strip()
        raise CliError(f"{command}: {message}" if command else message)


def _cmd_demo(args: argparse.Namespace) -> int:
    return run_args(args)


_SETTINGS_EPILOG = """\
settings: a flag wins over its environment variable, which wins over the
--config file, which wins over the default.  Environment: LITE_PUSH_<FIELD>
for every ConsumerConfig field (LITE_PUSH_LANES=64, LITE_PUSH_MODE=CONCURRENTLY,
LITE_PUSH_METRICS_PORT=9464, LITE_PUSH_MAX_RECONSUME_TIMES=3, ...) and
LITE_PUSH_SOURCE, LITE_PUSH_GROUP, LITE_PUSH_TOPIC, LITE_PUSH_TAGS,
LITE_PUSH_LISTENER, LITE_PUSH_FROM, LITE_PUSH_PROCESSES, LITE_PUSH_BALANCE.
TOML file:
  [consumer]      ConsumerConfig fields: group, mode, lanes, batch_size, ...
  [source]        url; balance = "queue" or "message" (consume)
  [source.kafka]  librdkafka properties of a kafka:// url (its query wins)
  [listener]      path = "module:function"
  [subscription]  topic, tags, from
  [service]       processes = N (consume's member processes, default 1)
An unknown key, table or LITE_PUSH_* variable is an error.
"""


#: argparse types shared with the demo's options
_nonneg = count_arg(0)
_seconds = non_negative_number


def _add_source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        metavar="URL",
        help="redis://host:port[/db][?namespace=NS] (rediss://...?ssl_ca_certs=CA.pem: TLS), "
        "kafka://host:port[,host:port...][?property=value&...] or embedded:/path/to/dir",
    )
    p.add_argument("--group", metavar="G", help="consumer group")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML settings file ([consumer], [source], ...)",
    )


# -- topic create | list | describe, produce ------------------------------------

_TOPIC_EPILOG = """\
settings: --source may come from LITE_PUSH_SOURCE or the --config file's
[source] url (and its [source.kafka] table), --topic from LITE_PUSH_TOPIC or
the file's [subscription] topic: a flag wins over its environment variable,
which wins over the file.
"""


def _add_topic_source_options(p: argparse.ArgumentParser, *, topic: bool = True) -> None:
    """``--source`` and ``--config`` (no ``--group``), and ``--topic``."""
    p.add_argument(
        "--source",
        metavar="URL",
        help="redis://host:port[/db][?namespace=NS], "
        "kafka://host:port[,host:port...][?property=value&...] or embedded:/path/to/dir",
    )
    p.add_argument("--config", metavar="FILE", help="TOML settings file ([source], [subscription])")
    if topic:
        p.add_argument("--topic", metavar="T", help="the topic")


def _add_topic_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``lite-push topic create | list | describe`` and ``lite-push produce``."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "topic",
        help="create, list and describe topics",
        description="A source's topics: create one, list them, describe one's queues.",
    )
    actions = p.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    p = actions.add_parser(
        "create",
        help="create a topic of N queues",
        description=_para(
            "Create topic T with N queues.  A topic that exists with N queues is left as it is (the "
            "command says so); one with another count is an error naming queues.  On Kafka it uses the "
            "admin API (CreateTopics); a cluster without it is told to use kafka-topics.sh --create."
        ),
        epilog=_TOPIC_EPILOG,
        formatter_class=fmt,
    )
    _add_topic_source_options(p)
    p.add_argument("--queues", type=count_arg(1), required=True, metavar="N", help="how many queues")
    p.set_defaults(handler=topic.cmd_topic_create)
    p = actions.add_parser(
        "list",
        help="print the topics, their queue counts and stored messages",
        description=_para(
            "Print one line per topic: its name, queue count and how many messages it stores; the groups' "
            "retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>) come after the others, marked "
            "kind=retry or kind=dlq with their group.  Reads only."
        ),
        epilog=_TOPIC_EPILOG,
        formatter_class=fmt,
    )
    _add_topic_source_options(p, topic=False)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=topic.cmd_topic_list)
    p = actions.add_parser(
        "describe",
        help="print a topic's queues with their offsets",
        description=_para(
            "Print one line per queue of topic T: its first stored offset, its end offset (the one its "
            "next message gets) and the messages between them; then the topic's totals.  Reads only."
        ),
        epilog=_TOPIC_EPILOG,
        formatter_class=fmt,
    )
    _add_topic_source_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object: the queues and the total")
    p.set_defaults(handler=topic.cmd_topic_describe)

    p = sub.add_parser(
        "produce",
        help="send each line of standard input to a topic",
        description=_para(
            "Send each line of standard input as one message to topic T, which must exist (lite-push topic "
            "create).  A line is the body (its \\n or \\r\\n removed; an empty line is an empty body), "
            "or KEY SEP BODY with --key-separator SEP, split at the first SEP (a line without it is an "
            "error naming the line).  Lines go out in batches, each key's messages in input order; prints "
            "'sent N messages to T'.  Ctrl-C stops it between batches, saying how many were sent."
        ),
        epilog=_TOPIC_EPILOG,
        formatter_class=fmt,
    )
    _add_topic_source_options(p)
    p.add_argument(
        "--key-separator",
        metavar="SEP",
        help="each line is KEY SEP BODY (the key orders; an empty key sends a keyless message)",
    )
    p.add_argument("--tags", metavar="TAG", help="the tag of every message (a consumer's --tags selects it)")
    p.add_argument(
        "--progress",
        default="auto",
        choices=["auto", "on", "off"],
        help="a progress bar on stderr (auto: on a terminal, for an input that takes more than a second)",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="a PRODUCER span 'send T' per batch, its context in each message, on the global tracer provider "
        "(needs lite-push[tracing] and a provider, e.g. opentelemetry-instrument)",
    )
    p.set_defaults(handler=produce.cmd_produce)


def _para(text: str) -> str:
    """``text`` wrapped for a help screen whose epilog is preformatted."""
    return textwrap.fill(text, 79)


def build_parser() -> argparse.ArgumentParser:
    """The ``lite-push`` argument parser; each command's ``handler`` is set
    as its default."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        description="lite_push: key-ordered parallel consumption of partitioned logs.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "demo",
        help="produce to the embedded broker and consume it with live stats and metrics",
        description=_para(
            "Produce to an in-memory embedded broker and consume in KEY_ORDERLY mode, printing live "
            "stats once a second (throughput, lag, in flight, paused queues) and serving Prometheus metrics; "
            "then check per-key order (exit 1 if it fails)."
        ),
    )
    add_arguments(p, metrics_port=DEMO_METRICS_PORT)
    p.set_defaults(handler=_cmd_demo)

    p = sub.add_parser(
        "consume",
        help="run a listener (module:function) as a service",
        description=_para(
            "Consume TOPIC as group G from a source and call the listener for each batch; "
            "SIGTERM or SIGINT stops polling, lets the listener calls running finish, commits what finished and "
            "exits 0 (what was polled but never started comes back on the next start; --drain works through it "
            "first); a second one stops at once and exits 130."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    p.add_argument("--topic", metavar="T", help="topic to consume")
    p.add_argument(
        "--listener",
        metavar="MODULE:FUNCTION",
        help="the listener, imported with the current directory on sys.path; an async def one "
        "runs on the asyncio executor unless --executor says otherwise",
    )
    p.add_argument("--tags", metavar="EXPR", help="tag filter, e.g. 'TagA || TagB' (default *)")
    p.add_argument(
        "--mode",
        choices=["KEY_ORDERLY", "CONCURRENTLY", "QUEUE_ORDERLY"],
        help="default KEY_ORDERLY",
    )
    p.add_argument(
        "--lanes",
        type=int,
        metavar="N",
        help="lanes (default: 16 threads, or 2048 coroutines for an async def listener; an idle one costs no task)",
    )
    p.add_argument(
        "--lane-placement",
        choices=["load", "hash", "java"],
        help="which lane a key runs on (default load: the least-loaded lane for a key with no work)",
    )
    p.add_argument(
        "--executor",
        choices=["thread", "asyncio"],
        help="default thread (asyncio for async def)",
    )
    p.add_argument(
        "--max-rate",
        type=float,
        metavar="MSG_PER_S",
        help="the consumer's rate limit: listener calls start at most this many messages per second "
        "(default none; with --processes, per member)",
    )
    p.add_argument(
        "--key-min-interval",
        type=float,
        metavar="S",
        help="KEY_ORDERLY: least seconds between the starts of two calls of one key (default 0: off)",
    )
    p.add_argument(
        "--dead-letter-order",
        choices=["message", "key"],
        help="KEY_ORDERLY: what a dead letter does to its key (default message: the key moves on; key: its "
        "later messages follow it into the DLQ until `dlq resend --key` sends them back in order)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics (0: any free port)",
    )
    p.add_argument(
        "--metrics-addr",
        metavar="ADDR",
        help="metrics bind address (default 127.0.0.1)",
    )
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="no metrics, whatever the environment or file say",
    )
    p.add_argument(
        "--from",
        dest="from",
        choices=sorted(FROM),
        help="where a group with no committed offset starts (default last)",
    )
    p.add_argument(
        "--balance",
        type=str.lower,
        choices=["queue", "message"],
        help="how the group shares the messages (default queue: one queue, one member; message: any member "
        "takes any message, a key stays with one member while it has unacknowledged messages; "
        "redis:// sources only)",
    )
    p.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="run N member processes of the group under one supervisor (default 1): one per core; "
        "a member that dies is restarted; --metrics-port serves all their metrics (label member); "
        "redis:// and kafka:// sources only",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="longest wait at shutdown for the listener calls running (with --drain, for everything queued) (30)",
    )
    p.add_argument(
        "--drain",
        dest="drain_on_shutdown",
        action="store_true",
        default=None,
        help="at SIGTERM/Ctrl-C, work through everything already polled before committing (default: finish the "
        "calls running, commit, and let the rest come back on the next start)",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        default=None,
        help="an OpenTelemetry span per listener call, on the global tracer provider (needs lite-push[tracing])",
    )
    p.add_argument(
        "--progress",
        default="auto",
        choices=["auto", "on", "off"],
        help="a status line every 5 s: rate, lag, in flight, paused queues (auto: on a terminal; not with --processes)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default INFO",
    )
    p.set_defaults(handler=cmd_consume)

    _add_topic_commands(sub)

    p = sub.add_parser(
        "dlq",
        help="list and re-send dead letters",
        description="Dead letters of a consumer group (topic %DLQ%<group>).",
    )
    dlq = p.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    p = dlq.add_parser(
        "list",
        help="print the dead letters of a group",
        description=_para(
            "Print one line per dead letter of the group (DLQ offset, origin topic/queue/offset, "
            "original message id, reconsume times, reason; the key it holds, with "
            "dead_letter_order=key; where its copy went, once resent), or JSON lines with --json; with "
            "--held, one line per key held behind its dead letters instead.  When there is none, one line "
            "on stderr says so (standard output stays empty); a group the source has no record of is an "
            "error (exit 2).  Reads only: joins no group and commits nothing."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    p.add_argument(
        "--start",
        type=_nonneg,
        default=0,
        metavar="OFFSET",
        help="first DLQ offset (default 0)",
    )
    p.add_argument("--limit", type=_nonneg, metavar="N", help="read at most N offsets from --start")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--held",
        action="store_true",
        help="list the keys held behind their dead letters (key, letters held, the first's origin and "
        "offsets) instead of the dead letters; reads the whole DLQ",
    )
    p.set_defaults(handler=cmd_dlq_list)
    p = dlq.add_parser(
        "resend",
        help="send dead letters back to their original topics",
        description=_para(
            "Send dead letters back to their original topics as new messages (original body, keys, "
            "tags and properties).  The DLQ is append-only: a dead letter stays there after it is resent, "
            "and a resend record written after it says so (dlq list shows where its copy went, resent_to): "
            "--all skips the dead letters resent already, --offset refuses them, unless --force.  "
            "A key held behind its dead letters (dead_letter_order=key) goes back whole, in order, with "
            "--key (--all does so for each held key), which releases it."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--offset",
        type=_nonneg,
        nargs="+",
        action="extend",
        metavar="N",
        help="DLQ offsets to resend",
    )
    which.add_argument("--all", action="store_true", help="resend every dead letter of the group")
    which.add_argument(
        "--key",
        metavar="K",
        help="resend the dead letters held behind key K, in offset order, and release it",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="resend dead letters that were resent already (--all, --offset)",
    )
    p.add_argument(
        "--progress",
        default="auto",
        choices=["auto", "on", "off"],
        help="a progress bar on stderr for --all (auto: on a terminal)",
    )
    p.set_defaults(handler=cmd_dlq_resend)
    _add_group_commands(sub, fmt)
    return parser


def _add_group_commands(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """``lite-push group describe`` and ``lite-push group reset-offsets``
    (``sub``: the commands' subparsers action)."""
    p = sub.add_parser(
        "group",
        help="describe a consumer group (lag per queue, members) and reset its offsets",
        description="A consumer group's committed offsets, lag and members, read without joining it.",
    )
    group = p.add_subparsers(dest="group_command", metavar="ACTION", required=True)
    p = group.add_parser(
        "describe",
        help="per queue: committed offset, end, lag, owner, in flight; then the live members",
        description=_para(
            "Print, per queue of each topic the group consumes (or of --topic), its committed offset, the "
            "end offset, the lag, the member that owns it and the messages in flight where the source knows "
            "them ('-' where it does not); then the live members with the time since their last heartbeat.  "
            "The topics are those the group's members subscribed to (Redis) and those it has committed offsets "
            "on.  Reads only: joins no group and commits nothing.  A group with no committed offsets and no "
            "members is an error (exit 2)."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    p.add_argument("--topic", metavar="T", help="only this topic (required where the source cannot list them)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handler=cmd_group_describe)
    p = group.add_parser(
        "reset-offsets",
        help="move a group's committed offsets (a dry run without --execute)",
        description=_para(
            "Move the committed offsets of the group on topic T (or on its --queue queues) to each queue's "
            "first stored offset, its end (last: nothing left to read), or the first message stored at or "
            "after a time.  Without --execute it prints the plan (per queue: committed -> new) and changes "
            "nothing.  With it, it refuses while the group has live members (exit 1, naming them): stop them "
            "first.  The next member of the group reads each queue from its new offset."
        ),
        epilog=_SETTINGS_EPILOG,
        formatter_class=fmt,
    )
    _add_source_options(p)
    p.add_argument("--topic", metavar="T", help="the topic whose offsets move")
    p.add_argument(
        "--to",
        required=True,
        metavar="WHERE",
        help="first, last, an ISO 8601 time with its zone (2026-11-26T10:00:00Z) or epoch milliseconds",
    )
    p.add_argument(
        "--queue",
        type=_nonneg,
        nargs="+",
        action="extend",
        metavar="N",
        help="only these queue ids (default: every queue of the topic)",
    )
    p.add_argument("--execute", action="store_true", help="write the new offsets (default: print the plan only)")
    p.set_defaults(handler=cmd_group_reset)
