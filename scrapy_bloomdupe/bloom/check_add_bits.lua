-- Check-and-add, Lua engine (bloom/lua.py): is each item in the filter? Add the new ones. A shard's
-- bits: one plain string a generation (BITFIELD). A call carries one or several shards' items
-- (sections: on one node all a burst touches, on a Cluster one master's).
-- KEYS[1] this client's op log for the first shard (bloom/oplog.py); per section its shard's
-- generation marker, lock (lock mode), forgotten items, G bits keys (oldest first) and, with a
-- sink, its queue shard's five keys (frontier/sink.lua). On a Cluster KEYS[1] is the only key
-- (declared keys share a slot; `#!lua flags=allow-cross-slot-keys`): the sections' keys end ARGV,
-- then their count. ARGV[1..4] lock token ('' atomic), call id, ack, op log TTL ms (op_log.lua);
-- G; each generation's k; '1' with sinks else '0'; per section n, per item its member (keyed
-- 16-byte hash) and k offsets a generation, oldest first, then with a sink its arguments.
-- Returns one character an item, sections in order: '1' new (set in the newest generation,
-- queued; a forgotten item is new once), '0' seen, 'B' its section's lock lacks the token (asked
-- again as a new call); or, having written nothing: -1 LOCK_BUSY (no lock holds it), -2
-- STALE_GENERATION (a shard has more than G), -3 SHARD_MISSING (bits gone: BITFIELD would make
-- them empty, every item new again), NOPERM (the ACL refuses a sink's command, or SREM on a
-- non-empty forgotten set). A retried call id gets its recorded answer. On a Cluster every key is
-- read before the first write: a slot moved away fails the call ("non local key"), writing nothing.
-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)
local token = ARGV[1]
local G = tonumber(ARGV[5])
local sinks = ARGV[6 + G] == '1'
local stride = 3 + G + (sinks and 5 or 0)
local nk = #KEYS == 1 and tonumber(ARGV[#ARGV]) or 0  -- sections' keys in ARGV (a cluster)
local S = (nk > 0 and nk or #KEYS - 1) / stride
local top = #ARGV - nk - 1
local function key(s, i) -- i: 1 marker, 2 lock, 3 forgotten, 3+g gen g's bits, 4+G..8+G sink
  if nk == 0 then return KEYS[1 + (s - 1) * stride + i] end
  return ARGV[top + (s - 1) * stride + i]
end
-- MGET, EXISTS (summed), DEL: one command on one node, one a key on a cluster (one slot each).
local function each(command, list)
  if nk == 0 then return redis.call(command, unpack(list)) end
  local out, n = {}, 0
  for i = 1, #list do
    out[i] = redis.call(command == 'MGET' and 'GET' or command, list[i])
    if command ~= 'MGET' then n = n + out[i] end
  end
  return command == 'MGET' and out or n
end
-- The fence: a holder paused past the lock's TTL is refused; a section whose lock lacks the
-- token is left alone. `held`: the locks this call frees at its end.
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
local function sink_keys(s)
  return {key(s, 4 + G), key(s, 5 + G), key(s, 6 + G), key(s, 7 + G), key(s, 8 + G)}
end
-- Before any write: the ACL allows each sink, every generation's bits exist, no shard is ahead.
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
  -- On a cluster the sinks are read too (EXISTS) before the first write.
  local sunk = {}
  for s = 1, S do
    if mine[s] then
      for _, name in ipairs(sink_keys(s)) do sunk[#sunk + 1] = name end
    end
  end
  each('EXISTS', sunk)
end
-- Forgotten items: looked at only when there are some; an ACL-refused SREM errors before writing.
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
local get, set = {}, {}  -- BITFIELD's arguments, kept between items: only the offsets change
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
      -- Seen if all bits are set in an older generation; else set in the newest: new if a bit
      -- was 0 (or it was forgotten).
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
