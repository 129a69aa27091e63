"""Lua scripts of message-grain balancing (``Balance.MESSAGE``) on Redis.

Every script touches the keys of one queue only (the queue's hash tag), so
each runs on one Cluster slot.  The keys, per group ``g`` and queue, all
``ns:{<topic>#<q>}:mg:<g>:<what>`` but the first (see
:func:`~.message_grain.grain_keys`), in the order of :data:`GRAIN_KEYS`:

  log    the queue's stream (``ns:{<topic>#<q>}:log``)
  cur    string  the cursor: the id of the last entry any member looked at,
                 ``<n>`` for ``<n>-0`` (so ``<n>`` is also the next offset
                 no member has looked at), else the whole id (``<ms>-<seq>``,
                 an entry a raw ``XADD`` wrote)
  out    hash    record id -> ``<token>\\t<offset>,<offset>,...\\tk<key>\\xffk<key>...``:
                 what one DISPATCH delivered to a member and the member has
                 not acknowledged yet, in offset order, with each message's
                 key (as the member proposed it, a "k" before it; byte 0xff
                 is in no UTF-8 key).  A record's id is its
                 first offset when it was written (an offset is delivered in
                 one record at a time, so ids never collide while both
                 live; a token check fences the rest).  A field ``\\xff``
                 with a long value keeps the hash a hashtable (as in
                 ``hold``): a listpack's lookups and deletes are linear
  outz   zset    record id -> the lowest offset still in the record
  hold   hash    key -> ``<token>\\t<count>``: the member holding the key and
                 how many of its messages that member has unacknowledged.
                 The key is the message's ``keys`` ("" for a keyless or
                 unreadable one: those are held by queue).  Kept only while
                 two members or more are live on the queue (then it has the
                 field ``\\xff``): a lone member holds every key there is, so
                 nothing is written; the holds are rebuilt from the records
                 when a second member comes
  live   zset    token -> session expiry (server ms)
  park   zset    ``<offset>\\t<key>`` -> offset: the parked messages (their
                 key was held by another member, or their member's session
                 lapsed), in order

The group's committed position of the queue (its *base*) is the lowest of:
the lowest offset of a record (``outz``), the lowest parked offset, the next
offset of the cursor.  It is computed, never stored.

A token is ``<client id>/<generation>``: a member that finds itself
evicted joins again with a new one, so nothing of its old session is ever
taken for its new one.

**Who reads the stream.**  The member does: it reads the entries past the
cursor itself (``XRANGE``, what a queue-mode read costs), decodes them, and
hands DISPATCH a *proposal*: for each entry after some id, its offset and
what the server needs of it, ``k<key>`` (a message, or an unreadable entry,
held by its key), ``s`` (skipped: the member's tag filter does not take it)
or ``x`` (an entry whose id's sequence part is not 0: it shares an offset
with the entry before it, so it is delivered, never recorded, and
dead-lettered).  Every member reads the same immutable stream and decodes it
the same way, so a proposal is the stream as the server would read it.  The
script uses the part past its cursor (a proposal that starts after the
cursor leaves a gap, and is not used) and answers with the proposal's
indexes it delivered: no entry crosses into Lua and back, which cost
2.2 µs of server time per message (``benchmarks/grain_costs.py``).

The rules: a parked or new message goes to the member asking when its key
is free or already that member's, else it is parked; parked messages are
served first and in offset order, so a key's messages are delivered in
offset order.  A key is freed when its holder acknowledged every one
delivered to it (its parked messages then go, in order, to whoever asks
next), or when its holder's session lapses: then its records are parked
again (reclaimed) and go, in offset order, to whoever asks next.

Cost: a DISPATCH writes one record (HSET, ZADD) and, with holds kept,
reads and writes each key's hold once (one HMGET and one HSET per round of
its scan); an ACK reads the records it names (one HMGET), rewrites those
acknowledged in part, deletes the others, and, with holds kept, lowers
each key's hold once.  No command is per message.  The helpers the scripts
share (records, holds, the committed position) are :mod:`.grain_lua`.
"""

from __future__ import annotations

from .grain_lua import HELPERS as _COMMON
from .grain_lua import NOW as _NOW

__all__ = ["ACK", "DISPATCH", "GRAIN_KEYS", "IN_FLIGHT", "POSITION", "QUIT", "RENEW", "RESYNC"]

#: The per-queue keys, in the order every script takes them.
GRAIN_KEYS = ("log", "cur", "out", "outz", "hold", "live", "park")

#: Renew the caller's session and deliver up to ``want`` messages.
#: KEYS: GRAIN_KEYS.  ARGV: token, ttl ms, want, park limit, join ("1": the
#: caller joins with this token), start offset (the cursor of a queue the
#: group has never read), the id the proposal starts after (in the cursor's
#: form), then per proposed entry: its offset (its id for an ``x`` entry)
#: and ``k<key>``, ``s`` or ``x``.  Reclaims every lapsed session first;
#: keeps the holds while two members or more are live, else drops them.
#: Returns {1, base, cursor, the proposal's indexes delivered (from 0, as
#: runs "<first>-<last>" joined by ","), the parked messages delivered (entries as XRANGE gives
#: them, in offset order, all below the others)}, or {0, base, cursor, "",
#: {}} when the caller's session lapsed (it must join again with a new
#: token).
DISPATCH = (
    _NOW
    + _COMMON
    + """
local argv = ARGV
local sbyte, ssub = string.byte, string.sub
local tok = argv[1]
local want = tonumber(argv[3])
local parkmax = tonumber(argv[4])
-- the sessions (a handful): the lapsed ones, the caller's, how many live
local sessions = redis.call('ZRANGE', KEYS[6], 0, -1, 'WITHSCORES')
local dead, d = {}, {}
local others = 0
local exp = nil
for i = 1, #sessions, 2 do
  local t = sessions[i]
  if tonumber(sessions[i + 1]) <= now then
    dead[#dead + 1] = t
    d[t] = true
  elseif t == tok then
    exp = true
  else
    others = others + 1
  end
end
if #dead > 0 then
  bulk('ZREM', KEYS[6], dead)
  reclaim(d)
end
if argv[5] == '1' then
  redis.call('SETNX', KEYS[2], argv[6])
elseif not exp then
  local c = redis.call('GET', KEYS[2]) or argv[6]
  return {0, base_of(c), c, '', {}}
end
redis.call('ZADD', KEYS[6], now + tonumber(argv[2]), tok)  -- every call: the member counts its session from it
local lone = others == 0
if lone then
  redis.call('DEL', KEYS[5])  -- its own holds only: every key is the caller's
elseif not kept() then
  keep_holds()
end
local cursor = redis.call('GET', KEYS[2])
-- the holds read or changed by this call: key -> {token or false, count, changed}
local holds = {}
local function load_holds(ks)
  local missing = {}
  for _, k in ipairs(ks) do
    if holds[k] == nil then
      holds[k] = {false, 0}
      missing[#missing + 1] = k
    end
  end
  if #missing == 0 then return end
  local vals = redis.call('HMGET', KEYS[5], unpack(missing))
  for i, k in ipairs(missing) do
    local v = vals[i]
    if v then
      local tab = string.find(v, '\\t', 1, true)
      holds[k] = {ssub(v, 1, tab - 1), tonumber(ssub(v, tab + 1))}
    end
  end
end
local function free(k)  -- whether the caller may take a message of key k (its hold loaded)
  if lone then return true end
  local h = holds[k]
  return h[1] == false or h[1] == tok
end
local changed = {}
local function hold(k)
  if lone then return end
  local h = holds[k]
  if not h[3] then
    h[3] = true
    changed[#changed + 1] = k
  end
  h[1] = tok
  h[2] = h[2] + 1
end
local rec, reck = {}, {}  -- the record: offsets and keys
local n = 0               -- messages delivered
local entries = {}
-- the proposal's indexes delivered (from 0), as runs "a-b" joined by ","
local idx = {}
local run0, run1 = nil, nil
local function deliver(j)
  if run1 == j - 2 then
    run1 = j - 1
    return
  end
  if run0 then idx[#idx + 1] = run0 .. '-' .. run1 end
  run0, run1 = j - 1, j - 1
end
local full = false
local parked = redis.call('ZRANGE', KEYS[7], 0, -1)
local nparked = #parked
if nparked > 0 then
  local os, ks = {}, {}
  for i, m in ipairs(parked) do
    local tab = string.find(m, '\\t', 1, true)
    os[i] = ssub(m, 1, tab - 1)
    ks[i] = ssub(m, tab + 1)
  end
  if not lone then load_holds(ks) end
  local unparked = {}
  for i, m in ipairs(parked) do
    local k = ks[i]
    if free(k) then
      if n >= want then
        full = true
        break
      end
      local id = string.format('%d-0', tonumber(os[i]) + 1)
      local e = redis.call('XRANGE', KEYS[1], id, id)
      unparked[#unparked + 1] = m
      if #e > 0 then  -- else trimmed away: nothing to deliver
        hold(k)
        rec[#rec + 1] = os[i]
        reck[#reck + 1] = 'k' .. k
        n = n + 1
        entries[#entries + 1] = e[1]
      end
    end
  end
  nparked = nparked - #unparked
  bulk('ZREM', KEYS[7], unparked)
end
local np = (#argv - 7) / 2
local newcur = cursor
local function pos(j)  -- the proposed entry j's id as (ms, seq)
  local a = argv[6 + 2 * j]
  if sbyte(argv[7 + 2 * j], 1) == 120 then
    local ms, seq = string.match(a, '^(%d+)%-(%d+)$')
    return tonumber(ms), tonumber(seq)
  end
  return tonumber(a) + 1, 0
end
local function idpos(c)
  local ms, seq = string.match(c, '^(%d+)%-?(%d*)$')
  return tonumber(ms), tonumber(seq) or 0
end
if not full and n < want and nparked < parkmax and np > 0 then
  local cms, cseq = idpos(cursor)
  local ams, aseq = idpos(argv[7])
  if ams < cms or (ams == cms and aseq <= cseq) then  -- the proposal leaves no gap after the cursor
    -- the first proposed entry past the cursor (they are in id order)
    local lo, hi = 1, np + 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local ms, seq = pos(mid)
      if ms < cms or (ms == cms and seq <= cseq) then lo = mid + 1 else hi = mid end
    end
    local j = lo
    local last = nil
    local parks = {}  -- ZADD park: score, member, ...
    while j <= np and n < want and nparked < parkmax do
      -- a round: the entries still wanted (and a few more: some may be parked), their holds loaded
      local stop = math.min(np, j + want - n + 7)
      if not lone then
        local ks = {}
        for i = j, stop do
          local info = argv[7 + 2 * i]
          if sbyte(info, 1) == 107 then ks[#ks + 1] = ssub(info, 2) end
        end
        load_holds(ks)
      end
      while j <= stop and n < want and nparked < parkmax do
        local info = argv[7 + 2 * j]
        local f = sbyte(info, 1)
        if f == 107 and lone then  -- k, the caller alone: every key is its own
          rec[#rec + 1] = argv[6 + 2 * j]
          reck[#reck + 1] = info
          n = n + 1
          deliver(j)
        elseif f == 107 then  -- k: held by its key
          local k = ssub(info, 2)
          if free(k) then
            hold(k)
            rec[#rec + 1] = argv[6 + 2 * j]
            reck[#reck + 1] = info
            n = n + 1
            deliver(j)
          else
            local o = argv[6 + 2 * j]
            parks[#parks + 1] = o
            parks[#parks + 1] = o .. '\\t' .. k
            nparked = nparked + 1
          end
        elseif f == 120 then  -- x: delivered, never recorded
          deliver(j)
          n = n + 1
        end  -- s: skipped
        last = j
        j = j + 1
      end
    end
    bulk('ZADD', KEYS[7], parks)
    if last then
      if sbyte(argv[7 + 2 * last], 1) == 120 then
        newcur = argv[6 + 2 * last]
      else
        newcur = string.format('%d', tonumber(argv[6 + 2 * last]) + 1)
      end
      redis.call('SET', KEYS[2], newcur)
    end
  end
end
if #rec > 0 then
  redis.call('HSET', KEYS[3], rec[1], rec_value(tok, rec, reck), HT, HTV)
  redis.call('ZADD', KEYS[4], tonumber(rec[1]), rec[1])
end
if #changed > 0 then
  local hs = {}
  local mine = tok .. '\\t'
  for _, k in ipairs(changed) do
    hs[#hs + 1] = k
    hs[#hs + 1] = mine .. holds[k][2]
  end
  bulk('HSET', KEYS[5], hs)
end
if run0 then idx[#idx + 1] = run0 .. '-' .. run1 end
return {1, base_of(newcur), newcur, table.concat(idx, ','), entries}
"""
)

#: Acknowledge messages delivered to the caller (others' are ignored: a
#: lapsed session's acknowledgements are fenced).  KEYS: GRAIN_KEYS.
#: ARGV: token, then per record: its id and ``*`` (all of it) or the
#: offsets acknowledged joined by ",".  With holds kept, each key's hold is
#: lowered by what the records still had of it (an ACK sent again, its reply
#: lost, lowers nothing twice).  Returns {how many messages were
#: acknowledged, base, 1 if the caller's session is live else 0}.
ACK = (
    _NOW
    + _COMMON
    + """
local tok = ARGV[1]
local n = 0
local rids = {}
for i = 2, #ARGV, 2 do rids[#rids + 1] = ARGV[i] end
if #rids > 0 then
  local holds = kept()
  local ks, done = {}, {}
  local function lower(k)
    if done[k] == nil then
      ks[#ks + 1] = k
      done[k] = 1
    else
      done[k] = done[k] + 1
    end
  end
  local mine = tok .. '\\t'
  local vals = redis.call('HMGET', KEYS[3], unpack(rids))
  local dels, sets, zadds = {}, {}, {}
  for r, rid in ipairs(rids) do
    local v = vals[r]
    if v and string.sub(v, 1, #mine) == mine then
      local spec = ARGV[2 * r + 1]
      if spec == '*' and not holds then
        local offs = string.sub(v, #mine + 1, string.find(v, '\\t', #mine + 1, true) - 1)
        local _, commas = string.gsub(offs, ',', ',')
        n = n + commas + 1
        dels[#dels + 1] = rid
      else
        local _, os, rks = rec_read(v)
        local acked = nil
        if spec ~= '*' then
          acked = {}
          for o in string.gmatch(spec, '%d+') do acked[o] = true end
        end
        local keepo, keepk = {}, {}
        for j, o in ipairs(os) do
          if acked == nil or acked[o] then
            n = n + 1
            if holds then lower(rks[j]) end
          else
            keepo[#keepo + 1] = o
            keepk[#keepk + 1] = 'k' .. rks[j]
          end
        end
        if #keepo == 0 then
          dels[#dels + 1] = rid
        elseif #keepo < #os then
          sets[#sets + 1] = rid
          sets[#sets + 1] = rec_value(tok, keepo, keepk)
          zadds[#zadds + 1] = tonumber(keepo[1])
          zadds[#zadds + 1] = rid
        end
      end
    end
  end
  bulk('HDEL', KEYS[3], dels)
  bulk('ZREM', KEYS[4], dels)
  bulk('HSET', KEYS[3], sets)
  bulk('ZADD', KEYS[4], zadds)
  if holds then release(tok, ks, done) end
end
local exp = redis.call('ZSCORE', KEYS[6], tok)
local live = 0
if exp and tonumber(exp) > now then live = 1 end
return {n, base_of(redis.call('GET', KEYS[2]) or '0'), live}
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

#: Leave the queue: the caller's records are parked, its keys freed (at
#: once: it closes after its listener calls ended).  KEYS: GRAIN_KEYS.
#: ARGV: token.
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
local c = redis.call('GET', KEYS[2])
if not c then return -1 end
return base_of(c)
"""
)

#: The messages delivered to some member and not acknowledged.
#: KEYS: GRAIN_KEYS.  Returns their number.
IN_FLIGHT = (
    _COMMON
    + """
local n = 0
local m = redis.call('HGETALL', KEYS[3])
for i = 1, #m, 2 do
  if m[i] ~= HT then
    local _, os = rec_read(m[i + 1])
    n = n + #os
  end
end
return n
"""
)

#: After a lost reply: the records of the caller that it does not know of
#: (a DISPATCH it never heard back from).  KEYS: GRAIN_KEYS.  ARGV: token,
#: the record ids it knows...  Returns {1 if its session is live else 0,
#: {record id, its entries in offset order}, ...}.  A message
#: trimmed away meanwhile has nothing to deliver: it counts as acknowledged.
RESYNC = (
    _NOW
    + _COMMON
    + """
local tok = ARGV[1]
local known = {}
for i = 2, #ARGV do known[ARGV[i]] = true end
local m = redis.call('HGETALL', KEYS[3])
local out = {}
local ks, done = {}, {}
for i = 1, #m, 2 do
  local rid = m[i]
  if rid ~= HT and not known[rid] then
    local t, os, rks = rec_read(m[i + 1])
    if t == tok then
      local es, keepo, keepk = {}, {}, {}
      for j, o in ipairs(os) do
        local id = string.format('%d-0', tonumber(o) + 1)
        local e = redis.call('XRANGE', KEYS[1], id, id)
        if #e > 0 then
          es[#es + 1] = e[1]
          keepo[#keepo + 1] = o
          keepk[#keepk + 1] = 'k' .. rks[j]
        else  -- trimmed away: nothing to deliver
          if done[rks[j]] == nil then ks[#ks + 1] = rks[j] end
          done[rks[j]] = (done[rks[j]] or 0) + 1
        end
      end
      if #keepo == 0 then
        redis.call('HDEL', KEYS[3], rid)
        redis.call('ZREM', KEYS[4], rid)
      else
        if #keepo < #os then
          redis.call('HSET', KEYS[3], rid, rec_value(tok, keepo, keepk))
          redis.call('ZADD', KEYS[4], tonumber(keepo[1]), rid)
        end
        out[#out + 1] = {rid, es}
      end
    end
  end
end
if kept() then release(tok, ks, done) end
local exp = redis.call('ZSCORE', KEYS[6], tok)
local live = 0
if exp and tonumber(exp) > now then live = 1 end
return {live, out}
"""
)
