-- Queue requests into their download slots' lists (frontier/slots.py), once: a
-- retry after a lost reply queues nothing again.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  this client's push record for the shard
-- KEYS[3]  the shard's default limits of a slot (a hash: conc, delay)
-- KEYS[4]  the shard's count of requests waiting in its slots (a string)
-- KEYS[5]  optional: the shard's intake (a sorted set: the filter's sink); an
--          entry is queued only if this call removed it from there (a move,
--          safe to repeat: a retry, or another worker's move, queues nothing)
-- ARGV[1]  this push's number (this client's, increasing); '' for a move from
--          the intake (no record)
-- ARGV[2]  the record's TTL in ms
-- ARGV[3]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[1]  'take' instead: move the intake's first ARGV[5] entries (highest
--          priority first) into slot ARGV[4] (its limits the shard's defaults),
--          read here (no entry goes to the client and back)
-- ARGV[4..] per request: its slot's name (keys.slot_name), its priority, the
--          slot's concurrency (0: no limit) and delay in ms, the entry's bytes
--
-- Appends each entry to "<prefix><slot>:<priority>" and keeps the slot's state
-- (its hash, see below: prios, the priorities in use, highest first,
-- comma-separated; flight; conc; delay; next, the next allowed start; backoff,
-- paused until; both ms on Redis's clock), whose limits the push sets; a slot
-- with room goes into the ready set (one already there keeps its place). Keys
-- touched beyond KEYS: the slots' hashes and lists, all in the shard's hash tag
-- (one Cluster slot; see slots.py).
-- Returns how many it queued, or -1 when this push already ran (a retry).

-- #include slot_acl.lua (the ACL asked before anything is written)
local take = ARGV[1] == 'take'
if ARGV[1] ~= '' and not take and redis.call('GET', KEYS[2]) == ARGV[1] then return -1 end
-- The requests, five values each (slot, priority, conc, delay, entry).
local items = ARGV
local first = 4
if take then
  local d = redis.call('HMGET', KEYS[3], 'conc', 'delay')
  local found = redis.call('ZRANGE', KEYS[5], 0, tonumber(ARGV[5]) - 1, 'WITHSCORES')
  items, first = {}, 1
  for k = 1, #found, 2 do
    local n = #items
    -- "%d": a priority as its list's key spells it (never "-0" nor "1e+15")
    items[n + 1], items[n + 2] = ARGV[4], string.format('%d', -tonumber(found[k + 1]))
    items[n + 3], items[n + 4], items[n + 5] = d[1] or '0', d[2] or '0', found[k]
  end
end
local intake = KEYS[5]
local prefix = ARGV[3]
local defaults_key = KEYS[3]

-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)

-- Grouped by slot, then by priority: one RPUSH a list, one HMGET and at most one
-- HSET a slot, one ZADD for the ready set.
local slots, order = {}, {}
local queued = 0
for j = first, #items, 5 do
  local name, p = items[j], items[j + 1]
  if intake and redis.call('ZREM', intake, items[j + 4]) == 0 then
    name = nil  -- moved already (a retry, another worker), or never there
  end
  if name then
  queued = queued + 1
  local slot = slots[name]
  if not slot then
    slot = {lists = {}, prios = {}, n = 0}
    slots[name] = slot
    order[#order + 1] = name
  end
  slot.conc, slot.delay, slot.n = items[j + 2], items[j + 3], slot.n + 1
  local list = slot.lists[p]
  if not list then
    list = {}
    slot.lists[p] = list
    slot.prios[#slot.prios + 1] = p
  end
  list[#list + 1] = items[j + 4]
  end
end
local ready, full = {}, {}
for _, name in ipairs(order) do
  local slot, h = slots[name], prefix .. name
  local s = load(h)
  local prios = s.prios
  if not s.exists and not slot.lists['0'] then prios = prios_of(h, s) end  -- else "0" in it
  for _, p in ipairs(slot.prios) do
    if chunked('RPUSH', h .. ':' .. p, slot.lists[p]) == #slot.lists[p] then
      prios = with_priority(prios, p)
    end
  end
  s.prios, s.conc, s.delay = prios, slot.conc, slot.delay
  save(h, s)
  local conc = tonumber(slot.conc)
  if conc == 0 or tonumber(s.flight) < conc then
    ready[#ready + 1] = math.max(tonumber(s.next), tonumber(s.backoff))
    ready[#ready + 1] = name
  else
    full[#full + 1] = name  -- a lower limit than its leases: no room until acks
  end
end
for i = 1, #ready, 1000 do
  redis.call('ZADD', KEYS[1], 'NX', unpack(ready, i, math.min(i + 999, #ready)))
end
chunked('ZREM', KEYS[1], full)
if queued > 0 then redis.call('INCRBY', KEYS[4], queued) end
if ARGV[1] ~= '' and not take then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2]) end
return queued
