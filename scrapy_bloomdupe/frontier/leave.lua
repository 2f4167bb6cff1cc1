-- A worker leaves the crawl (frontier/queue.py): is it the last one? KEYS[1] shard 0's owners
-- (-> last heartbeat, ms). ARGV: owner id, lease timeout ms. Returns 1 when no other worker
-- heartbeat within the timeout (Redis's clock), else 0.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[2]), '+inf')
if #live == 0 then return 1 end
return 0
