"""``lite-push dlq list`` and ``lite-push dlq resend``: a group's dead
letters (topic ``%DLQ%<group>``), read without joining the group, and sent
back to their original topics."""

from __future__ import annotations

import argparse
import sys

import orjson
from tqdm import tqdm

from ..dlq import DeadLetter, iter_dead_letters, resend
from ..sources import dlq_topic
from .errors import CliError, one_line
from .settings import require, settings_of
from .sources import Broker, open_source, source_errors

__all__ = ["cmd_dlq_list", "cmd_dlq_resend"]


def _dlq_source(args: argparse.Namespace) -> tuple[Broker, str, str]:
    settings = settings_of(args, ("source", "group"))
    url = require(settings, "source", "--source")
    group = require(settings, "group", "--group").strip()
    if not group:
        raise CliError("group: must be a non-empty string")
    return open_source(url, settings.kafka), url, group


def _dl_line(dl: DeadLetter) -> str:
    """One line for ``dlq list``; of a traceback only its last line (the
    exception) is shown."""
    lines = [line for line in dl.exception.splitlines() if line.strip()]
    exc = one_line(lines[-1]) if lines else ""
    if len(exc) > 200:
        exc = exc[:197] + "..."
    return (
        f"offset={dl.message.queue_offset} origin={dl.origin_topic}/{dl.origin_queue_id}/{dl.origin_offset} "
        f"msg_id={dl.origin_msg_id} reconsume_times={dl.reconsume_times} reason={one_line(dl.reason)}"
        + (f" exception={exc}" if exc else "")
    )


def cmd_dlq_list(args: argparse.Namespace) -> int:
    broker, url, group = _dlq_source(args)
    try:
        with source_errors(url):
            stop = None if args.limit is None else args.start + args.limit
            out = sys.stdout
            for dl in iter_dead_letters(broker, group, args.start, stop):
                if args.json:
                    out.write(orjson.dumps(dl.to_dict()).decode() + "\n")
                else:
                    out.write(_dl_line(dl) + "\n")
            out.flush()
    finally:
        broker.close()
    return 0


def cmd_dlq_resend(args: argparse.Namespace) -> int:
    broker, url, group = _dlq_source(args)
    try:
        with source_errors(url):
            chosen: list[DeadLetter] = []
            if args.all:
                chosen = list(iter_dead_letters(broker, group))
            else:
                missing = []
                for offset in dict.fromkeys(args.offset):
                    found = list(iter_dead_letters(broker, group, offset, offset + 1))
                    if found:
                        chosen.append(found[0])
                    else:
                        missing.append(offset)
                if missing:
                    listed = ", ".join(map(str, missing))
                    raise CliError(
                        f"offset: no dead letter at offset {listed} of {dlq_topic(group)}"
                    )
            shown = {"on": False, "off": True, "auto": None}[args.progress] if args.all else True
            bar = tqdm(chosen, desc="resending", unit="msg", file=sys.stderr, disable=shown)  # None: a terminal only
            for dl in bar:
                r = resend(broker, dl)
                print(
                    f"resent offset={dl.message.queue_offset} origin={dl.origin_topic}/{dl.origin_queue_id}/"
                    f"{dl.origin_offset} -> {r.queue.topic}/{r.queue.queue_id}/{r.offset} msg_id={r.msg_id}",
                    flush=True,
                )
    finally:
        broker.close()
    return 0
