"""Committed offsets of a BROADCASTING consumer, in a local file.

In the BROADCASTING model every member of a group reads every queue, so the
group has no shared position: each member keeps its own, on its own disk
(RocketMQ's ``LocalFileOffsetStore``).  The file is orjson::

    {"format": 1, "broker": "<broker name>", "group": "<group>",
     "offsets": {"<topic>#<queue id>": [offset, metadata], ...}}

and is replaced atomically on every commit that changes it: the new content
is written to a temporary file in the same directory, fsynced, renamed over
the old one (``os.replace``), and the directory is fsynced, so a crash leaves
either the old or the new offsets, never a torn file.

One consumer at a time: the store holds an exclusive ``flock`` on
``<file>.lock`` while open, and a second store on the same file raises
:class:`~lite_push.ConfigError` naming ``offset_file``.  Two members of one
group on the same machine therefore need different files.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import orjson

from .._errors import ConfigError, LitePushError
from .._types import MessageQueue, OffsetAndMetadata

__all__ = ["DEFAULT_OFFSET_DIR_ENV", "LocalOffsetStore", "OffsetFileError", "default_offset_file"]

logger = logging.getLogger(__name__)

#: Environment variable naming the directory of the default offset files
#: (default ``~/.lite_push/offsets``).
DEFAULT_OFFSET_DIR_ENV = "LITE_PUSH_OFFSET_DIR"
_FORMAT = 1


class OffsetFileError(LitePushError):
    """The offsets file exists but cannot be used (not ours, or damaged)."""


def default_offset_file(broker_name: str, group: str) -> Path:
    """``$LITE_PUSH_OFFSET_DIR/<broker>/<group>.json``, the directory
    defaulting to ``~/.lite_push/offsets``."""
    root = os.environ.get(DEFAULT_OFFSET_DIR_ENV)
    base = Path(root) if root else Path.home() / ".lite_push" / "offsets"
    return base / _safe(broker_name) / f"{_safe(group)}.json"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@%" else "_" for c in name)


def _qfield(q: MessageQueue) -> str:
    return f"{q.topic}#{q.queue_id}"


class LocalOffsetStore:
    """The offsets of one BROADCASTING member of ``group``, in ``path``.

    Opening loads the file (a missing file is an empty store) and locks it;
    :meth:`close` releases it.  :meth:`commit` writes the whole file
    atomically.  Thread-safe.  Raises :class:`OffsetFileError` when the file
    is damaged or belongs to another broker or group (nothing is started
    from a guessed position) and :class:`~lite_push.ConfigError` when another
    consumer holds it.
    """

    def __init__(self, path: str | os.PathLike[str], *, broker_name: str, group: str) -> None:
        self.path = Path(path)
        self.broker_name = broker_name
        self.group = group
        self._lock = threading.Lock()
        self._offsets: dict[str, OffsetAndMetadata] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError("offset_file", f"cannot use {str(self.path)!r}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ConfigError(
                "offset_file", f"{str(self.path)!r} is in use by another consumer (each member needs its own file)"
            ) from None
        try:
            self._load()
        except BaseException:
            self._unlock()
            raise
        self._closed = False

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, expected {_FORMAT}")
            offsets = doc["offsets"]
            loaded = {}
            for field, (offset, metadata) in offsets.items():
                if type(offset) is not int or offset < 0 or type(metadata) is not str:
                    raise ValueError(f"bad entry for {field!r}: {[offset, metadata]!r}")
                loaded[field] = OffsetAndMetadata(offset, metadata)
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            raise OffsetFileError(f"offsets file {str(self.path)!r} is damaged: {exc}") from exc
        if doc.get("broker") != self.broker_name or doc.get("group") != self.group:
            raise OffsetFileError(
                f"offsets file {str(self.path)!r} belongs to broker {doc.get('broker')!r} group "
                f"{doc.get('group')!r}, not {self.broker_name!r} group {self.group!r}"
            )
        self._offsets = loaded
        logger.info("loaded %d committed offset(s) of group %r from %s", len(loaded), self.group, self.path)

    def get(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        """The offset committed for ``queue``, or None."""
        with self._lock:
            return self._offsets.get(_qfield(queue))

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        """Store ``offsets`` and rewrite the file (skipped when nothing
        changed).  On an I/O error the file keeps its previous content and
        the error propagates (the caller commits again later)."""
        with self._lock:
            if self._closed:
                raise LitePushError(f"offsets file {str(self.path)!r} is closed")
            changed = False
            for q, om in offsets.items():
                field = _qfield(q)
                if self._offsets.get(field) != om:
                    changed = True
            if not changed:
                return
            new = dict(self._offsets)
            for q, om in offsets.items():
                new[_qfield(q)] = om
            self._write(new)
            self._offsets = new

    def _write(self, offsets: Mapping[str, OffsetAndMetadata]) -> None:
        doc = {
            "format": _FORMAT,
            "broker": self.broker_name,
            "group": self.group,
            "offsets": {f: [om.offset, om.metadata] for f, om in sorted(offsets.items())},
        }
        data = orjson.dumps(doc)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def snapshot(self) -> dict[str, OffsetAndMetadata]:
        """Every stored offset, by ``"<topic>#<queue id>"``."""
        with self._lock:
            return dict(self._offsets)

    def _unlock(self) -> None:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)

    def close(self) -> None:
        """Release the file (the offsets were written at each commit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._unlock()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<LocalOffsetStore {str(self.path)!r} group {self.group!r}>"
