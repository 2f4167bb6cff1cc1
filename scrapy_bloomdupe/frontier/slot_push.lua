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
local prefix = ARGV[3]

-- The priorities in use, highest first, with ``p`` (its own spelling, that of its
-- list's key, compared as a number).
local function with_priority(prios, p)
  local out, put, n = {}, false, tonumber(p)
  for x in string.gmatch(prios, '[^,]+') do
    if x == p then return prios end
    if not put and tonumber(x) < n then out[#out + 1] = p; put = true end
    out[#out + 1] = x
  end
  if not put then out[#out + 1] = p end
  return table.concat(out, ',')
end

-- A command over many arguments, in calls of at most 1,000 (Lua's unpack has a
-- limit); returns the last call's reply.
local function chunked(command, key, items)
  local reply
  for i = 1, #items, 1000 do
    reply = redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
  return reply
end

-- Grouped by slot, then by priority: one RPUSH a list, one HMGET and one HSET a
-- slot, one ZADD for the ready set.
local slots, order = {}, {}
for j = 4, #ARGV, 5 do
  local name, p = ARGV[j], ARGV[j + 1]
  local slot = slots[name]
  if not slot then
    slot = {lists = {}, prios = {}, n = 0}
    slots[name] = slot
    order[#order + 1] = name
  end
  slot.conc, slot.delay, slot.n = ARGV[j + 2], ARGV[j + 3], slot.n + 1
  local list = slot.lists[p]
  if not list then
    list = {}
    slot.lists[p] = list
    slot.prios[#slot.prios + 1] = p
  end
  list[#list + 1] = ARGV[j + 4]
end
local ready, full = {}, {}
for _, name in ipairs(order) do
  local slot, h = slots[name], prefix .. name
  local v = redis.call('HMGET', h, 'prios', 'waiting', 'flight', 'next', 'backoff')
  local prios = v[1] or ''
  for _, p in ipairs(slot.prios) do
    if chunked('RPUSH', h .. ':' .. p, slot.lists[p]) == #slot.lists[p] then
      prios = with_priority(prios, p)
    end
  end
  redis.call('HSET', h, 'prios', prios, 'waiting', (tonumber(v[2]) or 0) + slot.n,
             'conc', slot.conc, 'delay', slot.delay)
  local conc = tonumber(slot.conc)
  if conc == 0 or (tonumber(v[3]) or 0) < conc then
    ready[#ready + 1] = math.max(tonumber(v[4]) or 0, tonumber(v[5]) or 0)
    ready[#ready + 1] = name
  else
    full[#full + 1] = name  -- a lower limit than its leases: no room until acks
  end
end
chunked('ZADD', KEYS[1], ready)
chunked('ZREM', KEYS[1], full)
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return (#ARGV - 3) / 5
