-- Give back the slot leases of dead workers (frontier/slots.py); any live worker runs it.
-- KEYS[1] the shard's ready set; KEYS[2] its slot-lease count (KEYS[2]..':'..owner: the owner's
-- list of "<pop>.<j>|<priority>[@<start>]|<slot>|<entry>", field "<owner>:<pop>.<j>"); KEYS[3]
-- its owners; KEYS[4] its default slot limits; KEYS[5] its waiting count; KEYS[6] its intake,
-- where a dead owner's moving entries ("m|<score>|<entry>", slot_claim.lua) go back. ARGV: slot
-- prefix, lease timeout ms, an owner whose leases go back now whatever its heartbeat ('' none: a
-- closing worker gives back what it did not start), '1' to forget the dead owners ('0': reap.lua
-- does, in the same round trip), then fields of that owner's leases that stay (a reclaim;
-- "<owner>:m" keeps its move, one it will end); none: all go back. A silent owner's leases go back
-- to the head of their slot's priority list, one more requeue counted (NUL "rq" <n> NUL before the
-- entry, frontier/entry.py); ARGV[3]'s go back uncounted.
-- Returns {what went back for dead owners, "<priority>|<slot>|<entry>", the fields of ARGV[3]'s
-- that went back, how many moving entries went back to the intake}.
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
  for j = #going, 1, -1 do gone[#gone + 1] = going[j] end  -- LPUSHed: they end in order taken
  if #all > 0 then
    redis.call('DEL', held)
    chunked('RPUSH', held, kept)
  end
end
for _, item in ipairs(gone) do
  local field, value, owner = item[1], item[2], item[3]
  local bar = string.find(value, '|', 1, true)
  local second = string.find(value, '|', bar + 1, true)
  local p = string.match(string.sub(value, 1, bar - 1), '^[^@]*')  -- "<priority>@<start>"
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
