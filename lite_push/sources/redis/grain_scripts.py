"""Lua scripts of message-grain balancing (``Balance.MESSAGE``) on Redis.

Every script touches the keys of one queue only (the queue's hash tag), so
each runs on one Cluster slot.  The keys, per group ``g`` and queue, all
``ns:{<topic>#<q>}:mg:<g>:<what>`` (see :func:`grain_keys`):

  cur    string  the next offset no member has looked at yet
  out    zset    offset -> offset: outstanding messages (delivered and not
                 acknowledged, or parked); the group's committed position
                 is the lowest of them, else ``cur``
  who    hash    offset -> token of the member it is delivered to
  key    hash    offset -> its key (the message's ``keys``; ``""`` for a
                 keyless or unreadable one: those are held by queue)
  hold   hash    key -> token of the member holding it
  cnt    hash    key -> how many of its messages its holder has
                 unacknowledged
  live   zset    token -> session expiry (server ms)
  park   zset    offset -> offset: outstanding, not delivered (its key was
                 held by another member, or its member's session lapsed)

A token is ``<client id>/<generation>``: a member that finds itself
evicted joins again with a new one, so nothing of its old session is ever
taken for its new one.

The rules: a parked or new message goes to the member asking when its key
is free or already that member's, else it is parked; parked messages are
served first and in offset order, and the cursor moves only once every
parked message was looked at, so a key's messages are delivered in offset
order.  A key is freed when its count reaches 0 (its holder acknowledged
every one delivered to it; its parked messages then go, in order, to
whoever asks next), or when its holder's session lapses: then its
delivered messages are parked again (reclaimed) and go, in offset order, to
whoever asks next.
"""

from __future__ import annotations

__all__ = ["ACK", "DISPATCH", "GRAIN_KEYS", "POSITION", "QUIT", "RENEW", "RESYNC"]

#: The per-queue key names, in the order every script takes them.
GRAIN_KEYS = ("log", "cur", "out", "who", "key", "hold", "cnt", "live", "park")

_NOW = """
local __t = redis.call('TIME')
local now = tonumber(__t[1]) * 1000 + math.floor(tonumber(__t[2]) / 1000)
"""

# Park the delivered messages of the tokens in set ``d`` and free their keys.
_RECLAIM = """
local function reclaim(d)
  local w = redis.call('HGETALL', KEYS[4])
  for i = 1, #w, 2 do
    if d[w[i + 1]] then
      redis.call('HDEL', KEYS[4], w[i])
      redis.call('ZADD', KEYS[9], tonumber(w[i]), w[i])
    end
  end
  local h = redis.call('HGETALL', KEYS[6])
  for i = 1, #h, 2 do
    if d[h[i + 1]] then
      redis.call('HDEL', KEYS[6], h[i])
      redis.call('HDEL', KEYS[7], h[i])
    end
  end
end
"""

# The group's committed position: the lowest outstanding offset, else cur.
_BASE = """
local function base()
  local lo = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if #lo > 0 then return tonumber(lo[2]) end
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
"""

# A delivered message is acknowledged: free its key when its holder has
# none of it left unacknowledged.
_DONE = """
local function done(o)
  redis.call('HDEL', KEYS[4], o)
  redis.call('ZREM', KEYS[3], o)
  local k = redis.call('HGET', KEYS[5], o)
  redis.call('HDEL', KEYS[5], o)
  if k then
    if redis.call('HINCRBY', KEYS[7], k, -1) <= 0 then
      redis.call('HDEL', KEYS[7], k)
      redis.call('HDEL', KEYS[6], k)
    end
  end
end
"""

#: Renew the caller's session and deliver up to ``want`` messages.
#: KEYS: GRAIN_KEYS.  ARGV: token, ttl ms, want, scan limit, park limit,
#: tag filter ("" = every tag, else the tags joined by "\\n"), join ("1":
#: the caller joins with this token), start offset (the cursor of a queue
#: the group has never read).  Reclaims every lapsed session first.
#: Returns {1, base, entries} (entries as XRANGE gives them, in offset
#: order), or {0, base, {}} when the caller's session lapsed (it must join
#: again with a new token).
DISPATCH = (
    _NOW
    + _RECLAIM
    + _BASE
    + _DONE
    + """
local tok = ARGV[1]
local want = tonumber(ARGV[3])
local scanmax = tonumber(ARGV[4])
local parkmax = tonumber(ARGV[5])
local dead = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now)
if #dead > 0 then
  local d = {}
  for _, t in ipairs(dead) do
    d[t] = true
    redis.call('ZREM', KEYS[8], t)
  end
  reclaim(d)
end
if ARGV[7] == '1' then
  redis.call('SETNX', KEYS[2], ARGV[8])
elseif not redis.call('ZSCORE', KEYS[8], tok) then
  return {0, base(), {}}
end
redis.call('ZADD', KEYS[8], now + tonumber(ARGV[2]), tok)
local filter = nil
if ARGV[6] ~= '' then
  filter = {}
  for t in string.gmatch(ARGV[6], '[^\\n]+') do filter[t] = true end
end
local holders = {}
local function holder(k)
  local h = holders[k]
  if h == nil then
    h = redis.call('HGET', KEYS[6], k)
    holders[k] = h
  end
  return h
end
local function give(o, k)
  redis.call('HSET', KEYS[4], o, tok)
  redis.call('HINCRBY', KEYS[7], k, 1)
  if holders[k] ~= tok then
    redis.call('HSET', KEYS[6], k, tok)
    holders[k] = tok
  end
end
local out = {}
local full = false
local parked = redis.call('ZRANGE', KEYS[9], 0, -1)
local nparked = #parked
local pkeys = {}
if nparked > 0 then pkeys = redis.call('HMGET', KEYS[5], unpack(parked)) end
for i, o in ipairs(parked) do
  local k = pkeys[i] or ''
  local h = holder(k)
  if h == false or h == tok then
    if #out >= want then
      full = true
      break
    end
    local id = string.format('%d-0', tonumber(o) + 1)
    local e = redis.call('XRANGE', KEYS[1], id, id)
    if #e == 0 then  -- trimmed away: nothing to deliver
      redis.call('ZREM', KEYS[3], o)
      redis.call('ZREM', KEYS[9], o)
      redis.call('HDEL', KEYS[5], o)
    else
      redis.call('ZREM', KEYS[9], o)
      nparked = nparked - 1
      give(o, k)
      out[#out + 1] = e[1]
    end
  end
end
if not full and #out < want and nparked < parkmax then
  local cur = tonumber(redis.call('GET', KEYS[2]))
  local entries = redis.call('XRANGE', KEYS[1], string.format('%d-0', cur + 1), '+', 'COUNT', scanmax)
  for _, e in ipairs(entries) do
    if #out >= want or nparked >= parkmax then break end
    local off = tonumber(string.match(e[1], '^(%d+)')) - 1
    local o = string.format('%d', off)
    local meta = nil
    local f = e[2]
    for j = 1, #f, 2 do
      if f[j] == 'm' then meta = f[j + 1] end
    end
    local k = ''
    local tag = nil
    if meta then
      local ok, m = pcall(cjson.decode, meta)
      if ok and type(m) == 'table' then
        if type(m['k']) == 'string' then k = m['k'] end
        if type(m['t']) == 'string' then tag = m['t'] end
      end
    end
    if filter == nil or (tag ~= nil and filter[tag]) then
      redis.call('ZADD', KEYS[3], off, o)
      redis.call('HSET', KEYS[5], o, k)
      local h = holder(k)
      if h == false or h == tok then
        give(o, k)
        out[#out + 1] = e
      else
        redis.call('ZADD', KEYS[9], off, o)
        nparked = nparked + 1
      end
    end
    cur = off + 1
  end
  redis.call('SET', KEYS[2], string.format('%d', cur))
end
return {1, base(), out}
"""
)

#: Acknowledge messages delivered to the caller (others' are ignored: a
#: lapsed session's acknowledgements are fenced).  KEYS: GRAIN_KEYS.
#: ARGV: token, offsets...  Returns {how many were acknowledged, base,
#: 1 if the caller's session is live else 0}.
ACK = (
    _NOW
    + _BASE
    + _DONE
    + """
local tok = ARGV[1]
local n = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[4], ARGV[i]) == tok then
    done(ARGV[i])
    n = n + 1
  end
end
local exp = redis.call('ZSCORE', KEYS[8], tok)
local live = 0
if exp and tonumber(exp) > now then live = 1 end
return {n, base(), live}
"""
)

#: Renew the caller's session (a paused queue is not dispatched).
#: KEYS: GRAIN_KEYS.  ARGV: token, ttl ms.  Returns 1, or 0 when it lapsed.
RENEW = (
    _NOW
    + """
local exp = redis.call('ZSCORE', KEYS[8], ARGV[1])
if not exp or tonumber(exp) <= now then return 0 end
redis.call('ZADD', KEYS[8], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

#: Leave the queue: the caller's delivered messages are parked, its keys
#: freed (at once: it closes after its listener calls ended).
#: KEYS: GRAIN_KEYS.  ARGV: token.
QUIT = (
    _RECLAIM
    + """
redis.call('ZREM', KEYS[8], ARGV[1])
local d = {}
d[ARGV[1]] = true
reclaim(d)
return 1
"""
)

#: The group's committed position of the queue (-1: never read).
#: KEYS: GRAIN_KEYS.
POSITION = (
    _BASE
    + """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
return base()
"""
)

#: After a lost reply: the messages delivered to the caller that it does not
#: know of (a DISPATCH it never heard back from).  KEYS: GRAIN_KEYS.
#: ARGV: token, the offsets it knows...  Returns {1 if its session is live
#: else 0, their entries in offset order}.  One trimmed away meanwhile is
#: acknowledged (there is nothing to deliver).
RESYNC = (
    _NOW
    + _DONE
    + """
local known = {}
for i = 2, #ARGV do known[ARGV[i]] = true end
local w = redis.call('HGETALL', KEYS[4])
local mine = {}
for i = 1, #w, 2 do
  if w[i + 1] == ARGV[1] and not known[w[i]] then mine[#mine + 1] = tonumber(w[i]) end
end
table.sort(mine)
local out = {}
for _, off in ipairs(mine) do
  local id = string.format('%d-0', off + 1)
  local e = redis.call('XRANGE', KEYS[1], id, id)
  if #e == 0 then done(string.format('%d', off)) else out[#out + 1] = e[1] end
end
local exp = redis.call('ZSCORE', KEYS[8], ARGV[1])
local live = 0
if exp and tonumber(exp) > now then live = 1 end
return {live, out}
"""
)
