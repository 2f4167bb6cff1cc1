-- Check-and-add, Lua engine (bloom/lua.py): is each item in the filter? Add the new ones.
-- Each shard's bits are one plain string per generation, read and set with BITFIELD.
--
-- KEYS[1]      this client's op log for the shard (bloom/oplog.py)
-- KEYS[2]      the shard's generation marker: how many generations it has seen
-- KEYS[3]      the shard's lock (lock mode)
-- KEYS[4]      the shard's forgotten items (`bloomdupe forget`): each answered new once
-- KEYS[5..4+G] the shard's bits, oldest generation first
-- KEYS[5+G]    optional: a sorted set (the crawl's queue) that gets each new item
-- ARGV[1]      the lock token, '' in atomic mode
-- ARGV[2]      this call's id (the op id of its first item)
-- ARGV[3]      the ack: calls below it have their answers, the op log may forget them
-- ARGV[4]      the op log's TTL in ms
-- ARGV[5]      G, the generation count
-- ARGV[6..5+G] k, the bits per item, of each generation
-- ARGV[6+G]    n, the item count
-- then per item its member (its keyed 16-byte hash, for KEYS[4]) and its k bit
-- offsets in each generation, oldest first;
-- then, with KEYS[5+G], per item its score and member (two values an item).
--
-- Returns a string of one character an item: '1' new (now set in the newest
-- generation, and queued; a forgotten item is new once, whatever its bits say),
-- '0' seen before; or, having written nothing:
--   -1 (LOCK_BUSY)        lock mode, and the lock does not hold this token
--   -2 (STALE_GENERATION) the shard already has more than G generations
--   -3 (SHARD_MISSING)    a generation's bits are gone (BITFIELD would re-create
--                         them empty and every item would be new again)
--   a NOPERM error        the ACL does not allow ZADD on KEYS[5+G], or SREM on
--                         KEYS[4] while it holds items
-- A call whose id the op log holds (a retry after a lost reply) returns the
-- answer recorded the first time and changes nothing else.

local token, call, ack = ARGV[1], ARGV[2], ARGV[3]

-- The op log: "<ack>|<call>:<reply>|<call>:<reply>|...".
local log = redis.call('GET', KEYS[1])
local head = ack .. '|'
if log and string.sub(log, 1, #head) == head then
  local tag = '|' .. call .. ':'
  local at = string.find(log, tag, #head, true)
  if at then
    if token ~= '' and redis.call('GET', KEYS[3]) == token then redis.call('DEL', KEYS[3]) end
    local from = at + #tag
    return string.sub(log, from, string.find(log, '|', from, true) - 1)
  end
else
  log = head
end

-- The fence: a holder paused past the lock's TTL is refused, not trusted.
if token ~= '' and redis.call('GET', KEYS[3]) ~= token then return -1 end

local G = tonumber(ARGV[5])
local sink = KEYS[5 + G]
if sink and redis.acl_check_cmd and not redis.acl_check_cmd('ZADD', sink, '0', '0') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'zadd' command")
end
if redis.call('EXISTS', unpack(KEYS, 5, 4 + G)) < G then
  if token ~= '' then redis.call('DEL', KEYS[3]) end
  return -3
end
local stored = tonumber(redis.call('GET', KEYS[2]) or '1')
if stored > G then
  if token ~= '' then redis.call('DEL', KEYS[3]) end
  return -2
elseif stored < G then
  redis.call('SET', KEYS[2], G)
end

-- Forgotten items (`bloomdupe forget`): looked at only when there are some (EXISTS),
-- and SREM refused by the ACL is an error before any write.
local forgot = redis.call('EXISTS', KEYS[4]) == 1
if forgot and redis.acl_check_cmd and not redis.acl_check_cmd('SREM', KEYS[4], 'x') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'srem' command")
end
local ks, width = {}, 1
for g = 1, G do
  ks[g] = tonumber(ARGV[5 + g])
  width = width + ks[g]
end
local n = tonumber(ARGV[6 + G])
local first = 7 + G
local sink_at = first + n * width
-- BITFIELD's arguments, kept between items: only the offsets change.
local get, set = {}, {}
for i = 0, math.max(unpack(ks)) - 1 do
  get[3 * i + 1], get[3 * i + 2] = 'GET', 'u1'
  set[4 * i + 1], set[4 * i + 2], set[4 * i + 4] = 'SET', 'u1', '1'
end
local out = {}
for j = first, sink_at - 1, width do
  -- Seen when every bit is set in some older generation; else set in the newest,
  -- new when one of its bits was 0 (or when it was forgotten).
  local again = forgot and redis.call('SREM', KEYS[4], ARGV[j]) == 1
  local at, found = j + 1, false
  for g = 1, (again and 0 or G - 1) do
    local k = ks[g]
    for i = 0, k - 1 do get[3 * i + 3] = ARGV[at + i] end
    at = at + k
    found = true
    for _, bit in ipairs(redis.call('BITFIELD_RO', KEYS[4 + g], unpack(get, 1, 3 * k))) do
      if bit == 0 then
        found = false
        break
      end
    end
    if found then break end
  end
  local new = again and '1' or '0'
  if not found then
    local k = ks[G]
    at = j + width - k
    for i = 0, k - 1 do set[4 * i + 3] = ARGV[at + i] end
    for _, bit in ipairs(redis.call('BITFIELD', KEYS[4 + G], unpack(set, 1, 4 * k))) do
      if bit == 0 then
        new = '1'
        break
      end
    end
  end
  out[#out + 1] = new
end
local reply = table.concat(out)

if sink then
  for j = 1, n do
    if out[j] == '1' then
      local at = sink_at + 2 * (j - 1)
      redis.call('ZADD', sink, ARGV[at], ARGV[at + 1])
    end
  end
end

redis.call('SET', KEYS[1], log .. call .. ':' .. reply .. '|', 'PX', ARGV[4])
if token ~= '' then redis.call('DEL', KEYS[3]) end
return reply
