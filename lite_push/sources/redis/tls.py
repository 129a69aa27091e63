"""TLS to Redis (``rediss://``), and saying so when one side speaks it and
the other does not.

A ``rediss://`` client against a plain Redis port sends its TLS hello and
waits: the server takes the bytes for an unfinished command and answers
nothing, so redis-py would wait its whole ``socket_timeout`` and then say
only "Timeout connecting to server".  :class:`TlsConnection` bounds the
handshake by ``socket_connect_timeout`` and says what failed.  A plain
``redis://`` client against a TLS port has its first command's connection
closed at once ("Connection reset by peer"); :func:`tls_mismatch` asks the
server (outside any client) which of the two it speaks, so a caller can
say which scheme to use.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import redis

__all__ = ["TlsConnection", "tls_mismatch"]


class TlsConnection(redis.SSLConnection):
    """redis-py's TLS connection whose handshake must end within
    ``socket_connect_timeout`` (the TCP connect's bound), not
    ``socket_timeout``; a handshake that fails or gets no answer raises a
    ``redis.ConnectionError`` that says TLS and names the server."""

    def _connect(self) -> Any:
        # redis-py's hook for connection classes: the base connects, sets the
        # socket's timeout to socket_timeout and (SSLConnection) shakes hands.
        # The handshake runs with the connect timeout instead.
        read_timeout = self.socket_timeout
        if self.socket_connect_timeout is not None:
            self.socket_timeout = self.socket_connect_timeout
        try:
            sock = super()._connect()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        except ssl.SSLCertVerificationError as e:
            raise redis.ConnectionError(
                f"TLS handshake with {self.host}:{self.port} failed: its certificate is not trusted "
                f"({e.verify_message}): give its CA with ?ssl_ca_certs=/path/to/ca.pem"
            ) from e
        except (TimeoutError, ssl.SSLError) as e:
            why = f"no answer within {self.socket_timeout:g} s" if isinstance(e, TimeoutError) else str(e)
            raise redis.ConnectionError(
                f"TLS handshake with {self.host}:{self.port} failed ({why}): is the server TLS? "
                "use redis:// for a plain port"
            ) from e
        finally:
            self.socket_timeout = read_timeout
        sock.settimeout(read_timeout)
        return sock


def tls_mismatch(host: str, port: int, tls: bool, timeout: float = 2.0) -> str | None:
    """What to tell a user whose ``redis://`` (``tls`` False) or
    ``rediss://`` (``tls`` True) client could not talk to ``host:port``
    when the server there speaks the other: one sentence naming the scheme
    to use; ``None`` when it does not (or cannot be reached in
    ``timeout``).  A plain server answers an inline ``PING`` (``+PONG``,
    or an error such as ``-NOAUTH``); a TLS server completes a handshake
    (no certificate check: this only asks what it speaks)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if tls:
                sock.sendall(b"PING\r\n")
                first = sock.recv(1)
                if first in (b"+", b"-"):
                    return f"the server at {host}:{port} is not TLS: use redis://"
                return None
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            with context.wrap_socket(sock, server_hostname=host):
                return f"the server at {host}:{port} speaks TLS: use rediss://"
    except (OSError, ssl.SSLError):
        return None
