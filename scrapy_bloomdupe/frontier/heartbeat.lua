-- Mark a worker alive in one shard (frontier/queue.py), on Redis's clock; in shard 0
-- record its build too, in the same step, so that a worker is never among the owners
-- without its build (frontier/builds.py).
--
-- KEYS[1]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- KEYS[2]  (shard 0) the crawl's builds (a hash: owner -> "<version> <format>")
-- ARGV[1]  this worker (its owner id)
-- ARGV[2]  (with KEYS[2]) its build, "<version> <format>"
--
-- Returns ZADD's reply (1 the first time, then 0).

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if KEYS[2] then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return redis.call('ZADD', KEYS[1], now, ARGV[1])
