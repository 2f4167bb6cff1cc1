-- Give back the leases of dead workers (frontier/queue.py); any live worker runs it.
-- KEYS[1] the shard's queue; KEYS[2] its leases ("<owner>:<pop>.<j>" -> "<score>|<request>");
-- KEYS[3] its owners. ARGV: lease timeout ms; an owner whose leases go back now whatever its
-- heartbeat ('' none: a closing worker gives back what it did not start); optional: the slot-lease
-- count key (slots.py): a dead owner with a "<count>:<owner>" list stays known, as slot_reap.lua,
-- a round trip earlier, may have found it alive: forgotten, its slot leases would never come back.
-- A silent (or forgotten) owner's leases go back with their score and one more requeue counted,
-- and it is forgotten; ARGV[2]'s go back uncounted.
-- Returns what went back for dead owners, as "<score>|<member queued>" (a pop's entries' shape).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- A lease back in the queue: queued before its HDEL, so a script stopped in between repeats a
-- request rather than losing it. "counted" (expired): one more requeue, NUL "rq" <n> NUL first.
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
