-- A block, not a script: slot_push.lua and sink.lua include it after slot_state.lua.
-- queue_in_slots(items, first, ready_key, waiting_key, intake, robots_key) appends ``items``
-- from ``first`` to their slots' lists, five a request: slot name (keys.slot_name), priority as
-- its list's key spells it, concurrency (0: none), delay ms (at least the slot's robots.txt one,
-- ``robots_key``), entry bytes; with an ``intake`` (a move) only those this call removes from it.
-- Keeps slot state (slot_state.lua); a slot with room joins ``ready_key`` (keeping its place);
-- ``waiting_key`` counts. Returns how many it queued.
local function queue_in_slots(items, first, ready_key, waiting_key, intake, robots_key)
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
    if robots_key then
      local asked = redis.call('HGET', robots_key, name)
      if asked and tonumber(asked) > tonumber(slot.delay) then slot.delay = asked end
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
    redis.call('ZADD', ready_key, 'NX', unpack(ready, i, math.min(i + 999, #ready)))
  end
  chunked('ZREM', ready_key, full)
  if queued > 0 then redis.call('INCRBY', waiting_key, queued) end
  return queued
end
