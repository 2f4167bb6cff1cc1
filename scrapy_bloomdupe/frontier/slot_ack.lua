-- Finish slot leases (frontier/slots.py): each frees its slot's room; a slot with requests goes
-- back into the ready set; an idle slot loses its hash (its next push brings its limits).
-- KEYS[1] the shard's ready set; KEYS[2] its slot-lease count (KEYS[2]..':'..owner: the owner's
-- list of "<pop>.<j>|<priority>[@<start>]|<slot>|<entry>"); KEYS[3] its default slot limits.
-- ARGV: slot prefix ("{K:i}:slot:"), owner, then the leases as its list holds them (from its
-- pops), or a finished move's entries (slot_claim.lua). Returns how many it finished; a lease no
-- longer in the list (acked, or reaped) changes nothing: an ack is safe to repeat.
-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local defaults_key = KEYS[3]
-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)
-- Each lease out of the list (LREM from the head: acks come in about the order taken); then
-- each slot once: room freed, back in the ready set with requests (never in it without room).
local held = KEYS[2] .. ':' .. ARGV[2]
local done, freed, order = 0, {}, {}
for j = 3, #ARGV do
  local e = ARGV[j]
  local gone = redis.call('LREM', held, 1, e) == 1
  if gone then done = done + 1 end
  -- A move's entry ("m|<score>|<entry>", slot_claim.lua) is in its slot now: no room to free.
  if gone and string.sub(e, 1, 2) ~= 'm|' then
    local bar = string.find(e, '|', string.find(e, '|', 1, true) + 1, true)
    local name = string.sub(e, bar + 1, string.find(e, '|', bar + 1, true) - 1)
    if not freed[name] then freed[name] = 0; order[#order + 1] = name end
    freed[name] = freed[name] + 1
  end
end
if done == 0 then return 0 end
redis.call('DECRBY', KEYS[2], done)
for _, name in ipairs(order) do
  local h = prefix .. name
  local s = load(h)
  local conc = tonumber(s.conc)
  local flight = math.max(tonumber(s.flight) - freed[name], 0)
  local at = math.max(tonumber(s.next), tonumber(s.backoff))
  local waiting = prios_of(h, s) ~= ''
  if not waiting and flight == 0 and at <= now then
    if s.exists then redis.call('DEL', h) end
  else
    s.flight = flight
    save(h, s)
    if waiting and (conc == 0 or flight < conc) then
      -- Already there (room before): keeps its place; else by its start ahead, or now.
      if at == 0 then at = now end
      redis.call('ZADD', KEYS[1], 'NX', at, name)
    end
  end
end
return done
