-- Put back the leases this worker holds in Redis but not in hand (frontier/queue.py):
-- one whose pop reply never arrived, or whose ack was lost with a master that a
-- failover replaced (its work, written there too, is lost: it is done again).
--
-- KEYS[1]  the shard's queue (a sorted set)
-- KEYS[2]  the shard's leases (a hash: "<owner>:<pop>.<j>" -> "<score>|<request>")
-- ARGV[1]  this worker (its owner id)
-- ARGV[2..] the fields of the leases it holds (taken and not yet done)
--
-- Returns how many went back (uncounted: not an expired lease).

-- A lease back in the queue from the lease hash: queued first, so a script stopped
-- in between repeats a request rather than losing it. With "counted" (its lease
-- expired) the member carries one more requeue: NUL "rq" <n> NUL, then the
-- request. Returns the member queued.
local function requeue(field, entry, counted)
  local bar = string.find(entry, "|", 1, true)
  local member = string.sub(entry, bar + 1)
  if counted then
    local n = 0
    if string.sub(member, 1, 3) == "\0rq" then
      local stop = string.find(member, "\0", 4, true)
      n = tonumber(string.sub(member, 4, stop - 1))
      member = string.sub(member, stop + 1)
    end
    member = "\0rq" .. (n + 1) .. "\0" .. member
  end
  redis.call("ZADD", KEYS[1], string.sub(entry, 1, bar - 1), member)
  redis.call("HDEL", KEYS[2], field)
  return member
end

local held = {}
for i = 2, #ARGV do held[ARGV[i]] = true end
local prefix = ARGV[1] .. ':'
local back = 0
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local field = all[j]
  if string.sub(field, 1, #prefix) == prefix and not held[field] then
    requeue(field, all[j + 1], false)
    back = back + 1
  end
end
return back
