-- Give back the slot leases of dead workers (frontier/slots.py): any live worker
-- runs it.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the shard's count of slot leases (a string); KEYS[2] .. ':' .. owner is
--          the owner's leases (a list of "<pop>.<j>|<priority>[@<start>]|<slot>|<entry>",
--          each lease's field "<owner>:<pop>.<j>")
-- KEYS[3]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- KEYS[4]  the shard's default limits of a slot (a hash: conc, delay)
-- ARGV[1]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[2]  the lease timeout in ms
-- KEYS[5]  the shard's count of requests waiting in its slots (a string)
-- KEYS[6]  the shard's intake (a sorted set), where a dead owner's entries in a
--          move (slot_claim.lua: "m|<score>|<entry>" in its list) go back
-- ARGV[3]  an owner whose leases go back now whatever its heartbeat ('' for
--          none): a worker that closes gives back what it took and did not start
-- ARGV[4]  '1' to forget the dead owners (ZREM from KEYS[3]); '0' when the
--          shard's other reap (reap.lua, in the same round trip) does it
-- ARGV[5..] fields of ARGV[3]'s leases that stay (the ones it still holds: a
--          reclaim; "<owner>:m" keeps its entries in a move, one it will end);
--          without any, all of ARGV[3]'s go back
--
-- Every lease of an owner with no heartbeat for ARGV[2] ms goes back to the head
-- of its slot's list of its priority, with one more requeue counted (NUL "rq" <n>
-- NUL before the entry, as frontier/entry.py reads it), frees its room, and the
-- owner is forgotten; the leases of ARGV[3] go back uncounted. Keys touched
-- beyond KEYS: the slots' hashes and lists (the shard's hash tag).
-- Returns {what went back for dead owners, as "<priority>|<slot>|<entry>" (the entry
-- with its requeue count), the fields of ARGV[3]'s leases that went back, how many
-- entries in a move went back to the intake}.

-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local defaults_key = KEYS[4]

-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)

local dead = {}
for _, owner in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[2]))) do
  dead[owner] = true
end
if ARGV[3] ~= '' then dead[ARGV[3]] = true end
if next(dead) == nil then return {{}, {}, 0} end
local keep = {}
for k = 5, #ARGV do keep[ARGV[k]] = true end
local back, slots, gone, own, counted, intake = 0, {}, {}, {}, {}, {}
for owner in pairs(dead) do
  local held = KEYS[2] .. ':' .. owner
  local all, kept, going = redis.call('LRANGE', held, 0, -1), {}, {}
  for _, e in ipairs(all) do
    local bar = string.find(e, '|', 1, true)
    local field = owner .. ':' .. string.sub(e, 1, bar - 1)
    if owner == ARGV[3] and keep[field] then
      kept[#kept + 1] = e
    elseif string.sub(e, 1, 2) == 'm|' then
      local second = string.find(e, '|', 3, true)
      intake[#intake + 1] = string.sub(e, 3, second - 1)
      intake[#intake + 1] = string.sub(e, second + 1)
    else
      going[#going + 1] = {field, string.sub(e, bar + 1), owner}
    end
  end
  -- Latest taken first: each goes to its list's head, so they end in the order taken.
  for j = #going, 1, -1 do gone[#gone + 1] = going[j] end
  if #all > 0 then
    redis.call('DEL', held)
    chunked('RPUSH', held, kept)
  end
end
for _, item in ipairs(gone) do
  local field, value, owner = item[1], item[2], item[3]
  local bar = string.find(value, '|', 1, true)
  local second = string.find(value, '|', bar + 1, true)
  -- A lease claimed ahead has its start after its priority ("<priority>@<start>").
  local p = string.match(string.sub(value, 1, bar - 1), '^[^@]*')
  local name = string.sub(value, bar + 1, second - 1)
  local e = string.sub(value, second + 1)
  if owner == ARGV[3] then
    own[#own + 1] = field
  else
    local n = 0
    if string.sub(e, 1, 3) == '\0rq' then
      local stop = string.find(e, '\0', 4, true)
      n = tonumber(string.sub(e, 4, stop - 1))
      e = string.sub(e, stop + 1)
    end
    e = '\0rq' .. (n + 1) .. '\0' .. e
    counted[#counted + 1] = p .. '|' .. name .. '|' .. e
  end
  local h = prefix .. name
  local s = slots[name]
  if not s then
    s = load(h)
    s.prios = prios_of(h, s)
    slots[name] = s
  end
  if redis.call('LPUSH', h .. ':' .. p, e) == 1 then s.prios = with_priority(s.prios, p) end
  s.flight = math.max(tonumber(s.flight) - 1, 0)
  back = back + 1
end
for name, s in pairs(slots) do place(name, s, now, false) end
if back > 0 then
  redis.call('INCRBY', KEYS[5], back)
  redis.call('DECRBY', KEYS[2], back)
end
if #intake > 0 then
  for i = 1, #intake, 1000 do
    redis.call('ZADD', KEYS[6], unpack(intake, i, math.min(i + 999, #intake)))
  end
  redis.call('DECRBY', KEYS[2], math.floor(#intake / 2))
end
if ARGV[4] == '1' then
  for owner in pairs(dead) do
    if owner ~= ARGV[3] then redis.call('ZREM', KEYS[3], owner) end
  end
end
return {counted, own, math.floor(#intake / 2)}
