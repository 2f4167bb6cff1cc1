-- A block, not a script: both check_add_window_*.lua include it after their fence. Time is cut
-- into slices of L ms of Redis's clock; slice c holds the items added during it (a larger
-- generation is made beside its newest once that holds its cap, at most M) and expires
-- (PEXPIREAT, set when made) at (c + S + 1) * L, once no call looks at it: a call looks at
-- c - S .. c. Before any write: c (ARGV[7]) must be Redis's slice and the client's generations of
-- c - S .. c (ARGV[believed_at..]) the record's (KEYS[2]), else STALE_SLICE, {Redis's slice, now
-- ms, the generations of its slices (0: not made)}, for the client to ask again with; each must
-- exist (else -3); the sink and the ACL are checked. Makes the current slice's generation 0 if
-- missing. Leaves L, S, c, n, G, M, now, record, count, gens, slices, shape_at, item_at, sunk,
-- forgot, mine, cap_of(g), field, make(g) (by the script's reserve(name, ...)).
local L, S, c = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n, G, M = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local current = math.floor(now / L)
-- The record (HGETALL: S + 1 slices at most) and its generations of slices first .. first + S.
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
-- The client's generations must be Redis's (an unmade slice counts 1, its key absent), and exist.
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
-- Forgotten items: looked at only when there are some; an ACL-refused SREM errors before writing.
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
local function make(g)  -- the current slice's generation g, expiring with it
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
  for f in pairs(record) do  -- forget the slices no call looks at any more
    local s = tonumber(string.match(f, '^%d+'))
    if s and s < c - S then redis.call('HDEL', KEYS[2], f) end
  end
end
