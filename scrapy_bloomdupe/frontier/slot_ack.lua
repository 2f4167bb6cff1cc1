-- Finish leases of requests taken from the slots (frontier/slots.py): each frees
-- its slot's room, and the slot goes back into the ready set when it has requests.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the shard's slot leases (a hash: field -> "<priority>[@<start>]|<slot>|<entry>")
-- KEYS[3]  the shard's default limits of a slot (a hash: conc, delay)
-- ARGV[1]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[2..] the leases' fields
--
-- A field no longer in the hash (acked already, or reaped) changes nothing, so
-- an ack is safe to repeat. A slot with nothing waiting, nothing in flight and
-- no start or back-off ahead loses its hash (its limits come with its next push). Keys touched beyond KEYS: the
-- slots' hashes (the shard's hash tag).
-- Returns how many leases it finished.

-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local defaults_key = KEYS[3]

-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)

-- Every lease's value in one HMGET, deleted in one HDEL (a call a 1,000); then each slot once: its
-- room freed, back in the ready set when it has requests (it was not in it while
-- it had none or no room, so nothing leaves it here).
local fields = {}
for j = 2, #ARGV do fields[#fields + 1] = ARGV[j] end
if #fields == 0 then return 0 end
local values = {}
for i = 1, #fields, 1000 do
  local part = redis.call('HMGET', KEYS[2], unpack(fields, i, math.min(i + 999, #fields)))
  for k = 1, #part do values[i + k - 1] = part[k] end
end
local held, freed, order = {}, {}, {}
for j = 1, #fields do
  local value = values[j]
  if value then
    held[#held + 1] = fields[j]
    local bar = string.find(value, '|', 1, true)
    local name = string.sub(value, bar + 1, string.find(value, '|', bar + 1, true) - 1)
    if not freed[name] then freed[name] = 0; order[#order + 1] = name end
    freed[name] = freed[name] + 1
  end
end
if #held == 0 then return 0 end
chunked('HDEL', KEYS[2], held)
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
return #held
