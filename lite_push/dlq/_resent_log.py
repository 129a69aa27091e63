"""Which dead letters were sent back already: the record a group's
dead-letter topic ``%DLQ%<group>`` keeps of it.

The dead-letter topic is append-only (a Kafka topic cannot drop one record),
so what happened to a dead letter is written after it, as the release
records of held keys are (``dlq._held_log``):

* a *resend record* (an empty message with
  :data:`~lite_push.sources.contract.RESENT_LETTERS`, written by
  ``lite_push.dlq.record_resent`` after ``lite-push dlq resend`` sent
  dead letters back) names them by their offsets in the topic, each with
  where its copy went (``topic/queue_id/offset``);
* a held letter (:data:`~lite_push.sources.contract.HELD_KEY`) that a release
  record of its key closed (up to its
  :data:`~lite_push.sources.contract.RELEASED_THROUGH` offset) was sent back
  by ``resend_key``: :data:`RELEASED`.

:class:`ResentLog` folds them, read in offset order.  A letter resent twice
(``--force``) keeps the later copy's place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence

from .._types import MessageExt
from ..sources.contract import (
    DLQ_GROUP,
    HELD_KEY,
    RELEASED_KEY,
    RELEASED_THROUGH,
    RESENT_LETTERS,
    DeadLetterReader,
)
from ._held_log import READ_PAGE, read_folded

__all__ = ["RECORD_LETTERS", "RELEASED", "ResentLog", "resend_record"]

logger = logging.getLogger(__name__)

#: Dead letters one resend record names at most.
RECORD_LETTERS = 500
#: Where a held letter released with its key went (the release record says
#: only where the key's last copy per queue went).
RELEASED = "released"


def resend_record(group: str, resent: Sequence[tuple[int, str]]) -> dict[str, str]:
    """The properties of the resend record of ``resent``: ``(dead-letter
    topic offset, "topic/queue_id/offset" of its copy)`` pairs of
    ``group``."""
    return {RESENT_LETTERS: json.dumps([[offset, to] for offset, to in resent]), DLQ_GROUP: group}


class ResentLog:
    """The dead letters of a dead-letter topic sent back so far (see the
    module docstring), fed its records in offset order (:meth:`feed`, or
    :meth:`read` from a reader).  Used by one thread at a time."""

    __slots__ = ("_held", "next_offset", "resent")

    def __init__(self) -> None:
        #: Dead-letter topic offset -> where its copy went (``topic/queue_id/offset``, or :data:`RELEASED`).
        self.resent: dict[int, str] = {}
        #: Key -> the offsets of its held letters not yet released.
        self._held: dict[str, list[int]] = {}
        #: The dead-letter topic offset to read next.
        self.next_offset = 0

    def feed(self, messages: Iterable[MessageExt]) -> None:
        """Fold dead-letter topic records, in offset order.  A resend or
        release record whose bookkeeping is malformed marks nothing
        (logged)."""
        for m in messages:
            props = m.properties
            try:
                if (letters := props.get(RESENT_LETTERS)) is not None:
                    self._resent(json.loads(letters))
                elif (key := props.get(HELD_KEY)) is not None:
                    self._held.setdefault(key, []).append(m.queue_offset)
                elif (released := props.get(RELEASED_KEY)) is not None:
                    through = int(props[RELEASED_THROUGH])
                    offsets = self._held.pop(released, [])
                    for offset in offsets:
                        if offset <= through:
                            self.resent[offset] = RELEASED
                    rest = [o for o in offsets if o > through]
                    if rest:
                        self._held[released] = rest
            except (KeyError, ValueError, TypeError) as e:
                logger.warning("%s offset %d marks nothing: malformed bookkeeping (%r)", m.topic, m.queue_offset, e)
            self.next_offset = m.queue_offset + 1

    def _resent(self, entries: object) -> None:
        pairs: list[tuple[int, str]] = []
        for entry in entries if isinstance(entries, list) else [entries]:
            match entry:
                case [int(offset), str(to)]:
                    pairs.append((offset, to))
                case _:
                    raise ValueError(f"{RESENT_LETTERS}: not [offset, topic/queue_id/offset]: {entry!r}")
        self.resent.update(pairs)

    def read(self, reader: DeadLetterReader, group: str, page: int = READ_PAGE) -> int:
        """Read and fold what ``group``'s dead-letter topic holds from
        :attr:`next_offset` on, ``page`` offsets at a time; return how many
        records were read (0 when the group has no dead-letter topic)."""
        return read_folded(self, reader, group, page)
