"""``lite-push dlq list`` and ``lite-push dlq resend``: a group's dead
letters (topic ``%DLQ%<group>``), read without joining the group, and sent
back to their original topics; with ``dead_letter_order="key"``, the keys
held behind their dead letters (``list --held``) and their release
(``resend --key``)."""

from __future__ import annotations

import argparse
import sys

import orjson
from tqdm import tqdm

from .._types import SendResult
from ..dlq import DeadLetter, HeldKey, held_keys, iter_dead_letters, resend, resend_key
from ..sources import dlq_topic
from .errors import CliError, one_line
from .settings import require, settings_of
from .sources import Broker, open_source, source_errors

__all__ = ["cmd_dlq_list", "cmd_dlq_resend"]


def _dlq_source(args: argparse.Namespace) -> tuple[Broker, str, str]:
    settings = settings_of(args, ("source", "group"))
    url = require(settings, "source", "--source")
    group = require(settings, "group", "--group").strip()  # require refuses a blank one
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
        + (f" held_key={one_line(dl.held_key)}" if dl.held_key is not None else "")
        + (f" held_behind={dl.held_behind}" if dl.held_behind is not None else "")
    )


def _held_line(h: HeldKey) -> str:
    """One line of ``dlq list --held``."""
    return (
        f"key={one_line(h.key)} letters={h.letters} behind={h.behind} first={h.first_origin} "
        f"offsets={','.join(map(str, h.offsets))}"
    )


def _held_doc(h: HeldKey) -> dict[str, object]:
    return {"key": h.key, "letters": h.letters, "behind": h.behind, "offsets": h.offsets, "origins": h.origins}


def _resent_line(offset: int, origin: str, r: SendResult) -> str:
    return f"resent offset={offset} origin={origin} -> {r.queue.topic}/{r.queue.queue_id}/{r.offset} msg_id={r.msg_id}"


def _resend_key(broker: Broker, group: str, held: HeldKey) -> None:
    """Release one held key: its dead letters resent in order, one line each."""
    results = resend_key(broker, group, held.key)
    for offset, origin, r in zip(held.offsets, held.origins, results, strict=False):
        print(_resent_line(offset, origin, r), flush=True)
    print(f"released key={one_line(held.key)} letters={len(results)}", flush=True)


def _say_none(text: str) -> None:
    """``dlq list`` found nothing: one line on stderr, so that standard
    output (the listing, one JSON document per line with ``--json``) stays
    empty."""
    print(f"lite-push dlq list: {text}", file=sys.stderr, flush=True)


def _window(start: int, stop: int | None) -> str:
    """Which offsets ``--start`` / ``--limit`` read, for the line that says
    none was found ("" for all of them)."""
    if stop is None:
        return "" if start == 0 else f" from offset {start}"
    if stop <= start:
        return " (--limit 0)"
    return f" at offset {start}" if stop == start + 1 else f" at offsets {start} to {stop - 1}"


def cmd_dlq_list(args: argparse.Namespace) -> int:
    broker, url, group = _dlq_source(args)
    try:
        with source_errors(url, broker):
            stop = None if args.limit is None else args.start + args.limit
            out = sys.stdout
            listed = 0
            if args.held:
                for h in held_keys(broker, group):
                    out.write((orjson.dumps(_held_doc(h)).decode() if args.json else _held_line(h)) + "\n")
                    listed += 1
                out.flush()
                if not listed:
                    _say_none(f"no keys held behind dead letters in {dlq_topic(group)}")
                return 0
            for dl in iter_dead_letters(broker, group, args.start, stop):
                if args.json:
                    out.write(orjson.dumps(dl.to_dict()).decode() + "\n")
                else:
                    out.write(_dl_line(dl) + "\n")
                listed += 1
            out.flush()
            if not listed:
                _say_none(f"no dead letters in {dlq_topic(group)}{_window(args.start, stop)}")
    finally:
        broker.close()
    return 0


def cmd_dlq_resend(args: argparse.Namespace) -> int:
    broker, url, group = _dlq_source(args)
    try:
        with source_errors(url, broker):
            held = {h.key: h for h in held_keys(broker, group)}
            if args.key is not None:
                if args.key not in held:
                    raise CliError(f"key: {args.key!r} holds no dead letters in {dlq_topic(group)}")
                _resend_key(broker, group, held[args.key])
                return 0
            holding = {o: h.key for h in held.values() for o in h.offsets}
            chosen: list[DeadLetter] = []
            if args.all:  # a held key's letters go back in order, by key, after the others
                chosen = [dl for dl in iter_dead_letters(broker, group) if dl.message.queue_offset not in holding]
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
                for dl in chosen:
                    key = holding.get(dl.message.queue_offset)
                    if key is not None:
                        raise CliError(
                            f"offset: {dl.message.queue_offset} is held behind key {key!r}, whose dead "
                            f"letters go back in order: use --key {key}"
                        )
            shown = {"on": False, "off": True, "auto": None}[args.progress] if args.all else True
            bar = tqdm(chosen, desc="resending", unit="msg", file=sys.stderr, disable=shown)  # None: a terminal only
            for dl in bar:
                origin = f"{dl.origin_topic}/{dl.origin_queue_id}/{dl.origin_offset}"
                print(_resent_line(dl.message.queue_offset, origin, resend(broker, dl)), flush=True)
            if args.all:
                for h in held.values():
                    _resend_key(broker, group, h)
    finally:
        broker.close()
    return 0
