-- A block, not a script: check_add_window_bits.lua and check_add_window_bf.lua
-- include it after their fence. The time slices of a recrawl window's check-and-add
-- (bloom/window.py): the current slice c (ARGV[7]) must be Redis's, the client's
-- generations of slices c - S .. c (from ARGV[believed_at]) the record's (KEYS[2]),
-- and every generation the record holds must exist; the sink's keys and the ACL's
-- refusals are checked before any write. Then generation 0 of the current slice is
-- made if it has none. Leaves: L, S, c, n, G, M, now, record, count, gens, slices,
-- shape_at, item_at, sunk, forgot, mine, cap_of(g), field, and make(g) (generation g
-- of the current slice, its key made by the script's reserve(name, ...), which the
-- script defines before this block); see the scripts' headers.

local L, S, c = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n, G, M = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local current = math.floor(now / L)

-- The record (HGETALL: a few fields, S + 1 slices at most) and its view of slices
-- current - S .. current: their generations.
local record = {}
local pairs_ = redis.call('HGETALL', KEYS[2])
for i = 1, #pairs_, 2 do record[pairs_[i]] = pairs_[i + 1] end
local function gens_of(first)
  local gens = {}
  for g = 0, S do gens[g + 1] = tonumber(record[string.format('%d', first + g)]) or 0 end
  return record['made'], tonumber(record[string.format('%d', first + S) .. 'n']) or 0, gens
end
local function stale(gens)
  release()
  return {current, now, unpack(gens)}
end

if current ~= c then
  local _, _, gens = gens_of(current - S)
  return stale(gens)
end
local made, count, gens = gens_of(c - S)
if not made then
  release()
  return -3
end
local shape_at = 11
local believed_at = shape_at + 3 * (G + 1)
local item_at = believed_at + S + 1
-- The client's generations must be Redis's (a slice not made counts as 1, its key
-- absent); then every generation the record holds must exist.
local key_at, slices, holds = 5, {}, 0
for g = 0, S do
  local b, a = tonumber(ARGV[believed_at + g]), gens[g + 1]
  if b ~= math.max(a, 1) then return stale(gens) end
  slices[g + 1] = key_at
  key_at = key_at + b
  holds = holds + a
end
key_at = key_at + 1
if holds > 0 then
  local names = {}
  for g = 0, S do
    for j = 0, gens[g + 1] - 1 do names[#names + 1] = KEYS[slices[g + 1] + j] end
  end
  if redis.call('EXISTS', unpack(names)) < holds then
    release()
    return -3
  end
end
local sunk = KEYS[key_at] and {unpack(KEYS, key_at, key_at + 4)}

if sunk then
  local refused = sink_refusal(sunk)
  if refused then return refused end
end
-- Forgotten items (`bloomdupe forget`): looked at only when there are some (EXISTS),
-- and SREM refused by the ACL is an error before any write.
local forgot = redis.call('EXISTS', KEYS[4]) == 1
if forgot and redis.acl_check_cmd and not redis.acl_check_cmd('SREM', KEYS[4], 'x') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'srem' command")
end
local mine = gens[S + 1]
local function cap_of(g) return tonumber(ARGV[shape_at + 3 * g + 2]) end
local grows = M > math.max(mine, 1) and count + n >= cap_of(math.max(mine, 1) - 1)
if (mine == 0 or grows) and redis.acl_check_cmd
    and not redis.acl_check_cmd('PEXPIREAT', KEYS[slices[S + 1]], '0') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'pexpireat' command")
end
local field = string.format('%d', c)

-- Make generation g of the current slice (its key by the script's reserve), expiring
-- with its slice.
local function make(g)
  local name = KEYS[slices[S + 1] + g]
  reserve(name, ARGV[shape_at + 3 * g], ARGV[shape_at + 3 * g + 1])
  redis.call('PEXPIREAT', name, (c + S + 1) * L)
  redis.call('HSET', KEYS[2], field, g + 1, field .. 'n', 0)
  count = 0
  return name
end
if mine == 0 then
  make(0)
  mine = 1
  -- Forget the slices no call looks at any more.
  for f in pairs(record) do
    local s = tonumber(string.match(f, '^%d+'))
    if s and s < c - S then redis.call('HDEL', KEYS[2], f) end
  end
end
