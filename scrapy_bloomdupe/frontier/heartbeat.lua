-- Mark a worker alive in one shard (frontier/queue.py), on Redis's clock.
--
-- KEYS[1]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- ARGV[1]  this worker (its owner id)
-- ARGV[2]  optional: the lease timeout, ms
--
-- Returns ZADD's reply (1 the first time, then 0); with ARGV[2], how many other
-- workers are live instead (their last heartbeat within the lease timeout).

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
if not ARGV[2] then return added end
-- (ZRANGEBYSCORE, not ZCOUNT: a rule the ACL of docs/security.md already has)
return #redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[2]), '+inf') - 1
