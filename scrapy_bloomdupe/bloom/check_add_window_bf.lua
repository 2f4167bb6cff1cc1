-- Check-and-add with a recrawl window, RedisBloom engine (bloom/window.py): is each item in a live
-- time slice (window_slices.lua)? Add the new ones to the current slice's newest generation.
-- KEYS[1] this client's op log (bloom/oplog.py); KEYS[2] the slice record (hash: 'made', set with
-- the filter, so its loss is lost state; '<s>' slice s's generations; '<s>n' items in its newest);
-- KEYS[3] the lock (lock mode); KEYS[4] forgotten items; KEYS[5..] NONSCALING BF keys: per slice
-- c - S .. c its b[s] generations, oldest first, and for c the one growth makes next; optional
-- last 5: the sink's keys (frontier/sink.lua). ARGV[1..4] lock token ('' atomic), call id, ack, op
-- log TTL ms (op_log.lua); then L (slice ms), S (a call looks at S + 1 slices), c as the client
-- believes it, n, G (the most generations it believes a live slice has), M (1: no growth); per
-- generation 0 .. G its BF.RESERVE error rate, capacity and cap; b[c - S] .. b[c] (1: unknown); the
-- n items (keyed hashes, never the fingerprints); with the sink its arguments.
-- Returns one character an item: '1' new (added, queued), '0' seen in a live slice, 'F' not added
-- (the newest is full and may not grow), 'G' not looked at (the slice grew in this call and its new
-- generation holds its share too: asked again as a new call); or, having written nothing: -1
-- LOCK_BUSY, -3 SHARD_MISSING (the record or a generation it holds gone early), STALE_SLICE
-- (window_slices.lua), NOPERM (the ACL refuses a sink's command, PEXPIREAT on a generation to make,
-- or SREM on a non-empty KEYS[4]). A retried call id gets its recorded answer.
-- #include bf_insert.lua (BF.INSERT's flags, on Redis and on Valkey)
-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)
-- #include shard_lock.lua (token, held, release)
-- #include op_log.lua (a retry's recorded answer; answer(reply))
-- The fence: a holder paused past the lock's TTL is refused, not trusted.
if token ~= '' and not held then return -1 end
local function reserve(name, rate, capacity)  -- a new generation's key (window_slices.lua)
  redis.call('BF.RESERVE', name, rate, capacity, 'NONSCALING')
end
-- #include window_slices.lua (the slices' check: S, c, slices, gens, mine, ...)
local newest = KEYS[slices[S + 1] + mine - 1]
-- A forgotten item is new once: out of the set and answered new (and queued) whatever its insert
-- says, even 'F' or 'G', so a forget is never lost. Else an item is looked up in every live
-- generation (the newest too: BF.INSERT answers for it).
local items, forgotten = {}, {}
for j = 1, n do
  items[j] = ARGV[item_at + j - 1]
  if forgot then forgotten[j] = redis.call('SREM', KEYS[4], items[j]) end
end
local found = {}
for g = 0, S do
  for j = 0, gens[g + 1] - 1 do
    local name = KEYS[slices[g + 1] + j]
    if name ~= newest then
      local seen = redis.call('BF.MEXISTS', name, unpack(items))
      for i = 1, n do
        if seen[i] == 1 then found[i] = true end
      end
    end
  end
end
local out, todo, sink_at = {}, {}, item_at + n
for i = 1, n do
  if found[i] and forgotten[i] ~= 1 then out[i] = '0' else todo[#todo + 1] = i end
end
-- Into the newest, at most its share when it may grow; one generation made a call (one key sent).
local grown, added = false, 0
while #todo > 0 do
  local room = #todo
  if M > mine then room = math.max(0, cap_of(mine - 1) - count) end
  if room == 0 then
    if grown then
      for _, i in ipairs(todo) do out[i] = 'G' end
      break
    end
    -- The items still to add may have just been added to the generation that filled.
    local seen = {}
    for x, i in ipairs(todo) do seen[x] = items[i] end
    seen = redis.call('BF.MEXISTS', newest, unpack(seen))
    local rest = {}
    for x, i in ipairs(todo) do
      if seen[x] == 1 and forgotten[i] ~= 1 then out[i] = '0' else rest[#rest + 1] = i end
    end
    todo = rest
    newest = make(mine)
    mine = mine + 1
    grown = true
  else
    local batch, part = {}, {}
    for x = 1, math.min(room, #todo) do
      part[x] = todo[x]
      batch[x] = items[todo[x]]
    end
    local flags = bf_insert(newest, batch)
    for x, i in ipairs(part) do
      local flag = flags[x]
      if flag == 1 or (flag == 0 and forgotten[i] == 1) then
        out[i] = '1'
        count = count + 1
        added = added + 1
      elseif flag == 0 then
        out[i] = '0'
      else
        out[i] = 'F'
      end
    end
    local rest = {}
    for x = #part + 1, #todo do rest[#rest + 1] = todo[x] end
    todo = rest
  end
end
for i = 1, n do
  if forgotten[i] == 1 then out[i] = '1' end
end
local reply = table.concat(out)
if added > 0 and M > 1 then redis.call('HSET', KEYS[2], field .. 'n', count) end
if sunk then sink(sunk, sink_at, out) end
return answer(reply)
