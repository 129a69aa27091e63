"""The ``lite_push`` Redis Function library: sending from any language.

A program in any language (or a shell with ``redis-cli``) stores a message
exactly as :meth:`RedisBroker.send <lite_push.sources.redis.RedisBroker.send>`
does by calling a function of this library with ``FCALL``:

``FCALL lite_push_send 0 <namespace> <topic> <key> <body> [<tags> [<name> <value>]...]``
    The queue is chosen by the key as lite_push chooses it
    (``lane_of(key, queue_count)``: Java's ``String.hashCode`` over the
    key's UTF-16 code units, ``floorMod`` the topic's queue count, which it
    reads from ``<namespace>:topics``); an empty key goes round robin (a
    counter per topic, ``<namespace>:rr:<topic>``).  Tags and property
    pairs are optional (``""``: no tags).  Returns ``[queue, offset]``.
    It touches keys it is not given, so it is refused on Redis Cluster
    (flag ``no-cluster``).
``FCALL lite_push_send_queue 2 <seq key> <log key> <namespace> <topic> <key> <body> [<tags> [<name> <value>]...]``
    The same, to the queue whose two keys the caller names
    (``<namespace>:{<topic>#<queue>}:seq`` and ``...:log``, checked): the
    form for Redis Cluster, where a function may touch only the keys it
    is given.  Returns ``[queue, offset]``.
``FCALL_RO lite_push_queue 0 <key> <queue count>``
    The queue ``lite_push_send`` picks for ``key`` (read-only, no keys:
    any node of a cluster answers).
``FCALL_RO lite_push_version 0``
    The library's version (:data:`LIBRARY_VERSION`).

Each send is what the SEND script does for one message: ``INCRBY`` the
queue's ``seq``, ``XADD`` the entry at id ``"<offset+1>-0"`` with fields
``b`` (the body), ``m`` (``{"bt":<ms>,"k":..,"t":..,"p":{..}}``: the born
time is the server's ``TIME`` here) and ``s`` (the store time, the
server's ``TIME``), moving past a foreign entry as SEND does
(``scripts.APPEND_FIRST``), then ``PUBLISH <namespace>:notify:<topic>`` so
waiting consumers wake.  Keys, tags and properties must be UTF-8
(lite_push reads the metadata as JSON).  A body may have any bytes; the
broker's ``max_message_size`` is not known here and not enforced.

Loading (:class:`FunctionLoader`): a broker loads the library the first
time it reads a topic from Redis (creating one, sending, subscribing), with
``FUNCTION LOAD REPLACE``, unless the server has it at this version or a
newer one (``lite_push_version``), so brokers of different lite_push
versions do not take turns replacing it: the newest stays.  A version only
ever adds functions or optional arguments, so an older lite_push is served
by a newer library.  On a cluster every primary gets it.  A server without
functions (Redis before 7.0) or a user not allowed to load them is told
once at WARNING; lite_push itself never calls the library.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from redis.exceptions import ResponseError

from . import scripts

__all__ = ["LIBRARY", "LIBRARY_NAME", "LIBRARY_VERSION", "FunctionLoader"]

logger = logging.getLogger(__name__)

#: The library's name (``FUNCTION LIST LIBRARYNAME lite_push``).
LIBRARY_NAME = "lite_push"

#: Bumped with every change of :data:`LIBRARY` (a test pins its text).
LIBRARY_VERSION = 1

_LUA = r"""
local VERSION = @VERSION@

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
@APPEND_FIRST@
-- Java's String.hashCode of a UTF-8 string, over its UTF-16 code units, as
-- an unsigned 32-bit number; nil when the string is not UTF-8.
local function java_hash(s)
  local h, i, n = 0, 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local cp, len
    if c < 0x80 then cp, len = c, 1
    elseif c >= 0xC2 and c < 0xE0 then cp, len = c - 0xC0, 2
    elseif c >= 0xE0 and c < 0xF0 then cp, len = c - 0xE0, 3
    elseif c >= 0xF0 and c < 0xF5 then cp, len = c - 0xF0, 4
    else return nil end
    if i + len - 1 > n then return nil end
    for j = i + 1, i + len - 1 do
      local b = string.byte(s, j)
      if b < 0x80 or b > 0xBF then return nil end
      cp = cp * 64 + (b - 0x80)
    end
    if (len == 3 and cp < 0x800) or (len == 4 and (cp < 0x10000 or cp > 0x10FFFF))
        or (cp >= 0xD800 and cp <= 0xDFFF) then
      return nil
    end
    if cp >= 0x10000 then
      cp = cp - 0x10000
      h = (31 * h + 0xD800 + math.floor(cp / 1024)) % 4294967296
      h = (31 * h + 0xDC00 + cp % 1024) % 4294967296
    else
      h = (31 * h + cp) % 4294967296
    end
    i = i + len
  end
  return h
end

-- lane_of(key, n): floorMod of the signed hash.
local function queue_of(name, key, n)
  local h = java_hash(key)
  if h == nil then error({err = 'ERR ' .. name .. ': the key is not UTF-8'}) end
  if h >= 2147483648 then h = h - 4294967296 end
  return h % n
end

local function utf8(name, what, s)
  if java_hash(s) == nil then error({err = 'ERR ' .. name .. ': ' .. what .. ' is not UTF-8'}) end
end

-- The m field of a message: {"bt":..,"k":..,"t":..,"p":{..}}, the layout
-- RedisBroker.send writes (the message-grain scripts read "k" from it).
local function meta_of(name, now, key, args)
  local m = '{"bt":' .. string.format('%d', now)
  if key ~= '' then m = m .. ',"k":' .. cjson.encode(key) end
  local tags = args[5] or ''
  utf8(name, 'the tags', tags)
  if tags ~= '' then m = m .. ',"t":' .. cjson.encode(tags) end
  if #args > 5 then
    local p = {}
    for i = 6, #args, 2 do
      utf8(name, 'a property', args[i])
      utf8(name, 'a property', args[i + 1])
      if args[i] == 'RECONSUME_TIME' and not string.match(args[i + 1], '^%d+$') then
        error({err = 'ERR ' .. name .. ': property RECONSUME_TIME must be a decimal integer >= 0'})
      end
      p[#p + 1] = cjson.encode(args[i]) .. ':' .. cjson.encode(args[i + 1])
    end
    m = m .. ',"p":{' .. table.concat(p, ',') .. '}'
  end
  return m .. '}'
end

local function check_args(name, args, form)
  if #args < 4 or (#args > 5 and #args % 2 == 0) then
    error({err = 'ERR ' .. name .. ': expected ' .. form .. ' <namespace> <topic> <key> <body> '
      .. '[<tags> [<property> <value>]...]'})
  end
end

-- One message stored as SEND stores it; returns its offset.
local function store(seq, log, channel, body, meta, now)
  local first = redis.call('INCRBY', seq, 1) - 1
  first = append_first(seq, log, 1, first, 'b', body, 'm', meta, 's', string.format('%d', now))
  redis.call('PUBLISH', channel, '')
  return first
end

local function send(keys, args)
  local name = 'lite_push_send'
  if #keys ~= 0 then
    error({err = 'ERR lite_push_send takes no keys (numkeys 0); on Redis Cluster use lite_push_send_queue'})
  end
  check_args(name, args, 'FCALL lite_push_send 0')
  local ns, topic, key = args[1], args[2], args[3]
  local count = tonumber(redis.call('HGET', ns .. ':topics', topic) or '')
  if count == nil then
    error({err = 'ERR lite_push_send: no topic ' .. topic .. ' in namespace ' .. ns .. ' (create it first)'})
  end
  local q
  if key ~= '' then
    q = queue_of(name, key, count)
  else
    q = (redis.call('INCR', ns .. ':rr:' .. topic) - 1) % count
  end
  local now = server_now()
  local meta = meta_of(name, now, key, args)
  local prefix = ns .. ':{' .. topic .. '#' .. string.format('%d', q) .. '}:'
  return {q, store(prefix .. 'seq', prefix .. 'log', ns .. ':notify:' .. topic, args[4], meta, now)}
end

local function send_queue(keys, args)
  local name = 'lite_push_send_queue'
  check_args(name, args, 'FCALL lite_push_send_queue 2 <seq key> <log key>')
  local ns, topic, key = args[1], args[2], args[3]
  local prefix = ns .. ':{' .. topic .. '#'
  local q = nil
  if #keys == 2 and string.sub(keys[1], 1, #prefix) == prefix then
    q = string.match(string.sub(keys[1], #prefix + 1), '^(%d+)}:seq$')
  end
  if q == nil or keys[2] ~= prefix .. q .. '}:log' then
    error({err = 'ERR lite_push_send_queue: the keys must be ' .. prefix .. '<queue>}:seq and ' .. prefix
      .. '<queue>}:log (numkeys 2)'})
  end
  local now = server_now()
  local meta = meta_of(name, now, key, args)
  return {tonumber(q), store(keys[1], keys[2], ns .. ':notify:' .. topic, args[4], meta, now)}
end

local function queue(keys, args)
  local n = tonumber(args[2] or '')
  if #args ~= 2 or n == nil or n < 1 or n ~= math.floor(n) then
    error({err = 'ERR lite_push_queue: expected FCALL_RO lite_push_queue 0 <key> <queue count >= 1>'})
  end
  return queue_of('lite_push_queue', args[1], n)
end

redis.register_function{function_name = 'lite_push_send', callback = send, flags = {'no-cluster'}}
redis.register_function{function_name = 'lite_push_send_queue', callback = send_queue}
redis.register_function{function_name = 'lite_push_queue', callback = queue, flags = {'no-writes'}}
redis.register_function{
  function_name = 'lite_push_version', callback = function() return VERSION end, flags = {'no-writes'}
}
"""

#: The library's source, as ``FUNCTION LOAD`` takes it.
LIBRARY = f"#!lua name={LIBRARY_NAME}\n" + _LUA.replace("@VERSION@", str(LIBRARY_VERSION)).replace(
    "@APPEND_FIRST@", scripts.APPEND_FIRST
)


class FunctionLoader:
    """Loads :data:`LIBRARY` into ``client``'s server (every primary of a
    cluster) once: :meth:`ensure`.  Thread-safe; a failed attempt that was
    not the server's answer (a connection error) is tried again next time."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        """Whether :meth:`ensure` ran to its end (loaded, found, or told)."""
        return self._done

    def ensure(self) -> None:
        """Load the library unless the server has this version or a newer
        one.  Raises what the client raises for a connection failure; a
        server that refuses (no functions, no permission) is logged once."""
        if self._done:
            return
        with self._lock:
            if self._done:
                return
            client = self._client
            nodes: list[Any] = [None]
            if isinstance(client, redis.RedisCluster):  # FUNCTION LOAD is per node
                nodes = client.get_primaries()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            try:
                for node in nodes:
                    self._ensure_on(node)
            except ResponseError as e:
                logger.warning(
                    "the Redis function library %r could not be loaded (%s): FCALL lite_push_send is not "
                    "available (it needs Redis 7.0 and the right to FUNCTION LOAD); lite_push itself works",
                    LIBRARY_NAME,
                    e,
                )
            self._done = True

    def _ensure_on(self, node: Any) -> None:
        target = {} if node is None else {"target_nodes": node}
        try:
            have = int(self._client.execute_command("FCALL_RO", "lite_push_version", 0, **target))
        except ResponseError as e:
            if "function not found" not in str(e).lower():
                raise
            have = 0
        if have >= LIBRARY_VERSION:
            return
        self._client.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY, **target)
        logger.info("loaded the Redis function library %r version %d", LIBRARY_NAME, LIBRARY_VERSION)
