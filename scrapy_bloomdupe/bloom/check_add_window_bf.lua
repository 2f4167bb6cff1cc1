-- Check-and-add with a recrawl window, RedisBloom engine (bloom/window.py): is each
-- item in a live time slice? Add the new ones to the current slice.
-- Time is cut into slices of L ms of Redis's clock (TIME); slice c is one NONSCALING
-- RedisBloom filter a shard, holds the items added during it and expires (PEXPIREAT,
-- set when it is made) at (c + S + 1) * L, once no call looks at it any more: a call
-- looks at slices c - S .. c.
--
-- KEYS[1]        this client's op log for the shard (bloom/oplog.py)
-- KEYS[2]        the shard's slice record: the ids of its last S + 1 slices made
-- KEYS[3]        the shard's lock (lock mode)
-- KEYS[4]        the shard's forgotten items (`bloomdupe forget`): each answered new once
-- KEYS[5..5+S]   the shard's BF keys of slices c - S .. c (the current slice last)
-- KEYS[6+S]      optional: a sorted set (the crawl's queue) that gets each new item
-- ARGV[1]        the lock token, '' in atomic mode
-- ARGV[2]        this call's id (the op id of its first item)
-- ARGV[3]        the ack: calls below it have their answers, the op log may forget them
-- ARGV[4]        the op log's TTL in ms
-- ARGV[5]        L, a slice's length in ms
-- ARGV[6]        S, the slices a window is cut into
-- ARGV[7]        c, the current slice as the client believes it
-- ARGV[8]        a slice shard's BF.RESERVE error rate
-- ARGV[9]        a slice shard's BF.RESERVE capacity
-- ARGV[10]       n, the item count
-- ARGV[11..10+n] the items (the filter's keyed hashes, never the fingerprints)
-- then, with KEYS[6+S], per item its score and member (two values an item).
--
-- Returns a string of one character an item: '1' new (now in the current slice,
-- and queued), '0' seen in a live slice, 'F' not added: the current slice's shard
-- is full; or, having written nothing:
--   -1 (LOCK_BUSY)      lock mode, and the lock does not hold this token
--   -3 (SHARD_MISSING)  a slice the record holds is gone before its time
--   {slice, now}        (STALE_SLICE) Redis's current slice is not c: its id and
--                       Redis's time in ms; the client asks again with those keys
--   a NOPERM error      the ACL does not allow ZADD on KEYS[6+S], PEXPIREAT on a
--                       slice to make, or SREM on KEYS[4] while it holds items
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

local L, S, c = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local current = math.floor(now / L)
if current ~= c then
  if token ~= '' then redis.call('DEL', KEYS[3]) end
  return {current, now}
end

local sink = KEYS[6 + S]
if sink and redis.acl_check_cmd and not redis.acl_check_cmd('ZADD', sink, '0', '0') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'zadd' command")
end
-- Which slices are there; one the record holds but Redis lacks is lost state.
local live = {}
for g = 0, S do
  local name = KEYS[5 + g]
  if redis.call('EXISTS', name) == 1 then
    live[#live + 1] = name
  elseif #redis.call('ZRANGEBYSCORE', KEYS[2], c - S + g, c - S + g) > 0 then
    if token ~= '' then redis.call('DEL', KEYS[3]) end
    return -3
  end
end
-- Forgotten items (`bloomdupe forget`): looked at only when there are some (EXISTS),
-- and SREM refused by the ACL is an error before any write.
local forgot = redis.call('EXISTS', KEYS[4]) == 1
if forgot and redis.acl_check_cmd and not redis.acl_check_cmd('SREM', KEYS[4], 'x') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'srem' command")
end
local newest = KEYS[5 + S]
if live[#live] ~= newest then
  if redis.acl_check_cmd and not redis.acl_check_cmd('PEXPIREAT', newest, '0') then
    return redis.error_reply("NOPERM this user has no permissions to run the 'pexpireat' command")
  end
  -- The current slice is made here, and expires once no call looks at it.
  redis.call('BF.RESERVE', newest, ARGV[8], ARGV[9], 'NONSCALING')
  redis.call('PEXPIREAT', newest, (c + S + 1) * L)
  redis.call('ZADD', KEYS[2], c, c)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(S + 2))
else
  live[#live] = nil
end

local n = tonumber(ARGV[10])
local sink_at = 11 + n
local out, todo, at, found = {}, {}, {}, {}
for j = 1, n do
  -- A forgotten item is new once (added again); else looked up in the older slices.
  if forgot and redis.call('SREM', KEYS[4], ARGV[10 + j]) == 1 then found[j] = 'forgot' end
end
for _, name in ipairs(live) do
  local seen = redis.call('BF.MEXISTS', name, unpack(ARGV, 11, 10 + n))
  for j = 1, n do
    if seen[j] == 1 and not found[j] then found[j] = true end
  end
end
for j = 1, n do
  out[j] = '0'
  if found[j] ~= true then
    todo[#todo + 1] = ARGV[10 + j]
    at[#at + 1] = j
  end
end
if #todo > 0 then
  local added = redis.call('BF.INSERT', newest, 'NOCREATE', 'ITEMS', unpack(todo))
  for i = 1, #todo do
    local flag = added[i]
    if flag == 1 or (flag == 0 and found[at[i]] == 'forgot') then
      out[at[i]] = '1'
    elseif flag ~= 0 then
      out[at[i]] = 'F'
    end
  end
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
