"""The project starts its own Redis: a server on a free loopback port, stopped
by its PID, that keeps acknowledged writes across a restart; and a
three-master cluster."""

from __future__ import annotations

import os

import pytest
import redis

from lite_push.sources.redis_server import RedisCluster, RedisServer, RedisServerError, free_port


def test_server_on_loopback_survives_restart_and_stops_by_pid(tmp_path):
    server = RedisServer(data_dir=tmp_path / "data")
    with server:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        assert client.ping()
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        client.xadd("s", {"n": "1"})
        pid = server.pid
        server.restart()  # AOF with fsync always: nothing acknowledged is lost
        assert server.pid != pid
        client = redis.Redis(host="127.0.0.1", port=server.port)
        assert client.xlen("s") == 1
        client.close()
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (tmp_path / "data").exists()  # a given directory is kept


def test_missing_executable_is_a_clear_error():
    with pytest.raises(RedisServerError, match="not found"):
        RedisServer(executable="no-such-redis-server")


def test_port_already_taken_fails_with_the_log(tmp_path):
    with RedisServer() as first:
        second = RedisServer(port=first.port, start_timeout=3)
        with pytest.raises(RedisServerError, match="did not start"):
            second.start()
    assert free_port() > 0


def test_three_master_cluster_serves_keys_on_every_slot():
    with RedisCluster(3) as cluster:
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        for i in range(30):
            client.set(f"k{i}", i)
        assert [int(client.get(f"k{i}")) for i in range(30)] == list(range(30))
        # keys spread over the three masters
        assert len({client.keyslot(f"k{i}") // 5462 for i in range(30)}) == 3
        client.close()
