-- Put back the leases this worker holds in Redis but not in hand (frontier/queue.py): a pop
-- reply that never arrived, an ack dropped because the master changed since, or lost with a
-- master a failover replaced (its work, written there too, is lost: it is done again).
-- KEYS[1] the shard's queue; KEYS[2] its leases. ARGV: owner id, the fields of the leases it holds.
-- Returns the fields that went back (uncounted: not expired); the caller tells why from them.
local held = {}
for i = 2, #ARGV do held[ARGV[i]] = true end
local prefix = ARGV[1] .. ':'
local back = {}
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local field = all[j]
  if string.sub(field, 1, #prefix) == prefix and not held[field] then
    -- Queued before the lease is deleted: stopped in between, a request repeats, never lost.
    local entry = all[j + 1]
    local bar = string.find(entry, '|', 1, true)
    redis.call('ZADD', KEYS[1], string.sub(entry, 1, bar - 1), string.sub(entry, bar + 1))
    redis.call('HDEL', KEYS[2], field)
    back[#back + 1] = field
  end
end
return back
