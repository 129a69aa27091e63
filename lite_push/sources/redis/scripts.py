"""Lua scripts of the Redis Streams source (see the key layout in the
package docstring).  Every script touches keys of one hash tag only, so
each runs on one Cluster slot."""

from __future__ import annotations

# Server time in ms, for store timestamps and member/lease expiry.
_NOW = """
local __t = redis.call('TIME')
local now = tonumber(__t[1]) * 1000 + math.floor(tonumber(__t[2]) / 1000)
"""

#: Append messages to one queue.  KEYS: seq, stream.  ARGV: n, notify
#: channel, then n pairs (body, meta).  Offsets are INCRBY'd atomically; stream id = offset+1 "-0".
#: Returns {first offset, store ms}.
SEND = (
    _NOW
    + """
local n = tonumber(ARGV[1])
local first = redis.call('INCRBY', KEYS[1], n) - n
for i = 0, n - 1 do
  redis.call('XADD', KEYS[2], string.format('%d-0', first + i + 1),
             'b', ARGV[3 + 2 * i], 'm', ARGV[4 + 2 * i], 's', string.format('%d', now))
end
redis.call('PUBLISH', ARGV[2], '')
return {first, string.format('%d', now)}
"""
)

#: Move due delayed retries to the retry stream.  KEYS: schedule zset,
#: bodies hash, metas hash, seq, stream.  ARGV: now ms (the broker clock's
#: time), limit, notify channel.  Returns {moved, next due score or -1}.
MOVE_DUE = (
    _NOW
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, id in ipairs(due) do
  local body = redis.call('HGET', KEYS[2], id)
  local meta = redis.call('HGET', KEYS[3], id)
  if body and meta then
    local off = redis.call('INCR', KEYS[4]) - 1
    redis.call('XADD', KEYS[5], string.format('%d-0', off + 1), 'b', body, 'm', meta, 's', string.format('%d', now))
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

#: Heartbeat / join.  KEYS: members zset, subs hash, version, owner keys...
#: ARGV: cid, ttl ms, subscriptions json, channel.  Drops expired members,
#: (re)adds the caller, bumps the version and publishes on a change, renews
#: the caller's owner keys.  Returns {version, {1|0 per owner key}, subs}.
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
    changed = true
  end
end
if redis.call('ZADD', KEYS[1], now + ttl, cid) == 1 then changed = true end
if redis.call('HGET', KEYS[2], cid) ~= ARGV[3] then
  redis.call('HSET', KEYS[2], cid, ARGV[3])
  changed = true
end
if changed then
  redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', ARGV[4], 'members')
end
local owned = {}
for i = 4, #KEYS do
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

#: Leave the group.  KEYS: members, subs, version, owner/lock keys...
#: ARGV: cid, channel.
LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
for i = 4, #KEYS do
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
