"""Files of the durable embedded broker (the layout is in the package
docstring; :mod:`.log` appends to them).

Everything here is single-threaded by contract: the broker calls
:class:`QueueLog` and the topics methods of :class:`Store` with its main lock
held, and :meth:`Store.save_offsets` under its offsets-file lock.
"""

from __future__ import annotations

import gc
import logging
import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from ..._errors import LitePushError
from ..._kernels.untrack import untrack_all
from ..._types import MessageExt
from ..contract import DLQ_REASON, reconsume_times_of

try:  # POSIX advisory lock; elsewhere the directory is simply not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "HEADER",
    "MAGIC",
    "TRAILER",
    "QueueLog",
    "Store",
    "decode_meta",
    "encode_meta",
    "msg_id_prefix",
]

logger = logging.getLogger(__name__)

#: First four bytes of every record: b"LPR1" read as a little-endian u32.
MAGIC = 0x3152504C
#: magic u32, meta_len u32, body_len u32, queue_offset i64, born_ms i64,
#: store_ms i64 -- then ``meta_len`` bytes of metadata, ``body_len`` bytes of
#: body, then the trailer.
HEADER = struct.Struct("<IIIqqq")
#: CRC32 of header + metadata + body.
TRAILER = struct.Struct("<I")
#: A record claiming a larger body than this is treated as corrupt.
_MAX_BODY = 1 << 30

_TOPICS_FILE = "topics.json"
_OFFSETS_FILE = "offsets.json"
_LOCK_FILE = "LOCK"
_FORMAT_VERSION = 1


def msg_id_prefix(broker_name: str, topic: str, queue_id: int) -> str:
    """Message ids are ``prefix + str(queue_offset)``: unique per broker
    name, stable across reopen, so they are not stored."""
    return f"{broker_name}-{topic}-{queue_id}-"


def encode_meta(keys: str | None, tags: str | None, properties: Mapping[str, str] | None) -> bytes:
    """The metadata part of a record (``b""`` when there is none)."""
    if not keys and not tags and not properties:
        return b""
    meta: dict[str, Any] = {}
    if keys:
        meta["k"] = keys
    if tags:
        meta["t"] = tags
    if properties:
        meta["p"] = properties
    return orjson.dumps(meta)


def decode_meta(raw: bytes | memoryview) -> tuple[str | None, str | None, dict[str, str]]:
    """Inverse of :func:`encode_meta`: ``(keys, tags, properties)``."""
    if not raw:
        return None, None, {}
    meta = orjson.loads(raw)
    if not isinstance(meta, dict):
        raise ValueError("record metadata is not a JSON object")
    props = meta.get("p") or {}
    if not isinstance(props, dict):
        raise ValueError("record properties are not a JSON object")
    return meta.get("k"), meta.get("t"), props


def _reconsume_times(properties: Mapping[str, str]) -> int:
    """A loaded message's ``reconsume_times``: its RECONSUME_TIME property
    (0 when absent or, written by an older version, unreadable)."""
    try:
        return reconsume_times_of(properties) if properties else 0
    except ValueError:
        return 0


def _next_record(data: bytes, start: int, expected: int) -> tuple[int, int] | None:
    """After damage: the position and offset of the first whole record
    (magic, sane sizes, checksum) at or after byte ``start`` whose offset is
    at least ``expected``, or ``None`` when there is none."""
    magic = MAGIC.to_bytes(4, "little")
    total = len(data)
    i = data.find(magic, start)
    while i >= 0:
        if total - i >= HEADER.size + TRAILER.size:
            _m, meta_len, body_len, offset, _b, _s = HEADER.unpack_from(data, i)
            end = i + HEADER.size + meta_len + body_len
            if (
                body_len <= _MAX_BODY
                and offset >= expected
                and end + TRAILER.size <= total
                and zlib.crc32(data[i:end]) == TRAILER.unpack_from(data, end)[0]
            ):
                return i, offset
        i = data.find(magic, i + 1)
    return None


def _holder(lock_file: Any) -> int | None:
    """The PID the holder of a directory's LOCK wrote into it (None when it
    wrote none: an older lite_push, or not yet)."""
    lock_file.seek(0)
    text = lock_file.read(32).strip()
    return int(text) if text.isdigit() else None


def _atomic_write(path: Path, data: bytes, fsync: bool) -> None:
    """Write ``data`` to ``path`` so a reader sees the old or the new file,
    never a mix: write a temporary file, then rename it over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


class QueueLog:
    """One queue's append-only log file, opened unbuffered: each
    :meth:`append` reaches the OS before it returns, so a ``kill -9`` loses
    nothing that was acknowledged."""

    def __init__(self, path: Path, fsync: bool) -> None:
        self.path = path
        self._fsync = fsync
        self._file = open(path, "ab", buffering=0)
        self.size = self._file.seek(0, os.SEEK_END)
        #: Offsets of records :meth:`load` could not read in the middle of
        #: the log (valid records follow them): their messages are lost,
        #: readers skip them.
        self.unreadable: list[int] = []

    def load(self, topic: str, queue_id: int, broker_name: str) -> list[MessageExt]:
        """Read every record back as :class:`MessageExt`.  A record that is
        incomplete or fails its checks, with no valid record after it, ends
        the log: the file is truncated there, with a warning (the process
        died while writing it).  One followed by valid records (damage in
        the middle of the file) is skipped, logged at ERROR: its offsets
        hold placeholders (empty body, :data:`DLQ_REASON` saying why) that
        readers pass over (:attr:`unreadable`), and everything after it is
        kept."""
        data = self.path.read_bytes()
        view = memoryview(data)
        total = len(data)
        prefix = msg_id_prefix(broker_name, topic, queue_id)
        hsize = HEADER.size
        min_size = hsize + TRAILER.size
        unpack_header, unpack_trailer, crc32 = HEADER.unpack_from, TRAILER.unpack_from, zlib.crc32
        # decoded metadata (keys, tags, properties, reconsume_times) by its bytes
        metas: dict[bytes, tuple[str | None, str | None, dict[str, str], int]] = {}
        messages: list[MessageExt] = []
        append = messages.append
        pos = 0
        expected = 0
        problem = ""
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a million new objects would trigger many useless collections
        try:
            while True:
                while pos < total:
                    if total - pos < min_size:
                        problem = "incomplete record header"
                        break
                    magic, meta_len, body_len, offset, born, stored = unpack_header(data, pos)
                    if magic != MAGIC or body_len > _MAX_BODY:
                        problem = "bad record header"
                        break
                    body_start = pos + hsize + meta_len
                    end = body_start + body_len
                    if end + 4 > total:
                        problem = "incomplete record"
                        break
                    if crc32(view[pos:end]) != unpack_trailer(data, end)[0]:
                        problem = "record checksum mismatch"
                        break
                    if offset != expected:
                        problem = f"record offset {offset} where {expected} was expected"
                        break  # (a later offset: the record itself is whole, resumed at below)
                    if meta_len:
                        raw = data[pos + hsize : body_start]
                        decoded = metas.get(raw)
                        if decoded is None:
                            try:
                                keys, tags, props = decode_meta(raw)
                            except ValueError as e:  # orjson.JSONDecodeError is a ValueError
                                problem = f"unreadable record metadata ({e})"
                                break
                            decoded = (keys, tags, props, _reconsume_times(props))
                            if len(metas) > 65536:
                                metas.clear()
                            metas[raw] = decoded
                        keys, tags, props, times = decoded
                        props = dict(props) if props else {}
                    else:
                        keys = tags = None
                        props = {}
                        times = 0
                    append(
                        MessageExt(
                            topic,
                            queue_id,
                            offset,
                            data[body_start:end],
                            keys,
                            tags,
                            props,
                            born,
                            stored,
                            times,
                            prefix + str(offset),
                            broker_name,
                        )
                    )
                    expected += 1
                    pos = end + 4
                if pos >= total:
                    break
                found = _next_record(data, pos if problem.startswith("record offset") else pos + 1, expected)
                if found is None:
                    break  # nothing valid after it: a torn tail, truncated below
                nxt_pos, nxt_off = found
                logger.error(
                    "%s: %s at byte %d; %d byte(s) up to the next valid record (offset %d) skipped: "
                    "the message(s) at offset(s) %d..%d are lost",
                    self.path,
                    problem,
                    pos,
                    nxt_pos - pos,
                    nxt_off,
                    expected,
                    nxt_off - 1,
                )
                stored_before = messages[-1].store_timestamp if messages else 0
                reason = {DLQ_REASON: f"unreadable record: {problem}"}
                for off in range(expected, nxt_off):
                    self.unreadable.append(off)
                    append(
                        MessageExt(
                            topic,
                            queue_id,
                            off,
                            b"",
                            None,
                            None,
                            dict(reason),
                            0,
                            stored_before,
                            0,
                            prefix + str(off),
                            broker_name,
                        )
                    )
                pos, expected, problem = nxt_pos, nxt_off, ""
        finally:
            if gc_was_enabled:
                gc.enable()
        if pos < total:
            logger.warning(
                "%s: %s at byte %d; truncating %d trailing byte(s) (a write torn by a crash); %d message(s) kept",
                self.path,
                problem,
                pos,
                total - pos,
                len(messages),
            )
            self._file.truncate(pos)
            self.size = self._file.seek(pos)
        untrack_all(messages)  # stored for the broker's life: see lite_push._kernels.untrack_py
        return messages

    def append(self, data: bytes) -> None:
        """Write ``data`` at the end of the log.  On failure the file is cut
        back to its previous size (best effort) and the error raised."""
        start = self.size
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                n = self._file.write(view[written:])
                if n is None:  # pragma: no cover - only for non-blocking files
                    continue
                written += n
            if self._fsync:
                os.fsync(self._file.fileno())
        except BaseException:
            self.truncate(start)
            raise
        self.size = start + written

    def truncate(self, size: int) -> None:
        """Cut the log back to ``size`` bytes (undoing a failed batch); logs
        instead of raising."""
        try:
            self._file.truncate(size)
            self._file.seek(size)
            self.size = size
        except OSError:  # pragma: no cover
            logger.exception("%s: could not cut back to %d bytes", self.path, size)

    def close(self) -> None:
        if self._fsync and not self._file.closed:
            os.fsync(self._file.fileno())
        self._file.close()


class Store:
    """The broker's directory: ``LOCK``, ``topics.json``, ``offsets.json``
    and ``<topic>/<queue_id>.log``.  Holds an exclusive lock on ``LOCK`` while
    open, so two brokers never write the same directory."""

    def __init__(self, path: str | os.PathLike[str], fsync: bool) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.path / _LOCK_FILE, "a+b")
        if fcntl is not None:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _holder(self._lock_file)
                self._lock_file.close()
                if holder == os.getpid():
                    raise LitePushError(
                        f"{self.path} is already open in another EmbeddedBroker of this process"
                    ) from None
                by = "another process" if holder is None else f"process {holder}"
                raise LitePushError(
                    f"{self.path} is in use by {by} (already open in its EmbeddedBroker): a durable embedded "
                    "broker is open in one process at a time, and nothing else reads it meanwhile, not even "
                    "read-only; stop that process first"
                ) from None
            # who holds it, for the error of the next one that tries
            self._lock_file.truncate(0)
            self._lock_file.write(str(os.getpid()).encode())
            self._lock_file.flush()
        self._offsets_written = -1

    # -- topics ---------------------------------------------------------

    def load_topics(self) -> dict[str, int]:
        """``{topic: queue_count}`` as last saved (empty for a new directory)."""
        path = self.path / _TOPICS_FILE
        if not path.exists():
            return {}
        doc = orjson.loads(path.read_bytes())
        topics = doc.get("topics", {})
        return {str(t): int(n) for t, n in topics.items()}

    def save_topics(self, topics: Mapping[str, int]) -> None:
        doc = {"version": _FORMAT_VERSION, "topics": dict(topics)}
        _atomic_write(self.path / _TOPICS_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2), self.fsync)

    def open_queue(self, topic: str, queue_id: int) -> QueueLog:
        directory = self.path / topic
        directory.mkdir(exist_ok=True)
        return QueueLog(directory / f"{queue_id}.log", self.fsync)

    # -- offsets --------------------------------------------------------

    def load_offsets(self) -> dict[str, dict[tuple[str, int], tuple[int, str]]]:
        """``{group: {(topic, queue_id): (offset, metadata)}}``."""
        path = self.path / _OFFSETS_FILE
        if not path.exists():
            return {}
        doc = orjson.loads(path.read_bytes())
        out: dict[str, dict[tuple[str, int], tuple[int, str]]] = {}
        for group, topics in doc.get("groups", {}).items():
            entries = out.setdefault(group, {})
            for topic, queues in topics.items():
                for qid, entry in queues.items():
                    entries[(topic, int(qid))] = (int(entry["offset"]), str(entry.get("metadata", "")))
        return out

    def save_offsets(self, snapshot: Mapping[str, Mapping[tuple[str, int], tuple[int, str]]], version: int) -> None:
        """Write ``snapshot`` (shaped like :meth:`load_offsets`' result)
        unless a snapshot with a higher ``version`` was written already (two
        committers may reach this in either order)."""
        if version <= self._offsets_written:
            return
        groups: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        for group, entries in snapshot.items():
            g = groups.setdefault(group, {})
            for (topic, qid), (offset, metadata) in sorted(entries.items()):
                g.setdefault(topic, {})[str(qid)] = {"offset": offset, "metadata": metadata}
        doc = {"version": _FORMAT_VERSION, "groups": groups}
        _atomic_write(self.path / _OFFSETS_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2), self.fsync)
        self._offsets_written = version

    def close(self) -> None:
        """Release the directory lock."""
        if not self._lock_file.closed:
            self._lock_file.close()  # closing the descriptor drops the flock
