-- Check-and-add, Lua engine (bloom/lua.py): is each item in the filter? Add the new ones.
-- Each shard's bits are one plain string per generation, read and set with BITFIELD.
-- One call carries the items of one shard or of several (its sections): on one Redis
-- node, every shard a burst touches; on a Redis Cluster (Redis 7+), those of one master,
-- so a burst of items spread over many shards costs one script call a master.
--
-- KEYS[1]      this client's op log for the call's first shard (bloom/oplog.py)
-- then per section, in order (KEYS[2] is the first section's), or, when KEYS[1] is the
-- only key (a Redis Cluster, whose declared keys must share a slot; the script is then
-- loaded with `#!lua flags=allow-cross-slot-keys` and reaches the other slots of its
-- master), the same keys at the end of ARGV, followed by their count:
--   its shard's generation marker: how many generations the shard has seen
--   its shard's lock (lock mode)
--   its shard's forgotten items (`bloomdupe forget`): each answered new once
--   its shard's bits, G keys, oldest generation first
--   with a sink: its five keys, a queue shard's (frontier/sink.lua), which queues
--   each new item into its download slot's list
-- ARGV[1]      the lock token, '' in atomic mode
-- ARGV[2]      this call's id (the op id of its first item)
-- ARGV[3]      the ack: calls below it have their answers, the op log may forget them
-- ARGV[4]      the op log's TTL in ms
-- ARGV[5]      G, the generation count
-- ARGV[6..5+G] k, the bits per item, of each generation
-- ARGV[6+G]    '1' with a sink (each section's last five keys), '0' without
-- then per section: n, its item count; per item its member (its keyed 16-byte
-- hash, for the forgotten set) and its k bit offsets in each generation, oldest
-- first; then, with a sink, its arguments (frontier/sink.lua: the slot prefix, then
-- five values an item);
-- then (KEYS[1] alone) the sections' keys and their count.
--
-- Returns a string of one character an item, sections in order: '1' new (now set
-- in the newest generation, and queued; a forgotten item is new once, whatever its
-- bits say), '0' seen before, 'B' not looked at: lock mode, and its section's lock
-- does not hold this token (the caller waits and asks again, as a new call); or,
-- having written nothing:
--   -1 (LOCK_BUSY)        lock mode, and no section's lock holds this token
--   -2 (STALE_GENERATION) a shard already has more than G generations
--   -3 (SHARD_MISSING)    a generation's bits are gone (BITFIELD would re-create
--                         them empty and every item would be new again)
--   a NOPERM error        the ACL does not allow a command of a sink, or SREM on a
--                         forgotten set that holds items
-- A call whose id the op log holds (a retry after a lost reply) returns the
-- answer recorded the first time and changes nothing else. On a cluster every key
-- is read before the first write: a key of a slot that moved to another master
-- fails the call there ("non local key"), having written nothing.

-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)

local token = ARGV[1]
local G = tonumber(ARGV[5])
local sinks = ARGV[6 + G] == '1'
local stride = 3 + G + (sinks and 5 or 0)
-- nk: the sections' keys passed in ARGV (a cluster), 0 when they are KEYS[2..].
local nk = #KEYS == 1 and tonumber(ARGV[#ARGV]) or 0
local S = (nk > 0 and nk or #KEYS - 1) / stride
local top = #ARGV - nk - 1
local function key(s, i) -- i: 1 marker, 2 lock, 3 forgotten, 3+g the bits of generation g,
  -- 4+G .. 8+G the sink's
  if nk == 0 then return KEYS[1 + (s - 1) * stride + i] end
  return ARGV[top + (s - 1) * stride + i]
end
-- MGET, EXISTS (a count) and DEL of keys of several shards: one command on one node, one
-- a key on a cluster, where a command's keys must share a slot even in this script.
local function each(command, list)
  if nk == 0 then return redis.call(command, unpack(list)) end
  local out, n = {}, 0
  for i = 1, #list do
    out[i] = redis.call(command == 'MGET' and 'GET' or command, list[i])
    if command ~= 'MGET' then n = n + out[i] end
  end
  return command == 'MGET' and out or n
end

-- The fence: a holder paused past the lock's TTL is refused, not trusted; a section
-- whose lock does not hold this token is left alone. `held`: the locks this call
-- frees when it ends.
local mine, held = {}, {}
if token == '' then
  for s = 1, S do mine[s] = true end
else
  local locks = {}
  for s = 1, S do locks[s] = key(s, 2) end
  local values = each('MGET', locks)
  for s = 1, S do
    mine[s] = values[s] == token
    if mine[s] then held[#held + 1] = locks[s] end
  end
end
local function release()
  if #held > 0 then each('DEL', held) end
end

-- #include op_log.lua (a retry's recorded answer; answer(reply))
-- #include all_set.lua (all_set(bits): every bit of an item set)

if token ~= '' and #held == 0 then return -1 end

-- The sink's five keys of section s (frontier/sink.lua).
local function sink_keys(s)
  return {key(s, 4 + G), key(s, 5 + G), key(s, 6 + G), key(s, 7 + G), key(s, 8 + G)}
end

-- Before any write: the ACL allows each sink's commands, every generation's bits are
-- there, no shard is ahead of this call's generations.
local bits, markers, forgotten = {}, {}, {}
for s = 1, S do
  if mine[s] then
    local refused = sinks and sink_refusal(sink_keys(s))
    if refused then
      release()
      return refused
    end
    for g = 1, G do bits[#bits + 1] = key(s, 3 + g) end
    markers[#markers + 1] = key(s, 1)
    forgotten[#forgotten + 1] = key(s, 3)
  end
end
if each('EXISTS', bits) < #bits then
  release()
  return -3
end
local stored = each('MGET', markers)
for i = 1, #markers do
  if tonumber(stored[i] or '1') > G then
    release()
    return -2
  end
end
if nk > 0 and sinks then
  -- On a cluster the sinks are read too (EXISTS) before the first write (above).
  local sunk = {}
  for s = 1, S do
    if mine[s] then
      for _, name in ipairs(sink_keys(s)) do sunk[#sunk + 1] = name end
    end
  end
  each('EXISTS', sunk)
end

-- Forgotten items (`bloomdupe forget`): looked at only when there are some (EXISTS),
-- and SREM refused by the ACL is an error before any write.
local forgot = {}
if each('EXISTS', forgotten) > 0 then
  for s = 1, S do
    forgot[s] = mine[s] and redis.call('EXISTS', key(s, 3)) == 1
    if forgot[s] and redis.acl_check_cmd and not redis.acl_check_cmd('SREM', key(s, 3), 'x') then
      release()
      return redis.error_reply("NOPERM this user has no permissions to run the 'srem' command")
    end
  end
end

for i = 1, #markers do
  if tonumber(stored[i] or '1') < G then redis.call('SET', markers[i], G) end
end

local ks, width = {}, 1
for g = 1, G do
  ks[g] = tonumber(ARGV[5 + g])
  width = width + ks[g]
end
-- BITFIELD's arguments, kept between items: only the offsets change.
local get, set = {}, {}
for i = 0, math.max(unpack(ks)) - 1 do
  get[3 * i + 1], get[3 * i + 2] = 'GET', 'u1'
  set[4 * i + 1], set[4 * i + 2], set[4 * i + 4] = 'SET', 'u1', '1'
end
local out = {}
local p = 7 + G
for s = 1, S do
  local n = tonumber(ARGV[p])
  local first = p + 1
  local sink_at = first + n * width
  p = sink_at + (sinks and 1 + 5 * n or 0)
  if not mine[s] then
    out[#out + 1] = string.rep('B', n)
  else
    local news = {}
    for j = first, sink_at - 1, width do
      -- Seen when every bit is set in some older generation; else set in the newest,
      -- new when one of its bits was 0 (or when it was forgotten).
      local again = forgot[s] and redis.call('SREM', key(s, 3), ARGV[j]) == 1
      local at, found = j + 1, false
      for g = 1, (again and 0 or G - 1) do
        local k = ks[g]
        for i = 0, k - 1 do get[3 * i + 3] = ARGV[at + i] end
        at = at + k
        found = all_set(redis.call('BITFIELD_RO', key(s, 3 + g), unpack(get, 1, 3 * k)))
        if found then break end
      end
      local new = again and '1' or '0'
      if not found then
        local k = ks[G]
        at = j + width - k
        for i = 0, k - 1 do set[4 * i + 3] = ARGV[at + i] end
        for _, bit in ipairs(redis.call('BITFIELD', key(s, 3 + G), unpack(set, 1, 4 * k))) do
          if bit == 0 then
            new = '1'
            break
          end
        end
      end
      news[#news + 1] = new
    end
    if sinks then sink(sink_keys(s), sink_at, news) end
    out[#out + 1] = table.concat(news)
  end
end
local reply = table.concat(out)

return answer(reply)
