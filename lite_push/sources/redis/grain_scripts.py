"""Lua scripts of message-grain balancing (``Balance.MESSAGE``) on Redis.

Every script touches the keys of one queue only (the queue's hash tag), so
each runs on one Cluster slot.  The keys, per group ``g`` and queue, all
``ns:{<topic>#<q>}:mg:<g>:<what>`` but the first (see
:func:`~.message_grain.grain_keys`), in the order of :data:`GRAIN_KEYS`:

  log    the queue's stream (``ns:{<topic>#<q>}:log``)
  cur    string  the next offset no member has looked at yet, ``<n>``; a
                 scan goes on just after the id ``<n>-0`` (offset n - 1's),
                 so an entry added later with its millisecond and a higher
                 sequence part (``<n>-N``, a raw ``XADD``) is looked at too.
                 After such an entry the cursor is its id, ``<n>-N``, until
                 the scan passes the next entry whose sequence part is 0
  base   string  the group's committed position: every offset below it is
                 acknowledged or was skipped (a tag filter); moved up
                 lazily past offsets that are no longer outstanding
  msg    hash    offset -> "<token>\\t<key>" for a message delivered to a
                 member and not acknowledged, "\\t<key>" for a parked one
                 (its key was held by another member, or its member's
                 session lapsed): the outstanding messages.  The key is the
                 message's ``keys`` ("" for a keyless or unreadable one:
                 those are held by queue)
  hold   hash    key -> "<token>\\t<count>": the member holding the key and
                 how many of its messages that member has unacknowledged
  live   zset    token -> session expiry (server ms)
  park   zset    offset -> offset: the parked messages, in order

A token is ``<client id>/<generation>``: a member that finds itself
evicted joins again with a new one, so nothing of its old session is ever
taken for its new one.

The rules: a parked or new message goes to the member asking when its key
is free or already that member's, else it is parked; parked messages are
served first and in offset order, and the cursor moves only once every
parked message was looked at, so a key's messages are delivered in offset
order.  A key is freed when its holder acknowledged every one delivered to
it (its parked messages then go, in order, to whoever asks next), or when
its holder's session lapses: then its delivered messages are parked again
(reclaimed) and go, in offset order, to whoever asks next.

Foreign entries (a raw ``XADD``; see :mod:`.codec`) go to whichever member
asks, whatever its tag filter, so that member dead-letters them: one whose
metadata is unreadable is outstanding like a keyless message (acknowledged
once its dead letter is stored); one whose id's sequence part is not 0
shares its offset with the entry before it, so it is delivered and never
recorded (``msg`` is keyed by offset).

Cost per message: a DISPATCH writes one hash field (and a key's hold once
per call, not per message); an ACK reads and deletes it (and a key's hold
once per call).  A message's key is read from its metadata with a string
match (the SEND layout: ``{"bt":..,"k":"..."``), decoded as JSON only when
that does not apply.
"""

from __future__ import annotations

__all__ = ["ACK", "DISPATCH", "GRAIN_KEYS", "POSITION", "QUIT", "RENEW", "RESYNC"]

#: The per-queue keys, in the order every script takes them.
GRAIN_KEYS = ("log", "cur", "base", "msg", "hold", "live", "park")

_NOW = """
local __t = redis.call('TIME')
local now = tonumber(__t[1]) * 1000 + math.floor(tonumber(__t[2]) / 1000)
"""

# Helpers: park the delivered messages of the tokens in set ``d`` and free
# their keys; move ``base`` past what is no longer outstanding (a few
# offsets one by one, else to the lowest outstanding one: offsets may have
# gaps, a foreign entry's id can be far above the offsets before it).
_COMMON = """
local function reclaim(d)
  local m = redis.call('HGETALL', KEYS[4])
  for i = 1, #m, 2 do
    local v = m[i + 1]
    local tab = string.find(v, '\\t', 1, true)
    if tab > 1 and d[string.sub(v, 1, tab - 1)] then
      redis.call('HSET', KEYS[4], m[i], string.sub(v, tab))
      redis.call('ZADD', KEYS[7], tonumber(m[i]), m[i])
    end
  end
  local h = redis.call('HGETALL', KEYS[5])
  for i = 1, #h, 2 do
    local v = h[i + 1]
    if d[string.sub(v, 1, string.find(v, '\\t', 1, true) - 1)] then redis.call('HDEL', KEYS[5], h[i]) end
  end
end
local function bulk(cmd, key, args)
  local step = 2000  -- even: pairs stay whole
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end
local function advance()
  local b = tonumber(redis.call('GET', KEYS[3]) or '0')
  local c = tonumber(string.match(redis.call('GET', KEYS[2]) or '0', '^(%d+)'))
  local start = b
  if redis.call('HLEN', KEYS[4]) == 0 then
    b = c
  else
    local stop = math.min(c, b + 64)
    while b < stop and redis.call('HEXISTS', KEYS[4], string.format('%d', b)) == 0 do b = b + 1 end
    if b == stop and b < c then  -- further on: the lowest outstanding offset (they are all >= base)
      b = c
      for _, o in ipairs(redis.call('HKEYS', KEYS[4])) do
        if tonumber(o) < b then b = tonumber(o) end
      end
    end
  end
  if b ~= start then redis.call('SET', KEYS[3], string.format('%d', b)) end
  return b
end
"""

#: Renew the caller's session and deliver up to ``want`` messages.
#: KEYS: GRAIN_KEYS.  ARGV: token, ttl ms, want, scan limit, park limit,
#: tag filter ("" = every tag, else the tags joined by "\\n"), join ("1":
#: the caller joins with this token), start offset (the cursor of a queue
#: the group has never read).  Reclaims every lapsed session first.
#: Returns {1, base, entries} (entries as XRANGE gives them, in offset
#: order), or {0, base, {}} when the caller's session lapsed (it must join
#: again with a new token).  Reads and writes go in bulk: one HMGET of the
#: holds and one HSET of the delivered messages per round of the scan.
DISPATCH = (
    _NOW
    + _COMMON
    + """
local tok = ARGV[1]
local want = tonumber(ARGV[3])
local scanmax = tonumber(ARGV[4])
local parkmax = tonumber(ARGV[5])
local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now)
if #dead > 0 then
  local d = {}
  for _, t in ipairs(dead) do
    d[t] = true
    redis.call('ZREM', KEYS[6], t)
  end
  reclaim(d)
end
if ARGV[7] == '1' then
  if redis.call('SETNX', KEYS[2], ARGV[8]) == 1 then redis.call('SET', KEYS[3], ARGV[8]) end
elseif not redis.call('ZSCORE', KEYS[6], tok) then
  return {0, advance(), {}}
end
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[2]), tok)
local filter = nil
if ARGV[6] ~= '' then
  filter = {}
  for t in string.gmatch(ARGV[6], '[^\\n]+') do filter[t] = true end
end
-- the holds read or changed by this call: key -> {token or false, count}
local holds = {}
local changed = {}
local function load_holds(ks)
  local missing = {}
  local seen = {}
  for _, k in ipairs(ks) do
    if holds[k] == nil and not seen[k] then
      seen[k] = true
      missing[#missing + 1] = k
    end
  end
  if #missing == 0 then return end
  local vals = redis.call('HMGET', KEYS[5], unpack(missing))
  for i, k in ipairs(missing) do
    local v = vals[i]
    if v then
      local tab = string.find(v, '\\t', 1, true)
      holds[k] = {string.sub(v, 1, tab - 1), tonumber(string.sub(v, tab + 1))}
    else
      holds[k] = {false, 0}
    end
  end
end
local mine = tok .. '\\t'
local out = {}
local sets = {}    -- HSET msg: offset, value, ...
local function take(o, k, e)
  local h = holds[k]
  h[1] = tok
  h[2] = h[2] + 1
  changed[k] = true
  sets[#sets + 1] = o
  sets[#sets + 1] = mine .. k
  out[#out + 1] = e
end
local full = false
local parked = redis.call('ZRANGE', KEYS[7], 0, -1)
local nparked = #parked
if nparked > 0 then
  local vals = redis.call('HMGET', KEYS[4], unpack(parked))
  local ks = {}
  for i = 1, nparked do ks[i] = string.sub(vals[i] or '\\t', 2) end
  load_holds(ks)
  local unparked = {}
  for i, o in ipairs(parked) do
    local k = ks[i]
    local h = holds[k]
    if h[1] == false or h[1] == tok then
      if #out >= want then
        full = true
        break
      end
      local id = string.format('%d-0', tonumber(o) + 1)
      local e = redis.call('XRANGE', KEYS[1], id, id)
      unparked[#unparked + 1] = o
      if #e == 0 then  -- trimmed away: nothing to deliver
        redis.call('HDEL', KEYS[4], o)
      else
        take(o, k, e[1])
      end
    end
  end
  nparked = nparked - #unparked
  bulk('ZREM', KEYS[7], unparked)
end
if not full and #out < want and nparked < parkmax then
  local after = redis.call('GET', KEYS[2])  -- the scan goes on just after this id
  local cur = tonumber(string.match(after, '^(%d+)'))
  if not string.find(after, '-', 1, true) then after = after .. '-0' end
  local scanned = 0
  local parks = {}  -- ZADD park: score, member, ...
  local parkvals = {}
  while #out < want and nparked < parkmax do
    -- read what is still wanted (a few more: some may be parked), up to the scan limit
    local count = math.min(want - #out + 8, scanmax - scanned)
    if count <= 0 then break end
    local entries = redis.call('XRANGE', KEYS[1], '(' .. after, '+', 'COUNT', count)
    scanned = scanned + #entries
    local ks = {}
    local tags = {}
    local foreign = {}
    for i, e in ipairs(entries) do
      local f = e[2]
      local meta = nil
      if f[3] == 'm' then
        meta = f[4]
      else
        for j = 1, #f, 2 do
          if f[j] == 'm' then meta = f[j + 1] end
        end
      end
      local k = nil
      if string.sub(e[1], -2) ~= '-0' then
        foreign[i] = 'id'
      elseif meta then
        k = string.match(meta, '^{"bt":%-?%d+,"k":"([^"\\\\]*)"')
        if k == nil or filter ~= nil then
          local ok, m = pcall(cjson.decode, meta)
          k = nil
          if ok and type(m) == 'table' then
            if type(m['k']) == 'string' then k = m['k'] end
            if type(m['t']) == 'string' then tags[i] = m['t'] end
          else
            foreign[i] = 'meta'
          end
        end
      else
        foreign[i] = 'meta'
      end
      ks[i] = k or ''
    end
    load_holds(ks)
    for i, e in ipairs(entries) do
      if #out >= want or nparked >= parkmax then break end
      local off = tonumber(string.match(e[1], '^(%d+)')) - 1
      local o = string.format('%d', off)
      if foreign[i] == 'id' then
        out[#out + 1] = e
      elseif foreign[i] or filter == nil or (tags[i] ~= nil and filter[tags[i]]) then
        local k = ks[i]
        local h = holds[k]
        if h[1] == false or h[1] == tok then
          take(o, k, e)
        else
          parks[#parks + 1] = off
          parks[#parks + 1] = o
          parkvals[#parkvals + 1] = o
          parkvals[#parkvals + 1] = '\\t' .. k
          nparked = nparked + 1
        end
      end
      cur = off + 1
      after = e[1]
    end
    if #entries < count then break end
  end
  bulk('ZADD', KEYS[7], parks)
  bulk('HSET', KEYS[4], parkvals)
  redis.call('SET', KEYS[2], string.sub(after, -2) == '-0' and string.format('%d', cur) or after)
end
bulk('HSET', KEYS[4], sets)
local hs = {}
for k in pairs(changed) do
  hs[#hs + 1] = k
  hs[#hs + 1] = mine .. holds[k][2]
end
bulk('HSET', KEYS[5], hs)
return {1, advance(), out}
"""
)

#: Acknowledge messages delivered to the caller (others' are ignored: a
#: lapsed session's acknowledgements are fenced).  KEYS: GRAIN_KEYS.
#: ARGV: token, offsets...  Returns {how many were acknowledged, base,
#: 1 if the caller's session is live else 0}.
ACK = (
    _NOW
    + _COMMON
    + """
local tok = ARGV[1]
local mine = tok .. '\\t'
local n = 0
local done = {}
local dels = {}
local vals = redis.call('HMGET', KEYS[4], unpack(ARGV, 2))
for i = 2, #ARGV do
  local v = vals[i - 1]
  if v and string.sub(v, 1, #mine) == mine then
    dels[#dels + 1] = ARGV[i]
    local k = string.sub(v, #mine + 1)
    done[k] = (done[k] or 0) + 1
    n = n + 1
  end
end
bulk('HDEL', KEYS[4], dels)
local ks = {}
for k in pairs(done) do ks[#ks + 1] = k end
if #ks > 0 then
  local hv = redis.call('HMGET', KEYS[5], unpack(ks))
  local free = {}
  local keep = {}
  for i, k in ipairs(ks) do
    local v = hv[i]
    if v and string.sub(v, 1, #mine) == mine then
      local c = tonumber(string.sub(v, #mine + 1)) - done[k]
      if c <= 0 then
        free[#free + 1] = k
      else
        keep[#keep + 1] = k
        keep[#keep + 1] = mine .. c
      end
    end
  end
  bulk('HDEL', KEYS[5], free)
  bulk('HSET', KEYS[5], keep)
end
local exp = redis.call('ZSCORE', KEYS[6], tok)
local live = 0
if exp and tonumber(exp) > now then live = 1 end
return {n, advance(), live}
"""
)

#: Renew the caller's session (a paused queue is not dispatched).
#: KEYS: GRAIN_KEYS.  ARGV: token, ttl ms.  Returns 1, or 0 when it lapsed.
RENEW = (
    _NOW
    + """
local exp = redis.call('ZSCORE', KEYS[6], ARGV[1])
if not exp or tonumber(exp) <= now then return 0 end
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

#: Leave the queue: the caller's delivered messages are parked, its keys
#: freed (at once: it closes after its listener calls ended).
#: KEYS: GRAIN_KEYS.  ARGV: token.
QUIT = (
    _COMMON
    + """
redis.call('ZREM', KEYS[6], ARGV[1])
local d = {}
d[ARGV[1]] = true
reclaim(d)
return 1
"""
)

#: The group's committed position of the queue (-1: never read).
#: KEYS: GRAIN_KEYS.
POSITION = (
    _COMMON
    + """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
return advance()
"""
)

#: After a lost reply: the messages delivered to the caller that it does not
#: know of (a DISPATCH it never heard back from).  KEYS: GRAIN_KEYS.
#: ARGV: token, the offsets it knows...  Returns {1 if its session is live
#: else 0, their entries in offset order}.  One trimmed away meanwhile has
#: nothing to deliver: it counts as acknowledged.
RESYNC = (
    _NOW
    + """
local mine = ARGV[1] .. '\\t'
local known = {}
for i = 2, #ARGV do known[ARGV[i]] = true end
local m = redis.call('HGETALL', KEYS[4])
local found = {}
for i = 1, #m, 2 do
  if string.sub(m[i + 1], 1, #mine) == mine and not known[m[i]] then found[#found + 1] = tonumber(m[i]) end
end
table.sort(found)
local out = {}
for _, off in ipairs(found) do
  local id = string.format('%d-0', off + 1)
  local e = redis.call('XRANGE', KEYS[1], id, id)
  if #e == 0 then
    local o = string.format('%d', off)
    local k = string.sub(redis.call('HGET', KEYS[4], o), #mine + 1)
    redis.call('HDEL', KEYS[4], o)
    local v = redis.call('HGET', KEYS[5], k)
    if v and string.sub(v, 1, #mine) == mine then
      local c = tonumber(string.sub(v, #mine + 1)) - 1
      if c <= 0 then redis.call('HDEL', KEYS[5], k) else redis.call('HSET', KEYS[5], k, mine .. c) end
    end
  else
    out[#out + 1] = e[1]
  end
end
local exp = redis.call('ZSCORE', KEYS[6], ARGV[1])
local live = 0
if exp and tonumber(exp) > now then live = 1 end
return {live, out}
"""
)
