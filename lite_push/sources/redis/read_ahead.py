"""A pipelined read sent now and answered later (the event loop's read-ahead).

The asyncio executor's pull side reads on the event loop's own thread
(``poll_nowait``), and a read waits for redis-server to build its reply.
:class:`ReadAhead` splits that read in two: :meth:`ReadAhead.send` writes
the pipeline's commands on a connection of its own and returns at once, so
redis-server works while the loop runs the lanes; :meth:`ReadAhead.receive`
reads the replies (by then usually waiting in the socket).  In between the
connection is held here, out of the pool: nobody else may read its replies.

It uses redis-py's public connection API (``pack_commands``,
``send_packed_command``, ``parse_response``) on a pipeline built as usual,
so each reply goes through the same response callbacks as
``Pipeline.execute``.  Whether the replies still fit what the member owns
and where it reads is the caller's check (:mod:`.polling`).
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

__all__ = ["ReadAhead"]


class ReadAhead:
    """At most one pipeline in flight: its connection, and what the caller
    noted about it when it was sent (``note``)."""

    __slots__ = ("_conn", "_pipe", "note")

    def __init__(self) -> None:
        self._conn: Any = None
        self._pipe: Any = None
        #: What the caller recorded with the read in flight (``None``: none).
        self.note: Any = None

    @property
    def pending(self) -> bool:
        """Whether a read was sent and its replies not yet read."""
        return self._conn is not None

    def send(self, pipe: Any, note: object) -> None:
        """Send ``pipe``'s commands (a redis-py non-transactional pipeline)
        on a connection taken from its pool, and keep both until
        :meth:`receive` or :meth:`drop`.  A connection error propagates,
        with the connection closed and back in the pool."""
        if self._conn is not None:
            raise RuntimeError("a read is already in flight")
        pool = pipe.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands([args for args, _ in pipe.command_stack]))
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            pipe.reset()
            raise
        self._conn, self._pipe, self.note = conn, pipe, note

    def receive(self) -> list[Any]:
        """The replies of the read in flight, in command order; a command's
        error reply is its ``ResponseError`` in the list (as
        ``execute(raise_on_error=False)`` gives it).  A connection error
        propagates, with the connection closed.  Either way nothing is in
        flight afterwards."""
        conn, pipe = self._conn, self._pipe
        if conn is None:
            raise RuntimeError("no read in flight")
        self._conn = self._pipe = self.note = None
        out: list[Any] = []
        try:
            for args, options in pipe.command_stack:
                try:
                    out.append(pipe.parse_response(conn, args[0], **options))
                except ResponseError as e:
                    out.append(e)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pipe.connection_pool.release(conn)
            pipe.reset()
        return out

    def drop(self) -> None:
        """Forget the read in flight, if any: its connection is closed (its
        replies unread) and goes back to the pool."""
        conn, pipe = self._conn, self._pipe
        if conn is None:
            return
        self._conn = self._pipe = self.note = None
        try:
            conn.disconnect()
        finally:
            pipe.connection_pool.release(conn)
            pipe.reset()
