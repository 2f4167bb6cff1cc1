-- Queue requests into their download slots' lists (frontier/slots.py), once: a
-- retry after a lost reply queues nothing again.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  this client's push record for the shard
-- ARGV[1]  this push's number (this client's, increasing)
-- ARGV[2]  the record's TTL in ms
-- ARGV[3]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[4..] per request: its slot's name (keys.slot_name), its priority, the
--          slot's concurrency (0: no limit) and delay in ms, the entry's bytes
--
-- Appends each entry to "<prefix><slot>:<priority>" and counts it in the slot's
-- hash (fields: prios, the priorities in use, highest first, comma-separated;
-- waiting; flight; conc; delay; next, the next allowed start; backoff, paused
-- until; both ms on Redis's clock), whose limits the push sets; a slot with room
-- goes (back) into the ready set. Keys touched beyond KEYS: the slots' hashes
-- and lists, all in the shard's hash tag (one Cluster slot; see slots.py).
-- Returns how many it queued, or -1 when this push already ran (a retry).

if redis.call('GET', KEYS[2]) == ARGV[1] then return -1 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[3]

local function with_priority(prios, p)
  local out, put = {}, false
  for x in string.gmatch(prios, '[^,]+') do
    local n = tonumber(x)
    if n == p then return prios end
    if not put and n < p then out[#out + 1] = tostring(p); put = true end
    out[#out + 1] = x
  end
  if not put then out[#out + 1] = tostring(p) end
  return table.concat(out, ',')
end

local touched = {}
for j = 4, #ARGV, 5 do
  local name, p = ARGV[j], tonumber(ARGV[j + 1])
  local h = prefix .. name
  if redis.call('RPUSH', h .. ':' .. p, ARGV[j + 4]) == 1 then
    local prios = redis.call('HGET', h, 'prios') or ''
    redis.call('HSET', h, 'prios', with_priority(prios, p))
  end
  redis.call('HINCRBY', h, 'waiting', 1)
  redis.call('HSET', h, 'conc', ARGV[j + 2], 'delay', ARGV[j + 3])
  touched[name] = true
end
for name in pairs(touched) do
  local h = prefix .. name
  local v = redis.call('HMGET', h, 'waiting', 'flight', 'conc', 'next', 'backoff')
  local flight, conc = tonumber(v[2]) or 0, tonumber(v[3]) or 0
  if conc == 0 or flight < conc then
    redis.call('ZADD', KEYS[1], math.max(tonumber(v[4]) or 0, tonumber(v[5]) or 0), name)
  end
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return (#ARGV - 3) / 5
