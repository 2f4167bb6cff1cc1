-- Check-and-add, RedisBloom engine (bloom/native.py): is each item in the filter? Add the new
-- ones. A shard is one NONSCALING RedisBloom filter a generation.
-- KEYS[1] this client's op log (bloom/oplog.py); KEYS[2] the shard's generation marker (how many
-- it has seen); KEYS[3] its lock; KEYS[4] its forgotten items; KEYS[5..4+G] its BF keys, oldest
-- first; optional KEYS[5+G..9+G] the sink's keys (frontier/sink.lua).
-- ARGV[1..4] lock token ('' atomic), call id, ack, op log TTL ms (op_log.lua); G; n; the items
-- (keyed hashes, never the fingerprints); with the sink its arguments.
-- Returns one character an item: '1' new (added, queued; a forgotten item is new once), '0'
-- seen, 'F' not added: the newest is full (the caller grows the filter and asks again); or,
-- having written nothing: -1 LOCK_BUSY, -2 STALE_GENERATION (more than G generations), -3
-- SHARD_MISSING (a generation's key is gone: never re-created empty), NOPERM (the ACL refuses a
-- sink's command, or SREM on a non-empty KEYS[4]). A retried call id gets its recorded answer.
-- #include bf_insert.lua (BF.INSERT's flags, on Redis and on Valkey)
-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)
-- #include shard_lock.lua (token, held, release)
-- #include op_log.lua (a retry's recorded answer; answer(reply))
-- The fence: a holder paused past the lock's TTL is refused, not trusted.
if token ~= '' and not held then return -1 end
local G = tonumber(ARGV[5])
local sunk = KEYS[5 + G] and {unpack(KEYS, 5 + G, 9 + G)}
if sunk then
  local refused = sink_refusal(sunk)
  if refused then return refused end
end
if redis.call('EXISTS', unpack(KEYS, 5, 4 + G)) < G then
  release()
  return -3
end
local stored = tonumber(redis.call('GET', KEYS[2]) or '1')
if stored > G then
  release()
  return -2
elseif stored < G then
  redis.call('SET', KEYS[2], G)
end
local n = tonumber(ARGV[6])
local sink_at = 7 + n
-- Forgotten items: looked at only when there are some; an ACL-refused SREM errors before writing.
local forgot = redis.call('EXISTS', KEYS[4]) == 1
if forgot and redis.acl_check_cmd and not redis.acl_check_cmd('SREM', KEYS[4], 'x') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'srem' command")
end
local out, todo, at, found = {}, {}, {}, {}
if forgot then  -- a forgotten item is new once (added again), whatever the filter says
  for j = 1, n do
    if redis.call('SREM', KEYS[4], ARGV[6 + j]) == 1 then found[j] = 'forgot' end
  end
end
for g = 1, G - 1 do
  local seen = redis.call('BF.MEXISTS', KEYS[4 + g], unpack(ARGV, 7, 6 + n))
  for j = 1, n do
    if seen[j] == 1 and not found[j] then found[j] = true end
  end
end
for j = 1, n do
  out[j] = '0'
  if found[j] ~= true then
    todo[#todo + 1] = ARGV[6 + j]
    at[#at + 1] = j
  end
end
if #todo > 0 then
  local added = bf_insert(KEYS[4 + G], todo)
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
if sunk then sink(sunk, sink_at, out) end
return answer(reply)
