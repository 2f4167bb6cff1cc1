-- Finish leases of requests taken from the slots (frontier/slots.py): each frees
-- its slot's room, and the slot goes back into the ready set when it has requests.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the shard's slot leases (a hash: field -> "<priority>|<slot>|<entry>")
-- ARGV[1]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[2..] the leases' fields
--
-- A field no longer in the hash (acked already, or reaped) changes nothing, so
-- an ack is safe to repeat. A slot with nothing waiting, nothing in flight and
-- no start or back-off ahead loses its hash. Keys touched beyond KEYS: the
-- slots' hashes (the shard's hash tag).
-- Returns how many leases it finished.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]

local function place(name, now)
  local h = prefix .. name
  local v = redis.call('HMGET', h, 'waiting', 'flight', 'conc', 'next', 'backoff')
  local waiting, flight = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  local conc = tonumber(v[3]) or 0
  local at = math.max(tonumber(v[4]) or 0, tonumber(v[5]) or 0)
  if waiting > 0 and (conc == 0 or flight < conc) then
    redis.call('ZADD', KEYS[1], at, name)
  else
    redis.call('ZREM', KEYS[1], name)
    if waiting == 0 and flight == 0 and at <= now then redis.call('DEL', h) end
  end
end

local done, slots = 0, {}
for j = 2, #ARGV do
  local value = redis.call('HGET', KEYS[2], ARGV[j])
  if value then
    local bar = string.find(value, '|', 1, true)
    local name = string.sub(value, bar + 1, string.find(value, '|', bar + 1, true) - 1)
    redis.call('HDEL', KEYS[2], ARGV[j])
    if redis.call('HINCRBY', prefix .. name, 'flight', -1) < 0 then
      redis.call('HSET', prefix .. name, 'flight', 0)
    end
    slots[name] = true
    done = done + 1
  end
end
for name in pairs(slots) do place(name, now) end
return done
