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

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local defaults_key = KEYS[3]

-- A slot's state (the same block in every slot_*.lua): its hash holds only what
-- differs from the default (the shard's default limits, else no limit; nothing
-- in flight; no start or back-off ahead), and a slot with nothing else than
-- priority 0 waiting has no hash. A slot with a hash has its priorities in use
-- in "prios" ("" for none); one without has "0" when its list of priority 0
-- exists, else none.
local FIELDS = {'prios', 'flight', 'conc', 'delay', 'next', 'backoff'}
local DEFAULT
do
  local d = redis.call('HMGET', defaults_key, 'conc', 'delay')
  DEFAULT = {prios = '0', flight = '0', conc = d[1] or '0', delay = d[2] or '0',
             next = '0', backoff = '0'}
end
local function load(h)
  local v = redis.call('HMGET', h, unpack(FIELDS))
  local s = {had = v, exists = (v[1] or v[2] or v[3] or v[4] or v[5] or v[6]) and true,
             prios = v[1] or '0', flight = v[2] or '0', conc = v[3] or DEFAULT.conc,
             delay = v[4] or DEFAULT.delay, next = v[5] or '0', backoff = v[6] or '0'}
  if s.exists and not v[1] then s.prios = '' end
  return s
end
-- The slot's priorities in use, exactly (an EXISTS for a slot without a hash);
-- kept in ``s`` (whose ``prios`` the caller then keeps exact).
local function prios_of(h, s)
  if not s.exists and not s.exact then
    s.exact = true
    if redis.call('EXISTS', h .. ':0') == 0 then s.prios = '' end
  end
  return s.prios
end
-- Writes what changed (``s.prios`` exact), leaves out what is the default, and
-- deletes the hash of a slot left with nothing but priority 0 (or none).
local function save(h, s)
  local set, del, other, had = nil, nil, false, s.had
  for k = 2, #FIELDS do
    local f = FIELDS[k]
    local value = s[f]
    if type(value) == 'number' then value = tostring(value) end
    if value == DEFAULT[f] then
      if had[k] then del = del or {}; del[#del + 1] = f end
    else
      other = true
      if value ~= had[k] then
        set = set or {}
        set[#set + 1] = f
        set[#set + 1] = value
      end
    end
  end
  if not other and (s.prios == '0' or s.prios == '') then
    if s.exists then redis.call('DEL', h) end
    return
  end
  if s.prios ~= had[1] then
    set = set or {}
    set[#set + 1] = 'prios'
    set[#set + 1] = s.prios
  end
  if del then redis.call('HDEL', h, unpack(del)) end
  if set then redis.call('HSET', h, unpack(set)) end
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
