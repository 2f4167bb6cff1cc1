-- Finish leases of requests taken from the slots (frontier/slots.py): each frees
-- its slot's room, and the slot goes back into the ready set when it has requests.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the shard's count of slot leases (a string); KEYS[2] .. ':' .. owner is
--          the owner's leases (a list of "<pop>.<j>|<priority>[@<start>]|<slot>|<entry>")
-- KEYS[3]  the shard's default limits of a slot (a hash: conc, delay)
-- ARGV[1]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[2]  the owner
-- ARGV[3..] the leases, each as its list holds it (the owner got each from its pop),
--          or the entries of a move that is done (slot_claim.lua)
--
-- A lease no longer in the list (acked already, or reaped) changes nothing, so
-- an ack is safe to repeat. A slot with nothing waiting, nothing in flight and
-- no start or back-off ahead loses its hash (its limits come with its next push). Keys touched beyond KEYS: the
-- owner's list and the slots' hashes (the shard's hash tag).
-- Returns how many leases it finished.

-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local defaults_key = KEYS[3]

-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)

-- Each lease out of the list (an LREM from its head: acks come about in the order
-- taken); then each slot once: its room freed, back in the ready set when it has
-- requests (it was not in it while it had none or no room, so nothing leaves it here).
local held = KEYS[2] .. ':' .. ARGV[2]
local done, freed, order = 0, {}, {}
for j = 3, #ARGV do
  local e = ARGV[j]
  local gone = redis.call('LREM', held, 1, e) == 1
  if gone then done = done + 1 end
  -- A move's entry ("m|<score>|<entry>", slot_claim.lua) is in its slot now: no room
  -- to free.
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
      -- Already there (room before this ack): keeps its place; else by its start
      -- ahead, or now (none kept: behind those waiting already).
      if at == 0 then at = now end
      redis.call('ZADD', KEYS[1], 'NX', at, name)
    end
  end
end
return done
