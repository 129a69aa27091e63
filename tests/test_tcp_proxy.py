"""lite_push.testing.TcpProxy: a redis-py client through the proxy works
(commands, pipelines, pub/sub, several connections at once, large values),
a partition hangs every connection without closing one and moves no byte
until the heal, which delivers everything in order; close() stops it all.

Where a test asserts that something does not happen during a partition, the
proxy guarantees it (it reads nothing once ``partition()`` returned): the
wait before the assertion cannot make it fail on a slow machine."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import redis
from helpers import wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry

from lite_push.sources.redis_server import RedisServer
from lite_push.testing import TcpProxy

#: A client that tries a command once: a timeout is reported, not retried
#: on a new connection.
NO_RETRY = Retry(NoBackoff(), 0)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", redis_server.port) as p:
        yield p


@pytest.fixture
def direct(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client straight to the server, to see what it holds."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


def through(proxy: TcpProxy, **kw: object) -> redis.Redis:
    return redis.Redis(host=proxy.listen_host, port=proxy.port, retry=NO_RETRY, **kw)  # type: ignore[arg-type]


def server_clients(direct: redis.Redis) -> int:
    return len(direct.client_list(_type="normal")) - 1  # not counting ``direct`` itself


def client_names(direct: redis.Redis) -> set[str]:
    return {c["name"] for c in direct.client_list(_type="normal")}


def quiet(direct: redis.Redis) -> None:
    """Wait until the server has seen the close of the connections earlier
    tests closed (nothing else connects to it meanwhile)."""
    wait_for(lambda: server_clients(direct) == 0, 30, "the connections of earlier tests closed on the server")


def resp(*args: bytes) -> bytes:
    out = b"*%d\r\n" % len(args)
    for a in args:
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def test_commands_and_a_pipeline_through_the_proxy(proxy: TcpProxy, direct: redis.Redis) -> None:
    assert proxy.address == ("127.0.0.1", proxy.port) and proxy.port > 0
    assert proxy.url() == f"redis://127.0.0.1:{proxy.port}/0"
    with redis.Redis.from_url(proxy.url()) as client:
        assert client.set("k", "v")
        assert client.get("k") == b"v"
        pipe = client.pipeline()
        for i in range(5000):
            pipe.set(f"p{i}", i)
        pipe.get("p4999")
        assert pipe.execute()[-1] == b"4999"
        for _ in range(2000):  # one request and its reply at a time
            client.incr("n")
    assert direct.get("n") == b"2000" and direct.get("p0") == b"0"


def test_several_connections_at_once(proxy: TcpProxy, direct: redis.Redis) -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with through(proxy) as client:
                for _ in range(1000):
                    client.incr("shared")
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert direct.get("shared") == b"6000"


def test_a_large_value_crosses_in_pieces(proxy: TcpProxy, direct: redis.Redis) -> None:
    value = bytes(range(256)) * (32 * 1024)  # 8 MiB: many chunks, partial writes
    with through(proxy) as client:
        assert client.set("big", value)
        assert client.get("big") == value
    assert direct.strlen("big") == len(value)


def test_pub_sub_through_the_proxy_and_a_message_published_in_a_partition_arrives_at_the_heal(
    proxy: TcpProxy, direct: redis.Redis
) -> None:
    with through(proxy) as client:
        pubsub = client.pubsub()
        pubsub.subscribe("ch")
        assert pubsub.get_message(timeout=30)["type"] == "subscribe"
        assert direct.publish("ch", "before") == 1
        assert pubsub.get_message(timeout=30)["data"] == b"before"

        proxy.partition()
        assert proxy.partitioned
        assert direct.publish("ch", "during") == 1  # the server wrote it to the proxy
        assert pubsub.get_message(timeout=0.3) is None  # ... which holds it
        proxy.heal()
        assert not proxy.partitioned
        assert pubsub.get_message(timeout=30)["data"] == b"during"
        assert direct.publish("ch", "after") == 1
        assert pubsub.get_message(timeout=30)["data"] == b"after"
        pubsub.close()


def test_a_command_in_a_partition_times_out_is_not_applied_and_is_applied_at_the_heal(
    proxy: TcpProxy, direct: redis.Redis
) -> None:
    """The client gave up (timed out and closed its connection), but its
    command was written: the proxy delivers it at the heal, then the close."""
    client = through(proxy, socket_timeout=0.5, client_name="member")
    assert client.ping()
    proxy.partition()
    with pytest.raises(redis.TimeoutError):
        client.set("late", "1")
    client.close()
    assert direct.get("late") is None
    assert "member" in client_names(direct)  # its connection is open on the server: the close is held too
    proxy.heal()
    wait_for(lambda: direct.get("late") == b"1", 30, "the SET written in the partition, applied at the heal")
    wait_for(lambda: "member" not in client_names(direct), 30, "the client's close passed on")
    wait_for(lambda: proxy.connections == 0, 30, "the proxy to drop the connection")


def test_a_connection_waiting_on_a_reply_gets_it_at_the_heal(proxy: TcpProxy, direct: redis.Redis) -> None:
    """The TCP stream stays intact: a command sent in the partition on an
    open connection is answered on it after the heal, in order."""
    client = through(proxy)  # no socket timeout: it waits
    assert client.set("x", "0")
    proxy.partition()
    replies: list[object] = []
    worker = threading.Thread(target=lambda: replies.append(client.incr("x")))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and not replies  # hung, not failed
    assert direct.get("x") == b"0"
    proxy.heal()
    worker.join(30)
    assert replies == [1]
    assert client.incr("x") == 2
    with through(proxy) as fresh:  # and a new client works
        assert fresh.get("x") == b"2"
    client.close()


def test_a_connection_made_in_a_partition_reaches_the_server_at_the_heal(proxy: TcpProxy, direct: redis.Redis) -> None:
    quiet(direct)
    proxy.partition()
    with socket.create_connection(proxy.address, timeout=30) as raw:  # accepted
        raw.sendall(resp(b"PING"))
        wait_for(lambda: proxy.connections == 1, 30, "the proxy to accept the connection")
        assert server_clients(direct) == 0  # not connected on to the server
        raw.settimeout(0.3)
        with pytest.raises(TimeoutError):
            raw.recv(100)
        proxy.heal()
        raw.settimeout(30)
        assert raw.recv(100) == b"+PONG\r\n"
        assert server_clients(direct) == 1


def test_a_close_by_the_server_in_a_partition_is_seen_at_the_heal(proxy: TcpProxy, direct: redis.Redis) -> None:
    """The member sees a hung connection, not a closed one, until the heal."""
    with socket.create_connection(proxy.address, timeout=30) as raw:
        raw.sendall(resp(b"CLIENT", b"SETNAME", b"victim"))
        assert raw.recv(100) == b"+OK\r\n"
        (victim,) = [c["id"] for c in direct.client_list(_type="normal") if c["name"] == "victim"]
        proxy.partition()
        assert direct.client_kill_filter(_id=victim) == 1
        raw.settimeout(0.3)
        with pytest.raises(TimeoutError):  # hangs
            raw.recv(100)
        proxy.heal()
        raw.settimeout(30)
        assert raw.recv(100) == b""  # then closed


def test_partition_and_heal_are_idempotent(proxy: TcpProxy) -> None:
    with through(proxy) as client:
        proxy.heal()
        assert client.ping()
        proxy.partition()
        proxy.partition()
        assert proxy.partitioned
        proxy.heal()
        proxy.heal()
        assert not proxy.partitioned
        assert client.ping()
        proxy.partition()
        proxy.heal()
        assert client.ping()


def test_close_stops_everything_and_frees_the_port(redis_server: RedisServer) -> None:
    proxy = TcpProxy("127.0.0.1", redis_server.port).start()
    port = proxy.port
    client = through(proxy)
    assert client.ping()
    proxy.partition()  # closed while partitioned: still closes every socket
    proxy.close()
    proxy.close()
    assert not [t for t in threading.enumerate() if t.name == f"tcp-proxy-{port}"]  # joined
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=30).close()
    with TcpProxy("127.0.0.1", redis_server.port, listen_port=port) as again, through(again) as client2:
        assert again.port == port
        assert client2.ping()
    with pytest.raises(RuntimeError, match="closed"):
        proxy.start()


def test_close_before_start_and_the_context_manager(redis_server: RedisServer) -> None:
    idle = TcpProxy("127.0.0.1", redis_server.port)
    with pytest.raises(RuntimeError, match="not started"):
        idle.port  # noqa: B018
    idle.close()
    idle.close()
    with TcpProxy("127.0.0.1", redis_server.port) as proxy:
        assert "forwarding" in repr(proxy)
        with pytest.raises(RuntimeError, match="already started"):
            proxy.start()
    assert "closed" in repr(proxy)


def test_two_proxies_are_independent(proxy: TcpProxy, redis_server: RedisServer, direct: redis.Redis) -> None:
    with TcpProxy("127.0.0.1", redis_server.port) as other:
        assert other.port != proxy.port
        cut = through(proxy, socket_timeout=0.5)
        fine = through(other, socket_timeout=30)
        assert cut.ping() and fine.ping()
        proxy.partition()
        assert not other.partitioned
        for i in range(100):
            assert fine.incr("other") == i + 1
        with pytest.raises(redis.TimeoutError):
            cut.get("other")
        proxy.heal()
        other.partition()
        with through(proxy) as healed:
            assert healed.get("other") == b"100"
        other.heal()
        assert fine.get("other") == b"100"
        cut.close()
        fine.close()


def test_a_target_that_refuses_closes_the_client_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        port = reserved.getsockname()[1]
    # nothing listens on ``port`` now
    with TcpProxy("127.0.0.1", port) as proxy, socket.create_connection(proxy.address, timeout=30) as raw:
        assert raw.recv(100) == b""
        wait_for(lambda: proxy.connections == 0, 30, "the refused connection dropped")
