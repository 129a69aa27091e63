"""A TCP proxy that can cut one member off from its server without closing
anything: :class:`TcpProxy`, for fault tests of a network partition.

A member process given the proxy's address instead of its server's talks to
the server through it.  :meth:`TcpProxy.partition` stops all forwarding at
once: the member's connections stay open but hang (no reply, no error, no
close), so its session with the server lapses while it still runs, as it
would behind a broken network.  :meth:`TcpProxy.heal` forwards again.

The proxy forwards by not reading: during a partition it reads nothing from
either side, so what a peer writes waits in the kernel's socket buffers
(and, once those fill, the peer's writes block).  Nothing is dropped and
the TCP streams stay intact: at :meth:`~TcpProxy.heal` every byte written
meanwhile is delivered, in order.  This has consequences a test must
expect:

- a command sent during a partition reaches the server only after the heal,
  and is applied then, even if the client gave up waiting for its reply
  (timed out, closed its connection): its bytes and then its close are
  delivered at the heal;
- a connection the server closed during a partition is seen closed by the
  member only after the heal;
- a connection made to the proxy during a partition is accepted (the
  member's connect succeeds) but its connection to the server is opened
  only at the heal.

One thread runs the whole proxy (a selector over non-blocking sockets),
with at most one chunk held in the proxy per direction of a connection, so
a slow reader slows its writer down instead of filling the proxy's memory.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
from types import TracebackType

__all__ = ["TcpProxy"]

logger = logging.getLogger(__name__)

#: The most bytes read at once from one side of a connection (and held by
#: the proxy for that direction until the other side has taken them).
CHUNK = 256 * 1024


class _Pipe:
    """One direction of a link: bytes read from ``src``, written to ``dst``."""

    __slots__ = ("buf", "dst", "eof", "shut", "src")

    def __init__(self, src: socket.socket, dst: socket.socket | None) -> None:
        self.src = src
        self.dst = dst
        self.buf = bytearray()
        self.eof = False  # src said it will write no more
        self.shut = False  # ... and dst was told (shutdown for writing)


class _Link:
    """One connection accepted from a client and its connection to the target."""

    __slots__ = ("client", "closed", "connecting", "down", "up", "upstream")

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.connecting = False
        self.closed = False
        self.up = _Pipe(client, None)  # client -> target
        self.down: _Pipe | None = None  # target -> client, once connecting

    def pipes(self) -> list[_Pipe]:
        return [self.up] if self.down is None else [self.up, self.down]


class TcpProxy:
    """Forwards TCP connections made to ``listen_host:port`` to
    ``target_host:target_port``, and can stop forwarding without closing a
    socket (see the module's documentation for what a partition does).

    ``listen_port`` 0 (the default) binds a free port, read from
    :attr:`port` after :meth:`start`.  Use it as a context manager (it
    starts on entry, closes on exit) or call :meth:`start` and
    :meth:`close`.  :meth:`partition`, :meth:`heal` and :meth:`close` may be
    called from any thread.
    """

    def __init__(
        self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1", listen_port: int = 0
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        # Held by the proxy's thread whenever it does I/O on a link, and by
        # partition() and heal() to flip the flag: once partition() returned,
        # not one more byte moves.
        self._lock = threading.Lock()
        self._partitioned = False
        self._closed = False
        self._links: list[_Link] = []
        self._masks: dict[socket.socket, int] = {}
        self._listener: socket.socket | None = None
        self._port: int | None = None
        self._target: tuple[socket.AddressFamily, tuple[object, ...]] | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    # -- the public API -----------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(listen_host, port)``: where clients connect to."""
        return self.listen_host, self.port

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        """``<scheme>://<listen_host>:<port><path>``; by default the URL of
        database 0 of the Redis server behind the proxy."""
        return f"{scheme}://{self.listen_host}:{self.port}{path}"

    @property
    def partitioned(self) -> bool:
        """Forwarding is stopped (between :meth:`partition` and :meth:`heal`)."""
        return self._partitioned

    @property
    def connections(self) -> int:
        """Connections accepted and not yet closed."""
        with self._lock:
            return len(self._links)

    def start(self) -> TcpProxy:
        """Bind the listening socket and start forwarding, in a daemon thread."""
        if self._closed:
            raise RuntimeError("the proxy is closed")
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        family, _, _, _, sockaddr = socket.getaddrinfo(self.target_host, self.target_port, type=socket.SOCK_STREAM)[0]
        self._target = (family, sockaddr)
        self._listener = socket.create_server((self.listen_host, self._listen_port), backlog=128)
        self._listener.setblocking(False)
        self._port = int(self._listener.getsockname()[1])
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()
        logger.info("tcp proxy %s:%d -> %s:%d started", self.listen_host, self.port, self.target_host, self.target_port)
        return self

    def partition(self) -> None:
        """Stop forwarding, in both directions, on every connection at once
        (new ones are accepted but not forwarded either).  No socket is
        closed; from the return of this call no byte is read or written
        until :meth:`heal`.  Idempotent."""
        with self._lock:
            self._partitioned = True
        self._wake()
        logger.info("tcp proxy on port %s: partitioned", self._port_or_none())

    def heal(self) -> None:
        """Forward again: what was written during the partition is delivered,
        in order.  Idempotent."""
        with self._lock:
            self._partitioned = False
        self._wake()
        logger.info("tcp proxy on port %s: healed", self._port_or_none())

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, close every socket and join the proxy's thread
        (waiting at most ``timeout`` seconds).  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        thread = self._thread
        if thread is None:
            with self._lock:
                self._close_all()
            return
        self._wake()
        thread.join(timeout)
        if thread.is_alive():
            logger.warning("tcp proxy thread %s did not stop within %g s", thread.name, timeout)

    def __enter__(self) -> TcpProxy:
        return self if self._thread is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "partitioned" if self._partitioned else "forwarding"
        return f"<TcpProxy :{self._port_or_none()} -> {self.target_host}:{self.target_port} {state}>"

    # -- the proxy's thread -------------------------------------------------------

    def _port_or_none(self) -> int | None:
        return self._port

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):  # already awake (buffer full) or closed
            pass

    def _run(self) -> None:
        assert self._sel is not None
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    self._refresh()
                events = self._sel.select()
                with self._lock:
                    if self._closed:
                        return
                    for key, mask in events:
                        self._handle(key, mask)
        except Exception:
            logger.exception("tcp proxy thread failed")
        finally:
            with self._lock:
                self._close_all()

    def _handle(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.fileobj is self._wake_r:
            try:
                while self._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass
        elif key.fileobj is self._listener:
            self._accept()
        elif not self._partitioned:
            link: _Link = key.data
            sock = key.fileobj
            if link.closed:
                return
            if link.connecting and sock is link.upstream:
                if mask & selectors.EVENT_WRITE:
                    self._connected(link)
                return
            for pipe in link.pipes():
                if link.closed:
                    return
                if mask & selectors.EVENT_READ and pipe.src is sock:
                    self._read(link, pipe)
                if mask & selectors.EVENT_WRITE and pipe.dst is sock and not link.closed:
                    self._flush(link, pipe)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: try again on the next event
                logger.warning("tcp proxy: accept failed: %s", e)
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._links.append(_Link(client))

    def _connect(self, link: _Link) -> None:
        """Start the non-blocking connection to the target."""
        assert self._target is not None
        family, sockaddr = self._target
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.setblocking(False)
        link.upstream = upstream
        link.up.dst = upstream
        link.down = _Pipe(upstream, link.client)
        err = upstream.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS):
            logger.debug("tcp proxy: connecting to the target failed: %s", errno.errorcode.get(err, err))
            self._drop(link)
            return
        link.connecting = err != 0
        if not link.connecting:
            self._connected(link)

    def _connected(self, link: _Link) -> None:
        assert link.upstream is not None
        err = link.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            logger.debug("tcp proxy: connecting to the target failed: %s", errno.errorcode.get(err, err))
            self._drop(link)
            return
        link.connecting = False
        link.upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _read(self, link: _Link, pipe: _Pipe) -> None:
        try:
            data = pipe.src.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            logger.debug("tcp proxy: read failed: %s", e)
            self._drop(link)
            return
        if data:
            pipe.buf += data
        else:
            pipe.eof = True
        self._flush(link, pipe)

    def _flush(self, link: _Link, pipe: _Pipe) -> None:
        """Write what ``pipe`` holds, as far as ``dst`` takes it now; pass an
        end of stream on once everything before it was written."""
        assert pipe.dst is not None
        try:
            while pipe.buf:
                sent = pipe.dst.send(pipe.buf)
                del pipe.buf[:sent]
            if pipe.eof and not pipe.shut:
                pipe.shut = True
                pipe.dst.shutdown(socket.SHUT_WR)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            logger.debug("tcp proxy: write failed: %s", e)
            self._drop(link)
            return
        if all(p.shut for p in link.pipes()) and link.down is not None:
            self._drop(link)

    def _refresh(self) -> None:
        """Connect what waits for a connection, and register with the selector
        what each socket waits for (nothing during a partition)."""
        assert self._sel is not None
        wanted: dict[socket.socket, tuple[int, _Link]] = {}
        for link in list(self._links):
            if self._partitioned:
                break
            if link.upstream is None:
                self._connect(link)
                if link.closed:
                    continue
            assert link.upstream is not None
            if link.connecting:
                wanted[link.upstream] = (selectors.EVENT_WRITE, link)
                continue
            for pipe in link.pipes():
                if not pipe.eof and not pipe.buf:
                    events, _ = wanted.get(pipe.src, (0, link))
                    wanted[pipe.src] = (events | selectors.EVENT_READ, link)
                if pipe.buf or (pipe.eof and not pipe.shut):
                    assert pipe.dst is not None
                    events, _ = wanted.get(pipe.dst, (0, link))
                    wanted[pipe.dst] = (events | selectors.EVENT_WRITE, link)
        for sock in [s for s in self._masks if s not in wanted]:
            self._sel.unregister(sock)
            del self._masks[sock]
        for sock, (events, link) in wanted.items():
            current = self._masks.get(sock)
            if current is None:
                self._sel.register(sock, events, link)
            elif current != events:
                self._sel.modify(sock, events, link)
            self._masks[sock] = events

    def _drop(self, link: _Link) -> None:
        """Close both sockets of ``link``."""
        link.closed = True
        if link in self._links:
            self._links.remove(link)
        for sock in (link.client, link.upstream):
            if sock is None:
                continue
            if sock in self._masks:
                assert self._sel is not None
                self._sel.unregister(sock)
                del self._masks[sock]
            sock.close()

    def _close_all(self) -> None:
        for link in list(self._links):
            self._drop(link)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        if self._sel is not None:
            self._sel.close()
        logger.info("tcp proxy -> %s:%d closed", self.target_host, self.target_port)
