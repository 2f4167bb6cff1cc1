-- Lease requests from a shard's queue (frontier/queue.py), highest priority first.
--
-- KEYS[1]  the shard's queue (a sorted set)
-- KEYS[2]  the shard's leases (a hash)
-- KEYS[3]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- ARGV[1]  this worker (its owner id)
-- ARGV[2]  its pop number (this worker's, increasing)
-- ARGV[3]  how many requests at most
--
-- Moves up to ARGV[3] requests into the lease hash under the fields
-- "<owner>:<pop number>.<j>" and marks the owner alive (Redis's clock).
-- Returns the leased entries, "<score>|<request>"; a pop that already ran (a
-- retry after a lost reply) returns the same entries again and moves nothing.
-- A NOPERM error, having written nothing, when the ACL does not allow HSET.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.acl_check_cmd and not redis.acl_check_cmd('HSET', KEYS[2], 'f', 'v') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'hset' command")
end
redis.call('ZADD', KEYS[3], now, ARGV[1])
local prefix = ARGV[1] .. ':' .. ARGV[2] .. '.'
local count = tonumber(ARGV[3])
local out = {}
local again = redis.call('HGET', KEYS[2], prefix .. '0')
if again then
  out[1] = again
  for j = 1, count - 1 do
    local entry = redis.call('HGET', KEYS[2], prefix .. j)
    if not entry then break end
    out[#out + 1] = entry
  end
  return out
end
local items = redis.call('ZRANGE', KEYS[1], 0, count - 1, 'WITHSCORES')
if #items == 0 then return out end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #items / 2 - 1)
for j = 1, #items, 2 do
  local entry = items[j + 1] .. '|' .. items[j]
  redis.call('HSET', KEYS[2], prefix .. ((j - 1) / 2), entry)
  out[#out + 1] = entry
end
return out
