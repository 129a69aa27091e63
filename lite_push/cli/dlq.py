"""``lite-push dlq list`` and ``lite-push dlq resend``: a group's dead
letters (topic ``%DLQ%<group>``), read without joining the group, and sent
back to their original topics; with ``dead_letter_order="key"``, the keys
held behind their dead letters (``list --held``) and their release
(``resend --key``).

``resend`` records what it sent back in the dead-letter topic (a resend
record after each batch, :func:`~lite_push.dlq.record_resent`), and skips
it the next time (``--all``) or refuses it (``--offset``) unless told
``--force``; ``list`` shows where a resent letter's copy went
(``resent_to``).  A group the source has no record of (no dead-letter or
retry topic, no committed offsets, no members) is an error naming it
(exit status 2), not an empty listing."""

from __future__ import annotations

import argparse
import sys

import orjson
from tqdm import tqdm

from .._errors import UnknownTopicError
from .._types import SendResult
from ..dlq import (
    DeadLetter,
    HeldKey,
    held_keys,
    iter_dead_letters,
    record_resent,
    resend,
    resend_key,
    resent_letters,
)
from ..sources import dlq_topic, retry_topic
from .errors import CliError, one_line
from .settings import require, settings_of
from .sources import Broker, open_source, redact, source_errors

__all__ = ["RECORD_EVERY", "cmd_dlq_list", "cmd_dlq_resend"]

#: ``resend`` writes a resend record after this many dead letters (and at
#: the end, however it ends): what an interruption can leave unrecorded.
RECORD_EVERY = 100


def _dlq_source(args: argparse.Namespace) -> tuple[Broker, str, str]:
    settings = settings_of(args, ("source", "group"))
    url = require(settings, "source", "--source")
    group = require(settings, "group", "--group").strip()  # require refuses a blank one
    return open_source(url, settings.kafka), url, group


def _has_topic(broker: Broker, topic: str) -> bool:
    try:
        broker.queues(topic)
    except UnknownTopicError:
        return False
    return True


def _check_known(broker: Broker, url: str, group: str) -> None:
    """:class:`CliError` (exit status 2) for a group the source has no
    record of: no dead-letter or retry topic, no committed offsets, no
    members (a misspelt ``--group`` is not a group without dead letters)."""
    if _has_topic(broker, dlq_topic(group)) or _has_topic(broker, retry_topic(group)):
        return
    if broker.group_admin(group).known():
        return
    raise CliError(
        f"group: {group!r} is unknown on {redact(url)}: it has no dead-letter topic ({dlq_topic(group)}), "
        "no committed offsets and no members"
    )


def _dl_line(dl: DeadLetter, resent_to: str | None) -> str:
    """One line for ``dlq list``; of a traceback only its last line (the
    exception) is shown; ``resent_to``: where its copy went, if it was
    resent."""
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
        + (f" resent_to={one_line(resent_to)}" if resent_to is not None else "")
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
            _check_known(broker, url, group)
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
            resent = resent_letters(broker, group)
            for dl in iter_dead_letters(broker, group, args.start, stop):
                to = resent.get(dl.message.queue_offset)
                if args.json:
                    out.write(orjson.dumps({**dl.to_dict(), "resent_to": to}).decode() + "\n")
                else:
                    out.write(_dl_line(dl, to) + "\n")
                listed += 1
            out.flush()
            if not listed:
                _say_none(f"no dead letters in {dlq_topic(group)}{_window(args.start, stop)}")
    finally:
        broker.close()
    return 0


def _chosen_offsets(
    broker: Broker, group: str, offsets: list[int], holding: dict[int, str], resent: dict[int, str], force: bool
) -> list[DeadLetter]:
    """The dead letters ``--offset`` names; :class:`CliError` (nothing
    sent) for an offset with none, one held behind its key, or one resent
    already (unless ``force``)."""
    chosen: list[DeadLetter] = []
    missing = []
    for offset in dict.fromkeys(offsets):
        found = list(iter_dead_letters(broker, group, offset, offset + 1))
        if found:
            chosen.append(found[0])
        else:
            missing.append(offset)
    if missing:
        raise CliError(f"offset: no dead letter at offset {', '.join(map(str, missing))} of {dlq_topic(group)}")
    for dl in chosen:
        offset = dl.message.queue_offset
        key = holding.get(offset)
        if key is not None:
            raise CliError(
                f"offset: {offset} is held behind key {key!r}, whose dead letters go back in order: use --key {key}"
            )
    again = [dl.message.queue_offset for dl in chosen if dl.message.queue_offset in resent]
    if again and not force:
        where = ", ".join(f"{o} (to {resent[o]})" for o in again)
        raise CliError(f"offset: resent already: {where}; --force resends again")
    return chosen


def _resend_all(broker: Broker, group: str, chosen: list[DeadLetter], no_bar: bool | None) -> None:
    """Resend ``chosen``, one line each, recording them in the dead-letter
    topic every :data:`RECORD_EVERY` letters and at the end, however it
    ends (a closed pipe, a signal, a source that fails: what was sent is
    recorded if the source still takes it).  ``no_bar``: tqdm's
    ``disable`` (``None``: a bar on a terminal only)."""
    done: list[tuple[int, SendResult]] = []
    try:
        for dl in tqdm(chosen, desc="resending", unit="msg", file=sys.stderr, disable=no_bar):
            r = resend(broker, dl)
            done.append((dl.message.queue_offset, r))
            origin = f"{dl.origin_topic}/{dl.origin_queue_id}/{dl.origin_offset}"
            print(_resent_line(dl.message.queue_offset, origin, r), flush=True)
            if len(done) >= RECORD_EVERY:
                record_resent(broker, group, done)
                done = []
    finally:
        if done:
            record_resent(broker, group, done)


def cmd_dlq_resend(args: argparse.Namespace) -> int:
    broker, url, group = _dlq_source(args)
    try:
        with source_errors(url, broker):
            _check_known(broker, url, group)
            held = {h.key: h for h in held_keys(broker, group)}
            if args.key is not None:
                if args.key not in held:
                    raise CliError(f"key: {args.key!r} holds no dead letters in {dlq_topic(group)}")
                _resend_key(broker, group, held[args.key])
                return 0
            holding = {o: h.key for h in held.values() for o in h.offsets}
            resent = resent_letters(broker, group)
            if args.all:  # a held key's letters go back in order, by key, after the others
                letters = [dl for dl in iter_dead_letters(broker, group) if dl.message.queue_offset not in holding]
                chosen = letters if args.force else [dl for dl in letters if dl.message.queue_offset not in resent]
                skipped = len(letters) - len(chosen)
            else:
                chosen = _chosen_offsets(broker, group, args.offset, holding, resent, args.force)
                skipped = 0
            no_bar = {"on": False, "off": True, "auto": None}[args.progress] if args.all else True
            _resend_all(broker, group, chosen, no_bar)
            if args.all:
                for h in held.values():
                    _resend_key(broker, group, h)
                if skipped:
                    _say_resend(
                        f"{skipped} dead letter(s) of {dlq_topic(group)} resent already, skipped (--force resends them)"
                    )
                elif not chosen and not held:
                    _say_resend(f"no dead letters in {dlq_topic(group)}")
    finally:
        broker.close()
    return 0


def _say_resend(text: str) -> None:
    """``dlq resend --all``'s note on stderr (standard output lists what
    was resent, one line each)."""
    print(f"lite-push dlq resend: {text}", file=sys.stderr, flush=True)
