-- A block, not a script: every slot_*.lua includes it (luascript.read puts it where
-- its "-- #include slot_state.lua" line stands). It reads ``defaults_key`` (the
-- including script's key of the shard's default limits) and defines FIELDS, DEFAULT,
-- read_defaults, load, prios_of, save, chunked, with_priority and place (which also
-- reads ``prefix``, the shard's slot prefix, and KEYS[1], its ready set).

-- A slot's state (the same block in every slot_*.lua): its hash holds only what
-- differs from the default (the shard's default limits, else no limit; nothing
-- in flight; no start or back-off ahead), and a slot with nothing else than
-- priority 0 waiting has no hash. A slot with a hash has its priorities in use
-- in "prios" ("" for none); one without has "0" when its list of priority 0
-- exists, else none.
local FIELDS = {'prios', 'flight', 'conc', 'delay', 'next', 'backoff'}
local DEFAULT
-- Reads DEFAULT from ``defaults_key`` (again: the filter's sink, sink.lua, sets it a
-- shard at a time).
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

-- Writes slot ``name`` 's state ``s`` and puts it in or out of the ready set: in
-- when it has requests and room (one already there keeps its place unless ``moved``,
-- a new back-off), out otherwise; a slot with nothing waiting, nothing in flight
-- and no start or back-off ahead loses its hash.
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
