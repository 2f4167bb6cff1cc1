-- Mark a worker alive in one shard (frontier/queue.py), on Redis's clock.
--
-- KEYS[1]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- ARGV[1]  this worker (its owner id)
--
-- Returns ZADD's reply (1 the first time, then 0).

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
return redis.call('ZADD', KEYS[1], now, ARGV[1])
