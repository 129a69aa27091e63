"""The Lua the message-grain scripts share (:mod:`.grain_scripts`): how one
queue's state is read and written -- its records, its holds, its committed
position -- prepended to each script that needs it."""

from __future__ import annotations

__all__ = ["HELPERS", "NOW"]

#: Lua that reads the server's clock: ``now``, in ms.
NOW = """
local __t = redis.call('TIME')
local now = tonumber(__t[1]) * 1000 + math.floor(tonumber(__t[2]) / 1000)
"""

#: Lua functions over one queue's message-grain keys (KEYS in the order of
#: :data:`.grain_scripts.GRAIN_KEYS`): ``rec_read``/``rec_value`` (a record's
#: value: token, offsets, keys), ``base_of`` (the committed position from a
#: cursor), ``bulk`` (a command over many arguments, in chunks), ``reclaim``
#: (park the records of lapsed tokens, free their keys), ``kept``,
#: ``keep_holds`` and ``release`` (the holds: whether kept, rebuilt from the
#: records, lowered).
HELPERS = """
-- a field no message key has (keys are UTF-8): in ``hold``, "the holds are
-- kept"; its value is too long for a listpack, so ``out`` and ``hold`` stay
-- hashtables (a listpack's lookups and deletes are linear)
local HT = '\\255'
local HTV = string.rep('-', 100)
-- a record's value: its token, its offsets (strings) and keys (tables)
local function rec_read(v)
  local t1 = string.find(v, '\\t', 1, true)
  local t2 = string.find(v, '\\t', t1 + 1, true)
  local os, ks = {}, {}
  for o in string.gmatch(string.sub(v, t1 + 1, t2 - 1), '%d+') do os[#os + 1] = o end
  for k in string.gmatch(string.sub(v, t2 + 1) .. '\\255', 'k([^\\255]*)\\255') do ks[#ks + 1] = k end
  return string.sub(v, 1, t1 - 1), os, ks
end
-- ``ks``: each key with a "k" before it (a proposal's info)
local function rec_value(tok, os, ks)
  return tok .. '\\t' .. table.concat(os, ',') .. '\\t' .. table.concat(ks, '\\255')
end
local function base_of(c)
  local b = tonumber(string.match(c, '^(%d+)'))
  local r = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if #r > 0 and tonumber(r[2]) < b then b = tonumber(r[2]) end
  r = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
  if #r > 0 and tonumber(r[2]) < b then b = tonumber(r[2]) end
  return b
end
local function bulk(cmd, key, args)
  local step = 2000  -- even: pairs stay whole
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end
local function reclaim(d)
  local m = redis.call('HGETALL', KEYS[3])
  local parks = {}
  local gone = {}
  for i = 1, #m, 2 do
    if m[i] ~= HT then
      local tok, os, ks = rec_read(m[i + 1])
      if d[tok] then
        gone[#gone + 1] = m[i]
        for j, o in ipairs(os) do
          parks[#parks + 1] = o
          parks[#parks + 1] = o .. '\\t' .. ks[j]
        end
      end
    end
  end
  bulk('ZADD', KEYS[7], parks)
  bulk('HDEL', KEYS[3], gone)
  bulk('ZREM', KEYS[4], gone)
  local h = redis.call('HGETALL', KEYS[5])
  local free = {}
  for i = 1, #h, 2 do
    local v = h[i + 1]
    if h[i] ~= HT and d[string.sub(v, 1, string.find(v, '\\t', 1, true) - 1)] then free[#free + 1] = h[i] end
  end
  bulk('HDEL', KEYS[5], free)
end
local function kept()
  return redis.call('HEXISTS', KEYS[5], HT) == 1
end
-- the holds, kept from now on: rebuilt from the records
local function keep_holds()
  local m = redis.call('HGETALL', KEYS[3])
  local c, who = {}, {}
  for i = 1, #m, 2 do
    if m[i] ~= HT then
      local tok, _, ks = rec_read(m[i + 1])
      for _, k in ipairs(ks) do
        c[k] = (c[k] or 0) + 1
        who[k] = tok
      end
    end
  end
  local hs = {HT, HTV}
  for k, n in pairs(c) do
    hs[#hs + 1] = k
    hs[#hs + 1] = who[k] .. '\\t' .. n
  end
  bulk('HSET', KEYS[5], hs)
end
-- lower the holds of ``tok`` (kept): ``ks`` keys, ``done`` key -> count
local function release(tok, ks, done)
  if #ks == 0 then return end
  local mine = tok .. '\\t'
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
"""
