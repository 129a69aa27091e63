"""Lua scripts of the Redis Streams source (see the key layout in the
package docstring).  Every script touches keys of one hash tag only, so
each runs on one Cluster slot."""

from __future__ import annotations

# Server time in ms, for store timestamps and member/lease expiry.
_NOW = """
local __t = redis.call('TIME')
local now = tonumber(__t[1]) * 1000 + math.floor(tonumber(__t[2]) / 1000)
"""

#: Lua: ``append_first(seq, log, n, first, field, value, ...)`` stores the
#: first of ``n`` messages of a queue whose offsets ``first``... were just
#: reserved (INCRBY on ``seq``), at stream id ``"<first+1>-0"``, and
#: returns the first offset used.  When the stream already holds a higher
#: id (an entry lite_push did not write: a raw ``XADD``, whose ``*`` id is
#: the time in ms), XADD refuses the id; then ``seq`` is moved past the
#: stream's last id (its millisecond part ``top``: the messages take
#: offsets ``top``, ``top+1``, ..., ids ``"<top+1>-0"``...), so offsets stay
#: unique and increasing and every later send succeeds.  The hot path costs
#: nothing more: the XADD is tried first (``redis.pcall``).  Ids past 2^53
#: (no exact Lua number) are refused with an error naming the stream.
APPEND_FIRST = """
local function append_first(seq, log, n, first, ...)
  local r = redis.pcall('XADD', log, string.format('%d-0', first + 1), ...)
  if type(r) ~= 'table' or not r.err then return first end
  local info = redis.call('XINFO', 'STREAM', log)
  local last = ''
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
  local top = tonumber(string.match(last, '^(%d+)-'))
  if top == nil or top <= first then error(r) end
  if top + n >= 9007199254740992 then
    error({err = 'ERR lite_push: stream ' .. log .. ' holds id ' .. last .. ': no offsets above it (2^53)'})
  end
  redis.call('SET', seq, string.format('%d', top + n))
  redis.call('XADD', log, string.format('%d-0', top + 1), ...)
  return top
end
"""

#: Append messages to one queue.  KEYS: seq, stream.  ARGV: n, notify
#: channel, then n pairs (body, meta).  Offsets are INCRBY'd atomically;
#: stream id = offset+1 "-0" (past a foreign entry: :data:`APPEND_FIRST`).
#: Returns {first offset, store ms}.
SEND = (
    _NOW
    + APPEND_FIRST
    + """
local n = tonumber(ARGV[1])
local s = string.format('%d', now)
local first = redis.call('INCRBY', KEYS[1], n) - n
if n < 1 then return {first, s} end
first = append_first(KEYS[1], KEYS[2], n, first, 'b', ARGV[3], 'm', ARGV[4], 's', s)
for i = 1, n - 1 do
  redis.call('XADD', KEYS[2], string.format('%d-0', first + i + 1), 'b', ARGV[3 + 2 * i], 'm', ARGV[4 + 2 * i], 's', s)
end
redis.call('PUBLISH', ARGV[2], '')
return {first, s}
"""
)

#: The offset the next message of a queue gets.  KEYS: seq, stream.  Its
#: seq, unless a foreign entry (see :data:`APPEND_FIRST`) lies above it and
#: no send moved seq past it yet: then one past the top entry's offset.  The
#: usual case reads one empty range (no entry is copied).
QUEUE_END = """
local seq = tonumber(redis.call('GET', KEYS[1]) or '0')
if #redis.call('XRANGE', KEYS[2], string.format('%d-0', seq + 1), '+', 'COUNT', 1) == 0 then return seq end
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
return tonumber(string.match(top[1][1], '^(%d+)-'))
"""

#: Move due delayed retries to the retry stream.  KEYS: schedule zset,
#: bodies hash, metas hash, seq, stream.  ARGV: now ms (the broker clock's
#: time), limit, notify channel.  Returns {moved, next due score or -1}.
#: Each copy is stored as SEND stores a message (:data:`APPEND_FIRST`).
MOVE_DUE = (
    _NOW
    + APPEND_FIRST
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, id in ipairs(due) do
  local body = redis.call('HGET', KEYS[2], id)
  local meta = redis.call('HGET', KEYS[3], id)
  if body and meta then
    local off = redis.call('INCR', KEYS[4]) - 1
    append_first(KEYS[4], KEYS[5], 1, off, 'b', body, 'm', meta, 's', string.format('%d', now))
    moved = moved + 1
  end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
if moved > 0 then redis.call('PUBLISH', ARGV[3], '') end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return {moved, '-1'} end
return {moved, nxt[2]}
"""
)

#: Heartbeat / join.  KEYS: members zset, subs hash, version, beats hash,
#: owner keys...  ARGV: cid, ttl ms, subscriptions json, channel.  Drops
#: expired members, (re)adds the caller, records when (for ``group
#: describe``), bumps the version and publishes on a change, renews the
#: caller's owner keys.  Returns {version, {1|0 per owner key}, subs}.
HEARTBEAT = (
    _NOW
    + """
local cid = ARGV[1]
local ttl = tonumber(ARGV[2])
local changed = false
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, m in ipairs(dead) do
  if m ~= cid then
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
    redis.call('HDEL', KEYS[4], m)
    changed = true
  end
end
if redis.call('ZADD', KEYS[1], now + ttl, cid) == 1 then changed = true end
redis.call('HSET', KEYS[4], cid, now)
if redis.call('HGET', KEYS[2], cid) ~= ARGV[3] then
  redis.call('HSET', KEYS[2], cid, ARGV[3])
  changed = true
end
if changed then
  redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', ARGV[4], 'members')
end
local owned = {}
for i = 5, #KEYS do
  if redis.call('GET', KEYS[i]) == cid then
    redis.call('PEXPIRE', KEYS[i], ttl)
    owned[#owned + 1] = 1
  else
    owned[#owned + 1] = 0
  end
end
return {redis.call('GET', KEYS[3]) or '0', owned, redis.call('HGETALL', KEYS[2])}
"""
)

#: Take queues.  KEYS: owner keys.  ARGV: cid, ttl ms.  A key is taken when
#: free (or already the caller's).  Returns {1|0 per key}.
ACQUIRE = """
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if not v or v == ARGV[1] then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', tonumber(ARGV[2]))
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

#: Compare-and-delete keys held by the caller, then bump the version.
#: KEYS: version, keys...  ARGV: cid, channel.  Returns how many were deleted.
RELEASE = """
local n = 0
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
redis.call('INCR', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return n
"""

#: Leave the group.  KEYS: members, subs, version, beats, owner/lock keys...
#: ARGV: cid, channel.
LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
for i = 5, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[2], 'left')
return 1
"""

#: Commit offsets of owned queues.  KEYS: offsets hash, owner keys...
#: ARGV: cid, then per owner key: field, value.  Returns how many were stored.
COMMIT = """
local n = 0
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('HSET', KEYS[1], ARGV[2 * i - 2], ARGV[2 * i - 1])
    n = n + 1
  end
end
return n
"""

#: Take or renew queue locks.  KEYS: lock keys.  ARGV: cid, lease ms.
#: Returns {1|0 per key}.
LOCK = ACQUIRE

#: Release the caller's locks.  KEYS: lock keys.  ARGV: cid.
UNLOCK = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
"""

#: Store delayed retries.  KEYS: schedule zset, bodies hash, metas hash.
#: ARGV: per copy: id, due ms, body, meta.
SCHEDULE = """
for i = 1, #ARGV, 4 do
  redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 3])
end
return #ARGV / 4
"""

#: Record the group's balance (QUEUE or MESSAGE) as a member joins.
#: KEYS: members zset, balance key.  ARGV: cid, balance, ttl ms.  When
#: another member whose session lives recorded the other balance, nothing
#: changes and the recorded one is returned; else the caller's is recorded,
#: the caller is added to the members (so a later joiner sees it at once),
#: and its own is returned.
CLAIM_BALANCE = (
    _NOW
    + """
local b = redis.call('GET', KEYS[2])
if b and b ~= ARGV[2] then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for _, m in ipairs(live) do
    if m ~= ARGV[1] then return b end
  end
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return ARGV[2]
"""
)

#: Raise stored positions, never lower them (message-grain members copy
#: their queues' committed positions here; a member's copy may be older
#: than another's).  KEYS: offsets hash.  ARGV: field, offset, ...
RAISE_POSITIONS = """
for i = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if not old or tonumber(cjson.decode(old)[1]) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], '[' .. ARGV[i + 1] .. ',""]')
  end
end
return 1
"""
