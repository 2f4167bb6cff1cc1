-- A block, not a script: every slot_*.lua includes it. Reads ``defaults_key`` (the shard's
-- default limits); defines FIELDS, DEFAULT, read_defaults, load, prios_of, save, chunked,
-- with_priority and place (which reads ``prefix`` and KEYS[1], the ready set). A slot's hash holds
-- only what differs from the default (the shard's limits, else none; nothing in flight; no next
-- start or paused-until ahead, ms on Redis's clock); a slot with only priority 0 waiting has none.
-- "prios": priorities in use, highest first ("" none); no hash: "0" if the priority-0 list exists.
-- Slot scripts also touch undeclared slot hashes and lists, all in the shard's hash tag.
local FIELDS = {'prios', 'flight', 'conc', 'delay', 'next', 'backoff'}
local DEFAULT
-- DEFAULT from ``defaults_key`` (read again by the filter's sink, sink.lua, a shard at a time).
local function read_defaults()
  local d = redis.call('HMGET', defaults_key, 'conc', 'delay')
  DEFAULT = {prios = '0', flight = '0', conc = d[1] or '0', delay = d[2] or '0',
             next = '0', backoff = '0'}
end
if defaults_key then read_defaults() end
local function load(h)
  local v = redis.call('HMGET', h, unpack(FIELDS))
  local s = {had = v, exists = (v[1] or v[2] or v[3] or v[4] or v[5] or v[6]) and true,
             prios = v[1] or '0', flight = v[2] or '0', conc = v[3] or DEFAULT.conc,
             delay = v[4] or DEFAULT.delay, next = v[5] or '0', backoff = v[6] or '0'}
  if s.exists and not v[1] then s.prios = '' end
  return s
end
-- The slot's priorities in use, exactly (an EXISTS without a hash), kept in ``s``.
local function prios_of(h, s)
  if not s.exists and not s.exact then
    s.exact = true
    if redis.call('EXISTS', h .. ':0') == 0 then s.prios = '' end
  end
  return s.prios
end
-- Writes what changed (``s.prios`` exact) but defaults; deletes a hash left with only priority 0.
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
-- A command over many arguments in calls of 1,000 at most (unpack's limit); the last reply.
local function chunked(command, key, items)
  local reply
  for i = 1, #items, 1000 do
    reply = redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
  return reply
end
-- The priorities in use, highest first, with ``p`` (as its list's key spells it) added.
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
-- Writes slot ``name`` 's state ``s``; in the ready set when it has requests and room (keeping
-- its place unless ``moved``, a new back-off), else out; an idle slot loses its hash.
local function place(name, s, now, moved)
  local h = prefix .. name
  local flight, conc = tonumber(s.flight), tonumber(s.conc)
  local at = math.max(tonumber(s.next), tonumber(s.backoff))
  local waiting = prios_of(h, s) ~= ''
  if waiting and (conc == 0 or flight < conc) then
    if at == 0 then at = now end
    if moved then
      redis.call('ZADD', KEYS[1], at, name)
    else
      redis.call('ZADD', KEYS[1], 'NX', at, name)
    end
  else
    redis.call('ZREM', KEYS[1], name)
  end
  if not waiting and flight == 0 and at <= now then
    if s.exists then redis.call('DEL', h) end
  else
    save(h, s)
  end
end
