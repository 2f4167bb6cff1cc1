-- Give back the slot leases of dead workers (frontier/slots.py): any live worker
-- runs it.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the shard's slot leases (a hash: "<owner>:<pop>.<j>" ->
--          "<priority>|<slot>|<entry>")
-- KEYS[3]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- ARGV[1]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[2]  the lease timeout in ms
-- ARGV[3]  an owner whose leases go back now whatever its heartbeat ('' for
--          none): a worker that closes gives back what it took and did not start
--
-- Every lease of an owner with no heartbeat for ARGV[2] ms goes back to the head
-- of its slot's list of its priority, with one more requeue counted (NUL "rq" <n>
-- NUL before the entry, as frontier/entry.py reads it), frees its room, and the
-- owner is forgotten; the leases of ARGV[3] go back uncounted. Keys touched
-- beyond KEYS: the slots' hashes and lists (the shard's hash tag).
-- Returns how many leases went back.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]

local function place(name, now)
  local h = prefix .. name
  local v = redis.call('HMGET', h, 'waiting', 'flight', 'conc', 'next', 'backoff')
  local waiting, flight = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  local conc = tonumber(v[3]) or 0
  local at = math.max(tonumber(v[4]) or 0, tonumber(v[5]) or 0)
  if waiting > 0 and (conc == 0 or flight < conc) then
    redis.call('ZADD', KEYS[1], at, name)
  else
    redis.call('ZREM', KEYS[1], name)
    if waiting == 0 and flight == 0 and at <= now then redis.call('DEL', h) end
  end
end

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

local dead = {}
for _, owner in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[2]))) do
  dead[owner] = true
end
if ARGV[3] ~= '' then dead[ARGV[3]] = true end
if next(dead) == nil then return 0 end
local back, slots, gone = 0, {}, {}
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local field, value = all[j], all[j + 1]
  local colon = string.find(field, ':', 1, true)
  local owner = string.sub(field, 1, colon - 1)
  if dead[owner] then
    local dot = string.find(field, '.', colon, true)
    gone[#gone + 1] = {field, value, owner, tonumber(string.sub(field, colon + 1, dot - 1)),
                       tonumber(string.sub(field, dot + 1))}
  end
end
-- Latest taken first: each goes to its list's head, so they end in the order taken.
table.sort(gone, function(a, b)
  if a[4] ~= b[4] then return a[4] > b[4] end
  return a[5] > b[5]
end)
for _, item in ipairs(gone) do
  local field, value, owner = item[1], item[2], item[3]
  local bar = string.find(value, '|', 1, true)
  local second = string.find(value, '|', bar + 1, true)
  local p = string.sub(value, 1, bar - 1)
  local name = string.sub(value, bar + 1, second - 1)
  local e = string.sub(value, second + 1)
  if owner ~= ARGV[3] then
    local n = 0
    if string.sub(e, 1, 3) == '\0rq' then
      local stop = string.find(e, '\0', 4, true)
      n = tonumber(string.sub(e, 4, stop - 1))
      e = string.sub(e, stop + 1)
    end
    e = '\0rq' .. (n + 1) .. '\0' .. e
  end
  local h = prefix .. name
  if redis.call('LPUSH', h .. ':' .. p, e) == 1 then
    redis.call('HSET', h, 'prios', with_priority(redis.call('HGET', h, 'prios') or '', p))
  end
  redis.call('HINCRBY', h, 'waiting', 1)
  if redis.call('HINCRBY', h, 'flight', -1) < 0 then redis.call('HSET', h, 'flight', 0) end
  redis.call('HDEL', KEYS[2], field)
  slots[name] = true
  back = back + 1
end
for name in pairs(slots) do place(name, now) end
for owner in pairs(dead) do redis.call('ZREM', KEYS[3], owner) end
return back
