-- Give back the leases of dead workers (frontier/queue.py): any live worker runs it.
--
-- KEYS[1]  the shard's queue (a sorted set)
-- KEYS[2]  the shard's leases (a hash: "<owner>:<pop>.<j>" -> "<score>|<request>")
-- KEYS[3]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- ARGV[1]  the lease timeout in ms
-- ARGV[2]  an owner whose leases go back now whatever its heartbeat ('' for
--          none): a worker that closes gives back what it took and did not start
-- ARGV[3]  optional: the shard's count of slot leases (frontier/slots.py), whose
--          "<count>:<owner>" lists hold the owners' slot leases. A dead owner with
--          such a list is not forgotten: slot_reap.lua gives those back (it ran a
--          round trip before, when this owner's heartbeat may have been just short
--          of the timeout; forgotten now, its slot leases would never come back)
--
-- Every lease of an owner with no heartbeat for ARGV[1] ms (or none: forgotten)
-- goes back to the queue with its score and one more requeue counted, and the
-- owner is forgotten; the leases of ARGV[2] go back uncounted. Returns what went back
-- for dead owners, as "<score>|<member queued>" (a pop's entries' shape).

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)

-- A lease back in the queue from the lease hash: queued first, so a script stopped
-- in between repeats a request rather than losing it. With "counted" (its lease
-- expired) the member carries one more requeue: NUL "rq" <n> NUL, then the
-- request. Returns "<score>|<member queued>".
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
  local score = string.sub(entry, 1, bar - 1)
  redis.call("ZADD", KEYS[1], score, member)
  redis.call("HDEL", KEYS[2], field)
  return score .. "|" .. member
end

local dead = {}
for _, owner in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[1]))) do
  dead[owner] = true
end
if ARGV[2] ~= '' then dead[ARGV[2]] = true end
local back, known = {}, {}
for _, owner in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do known[owner] = true end
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local field = all[j]
  local owner = string.sub(field, 1, string.find(field, ':', 1, true) - 1)
  if not known[owner] then
    dead[owner] = true  -- forgotten already (slot_reap.lua forgets the dead owners)
  end
  if dead[owner] then
    local queued = requeue(field, all[j + 1], owner ~= ARGV[2])
    if owner ~= ARGV[2] then back[#back + 1] = queued end
  end
end
for owner in pairs(dead) do
  if not ARGV[3] or redis.call('EXISTS', ARGV[3] .. ':' .. owner) == 0 then
    redis.call('ZREM', KEYS[3], owner)
  end
end
return back
