"""Saying so when redis-server lost lite_push's data under a running member.

A FLUSHALL (or FLUSHDB), or a restart without the saved data (no AOF or
RDB, or another server on the same address), empties the namespace while
its members poll it.  Nothing fails: reads of the emptied streams come back
empty, a member's queues are no longer its own (their owner keys are
gone), and it takes them again where ``consume_from`` says, since the
group's committed offsets are gone too.  Without a word, a user sees a
consumer that "lost its session" and then consumes nothing of the old
topic (a producer that asks for it now gets "does not exist").

A member notices it on paths it already takes, so polls pay nothing: a
CLUSTERING member reads its group's version with every poll (a version
that vanished or went back means the group's keys were reset), and a
member loses its queues (:mod:`.clustering`) or its sessions on them
(:mod:`.message_grain`).  Only then one pipelined round trip
(:meth:`LostData.check`) asks whether the subscribed topics are still
registered and whether the group's start positions are there; when they
are gone the member logs one WARNING naming the server, the namespace, the
group and the topics, instead of blaming its session.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .connection import Connection, server_address

__all__ = ["LostData", "went_back"]

logger = logging.getLogger(__name__)


def went_back(seen: bytes | None, now: bytes | None) -> bool:
    """Whether a group's version read as ``now`` after ``seen`` says that
    its keys were reset: it vanished, or it is lower (the counter only
    grows while its keys last)."""
    if seen is None:
        return False
    if now is None:
        return True
    try:
        return int(now) < int(seen)
    except ValueError:  # not lite_push's counter: nothing to say
        return False


class LostData:
    """The check of one member of ``group`` on ``conn``'s namespace."""

    def __init__(self, conn: Connection, group: str) -> None:
        self._conn = conn
        self._group = group

    def check(self, topics: Sequence[str], *, group_reset: bool = False) -> bool:
        """After the member lost queues, or saw its group's version reset
        (``group_reset``): one round trip asks whether ``topics`` are still
        in the namespace's registry and whether the group's start positions
        are stored.  When a topic or the group's state is gone, log one
        WARNING saying that the data is (the group's offsets with it) and
        return True (the caller then says nothing of
        sessions); else return False."""
        conn = self._conn
        pipe = conn.pipeline()
        if topics:
            pipe.hmget(conn.topics_key(), list(topics))
        pipe.exists(conn.group_key(self._group, "initial"))
        replies = pipe.execute()
        counts = replies[0] if topics else []
        gone = [t for t, n in zip(topics, counts, strict=True) if n is None]
        # lite_push never deletes a topic: one that is gone went with the
        # rest of the namespace, the group's offsets too (whatever another
        # member of the group stored since)
        if not gone and not group_reset and int(replies[-1]):
            return False
        said = [f"the committed offsets of group {self._group!r} are gone"]
        if gone:
            names = ", ".join(repr(t) for t in gone)
            said.insert(0, f"topic {names} is gone" if len(gone) == 1 else f"topics {names} are gone")
        logger.warning(
            "redis-server %s lost lite_push's data in namespace %r (a FLUSHALL, or a restart without its saved "
            "data): %s; this member of group %r goes on, taking its queues again where consume_from says%s",
            server_address(conn.client),
            conn.namespace,
            " and ".join(said),
            self._group,
            "; create the topic again (lite-push topic create) for producers to find it" if gone else "",
        )
        return True
