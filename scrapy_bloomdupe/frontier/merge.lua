-- Merge a queue's other shards into shard 0 (frontier/queue.py): on one node the queue has one
-- shard; a crawl an earlier version queued there (a queue shard a filter shard) goes on.
-- KEYS[1] shard 0's queue; KEYS[2] its leases ("<owner>:<pop>.<j>" -> "<score>|<request>");
-- KEYS[3] its owners (-> last heartbeat, ms); then each other shard's queue, leases and owners.
-- Requests, leases (the reap gives them back once their owner is dead) and owners (the later
-- heartbeat) go into shard 0's; then the other keys are deleted: written before deleted, a script
-- stopped in between repeats, never loses. Returns how many requests and leases moved.
-- Nothing to move (every start after the first): one EXISTS (one per 999 keys).
local found = 0
for i = 4, #KEYS, 999 do
  found = found + redis.call('EXISTS', unpack(KEYS, i, math.min(i + 998, #KEYS)))
end
if found == 0 then return 0 end
local moved = 0
local beat = {}  -- shard 0's heartbeats (ZRANGE: the least-privilege ACL has no ZSCORE)
local current = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
for j = 1, #current, 2 do beat[current[j]] = tonumber(current[j + 1]) end
for i = 4, #KEYS, 3 do
  local items = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  for j = 1, #items, 2 do
    redis.call('ZADD', KEYS[1], items[j + 1], items[j])
  end
  local leases = redis.call('HGETALL', KEYS[i + 1])
  for j = 1, #leases, 2 do
    redis.call('HSET', KEYS[2], leases[j], leases[j + 1])
  end
  local owners = redis.call('ZRANGE', KEYS[i + 2], 0, -1, 'WITHSCORES')
  for j = 1, #owners, 2 do
    local at = tonumber(owners[j + 1])
    if not beat[owners[j]] or beat[owners[j]] < at then
      beat[owners[j]] = at
      redis.call('ZADD', KEYS[3], at, owners[j])
    end
  end
  moved = moved + #items / 2 + #leases / 2
  redis.call('DEL', KEYS[i], KEYS[i + 1], KEYS[i + 2])
end
return moved
