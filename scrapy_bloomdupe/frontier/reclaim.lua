-- Put back the leases this worker holds in Redis but not in hand (frontier/queue.py):
-- one whose pop reply never arrived, one whose ack it dropped because the master
-- changed since it was taken, or whose ack was lost with a master that a failover
-- replaced (its work, written there too, is lost: it is done again).
--
-- KEYS[1]  the shard's queue (a sorted set)
-- KEYS[2]  the shard's leases (a hash: "<owner>:<pop>.<j>" -> "<score>|<request>")
-- ARGV[1]  this worker (its owner id)
-- ARGV[2..] the fields of the leases it holds (taken and not yet done)
--
-- Returns the fields of the leases that went back (uncounted: not an expired lease);
-- the caller tells from them why each was not held.

local held = {}
for i = 2, #ARGV do held[ARGV[i]] = true end
local prefix = ARGV[1] .. ':'
local back = {}
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local field = all[j]
  if string.sub(field, 1, #prefix) == prefix and not held[field] then
    -- Queued first, then the lease deleted: stopped in between, a request is
    -- repeated rather than lost.
    local entry = all[j + 1]
    local bar = string.find(entry, '|', 1, true)
    redis.call('ZADD', KEYS[1], string.sub(entry, 1, bar - 1), string.sub(entry, bar + 1))
    redis.call('HDEL', KEYS[2], field)
    back[#back + 1] = field
  end
end
return back
