"""What the embedded and the Redis sources share: reading a ``send_batch``
item, and the per-member queue state (assignment, pause/resume) behind the
PullSource contract."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from .._errors import NotSubscribedError
from .._types import MessageQueue
from ._base import RebalanceListener

__all__ = ["ITEM_FIELDS", "QueueStates", "unpack_mapping"]

logger = logging.getLogger(__name__)

#: The keys a mapping item of ``send_batch`` may have.
ITEM_FIELDS = frozenset({"body", "keys", "tags", "properties", "queue_id"})


def unpack_mapping(item: Mapping[str, Any]) -> tuple[Any, str | None, str | None, dict[str, str], int | None]:
    """``(body, keys, tags, properties, queue_id)`` of a mapping item of
    ``send_batch``; ``TypeError`` naming what is wrong (the body and keys
    are checked by the caller)."""
    unknown = set(item) - ITEM_FIELDS
    if unknown or "body" not in item:
        raise TypeError(f"send_batch mapping items need 'body' and take only {sorted(ITEM_FIELDS)}")
    tags = item.get("tags")
    if tags is not None and type(tags) is not str:
        raise TypeError(f"tags must be str or None, got {type(tags).__name__}")
    raw = item.get("properties")
    props: dict[str, str] = {}
    if raw:
        if not isinstance(raw, Mapping):
            raise TypeError(f"properties must be a mapping of str to str, got {type(raw).__name__}")
        props = dict(raw)
        for k, v in props.items():
            if type(k) is not str or type(v) is not str:
                raise TypeError(f"properties must map str to str, got {k!r}: {v!r}")
    return item["body"], item.get("keys"), tags or None, props, item.get("queue_id")


class _State(Protocol):
    paused: bool


class QueueStates:
    """Mixin for a source consumer that keeps ``_states`` (its owned queues'
    state objects, each with ``paused``) and ``_active`` (the unpaused ones in
    queue order), and has ``_listener``, ``client_id`` and ``_check_open()``."""

    _states: dict[MessageQueue, Any]
    _active: list[Any]
    _listener: RebalanceListener | None

    @property
    def client_id(self) -> str:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _notify(self, what: str, queues: list[MessageQueue]) -> None:
        """Call the rebalance listener's ``what``; log (never raise) its errors."""
        listener = self._listener
        if listener is None:
            return
        try:
            getattr(listener, what)(queues)
        except Exception:
            logger.exception("rebalance listener %s(%s) of %r raised", what, [str(q) for q in queues], self)

    def _rebuild_active(self) -> None:
        self._active = [st for _, st in sorted(self._states.items()) if not st.paused]

    def assignment(self) -> frozenset[MessageQueue]:
        self._check_open()
        return frozenset(self._states)

    def pause(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()
        changed = False
        for q in queues:
            st = self._states.get(q)
            if st is not None and not st.paused:
                st.paused = changed = True
        if changed:
            self._rebuild_active()

    def resume(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()
        changed = False
        for q in queues:
            st = self._states.get(q)
            if st is not None and st.paused:
                st.paused = False
                changed = True
        if changed:
            self._rebuild_active()

    def paused(self) -> frozenset[MessageQueue]:
        self._check_open()
        return frozenset(q for q, st in self._states.items() if st.paused)

    def _owned(self, queue: MessageQueue) -> Any:
        st = self._states.get(queue)
        if st is None:
            raise NotSubscribedError(f"{queue} is not assigned to consumer {self.client_id!r}")
        return st
