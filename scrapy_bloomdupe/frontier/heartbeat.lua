-- Mark a worker alive in one shard (frontier/queue.py), on Redis's clock; in shard 0 record its
-- build in the same step, so a worker is never an owner without its build (frontier/builds.py).
-- KEYS[1] the shard's owners; KEYS[2] (shard 0) the builds. ARGV: owner id, its build
-- ("<version> <format>"), optional lease timeout ms. Returns ZADD's reply (1 the first time,
-- then 0); with ARGV[3], how many other workers are live.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if KEYS[2] then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
if not ARGV[3] then return added end
-- (ZRANGEBYSCORE, not ZCOUNT: a rule the ACL of docs/security.md already has)
return #redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[3]), '+inf') - 1
