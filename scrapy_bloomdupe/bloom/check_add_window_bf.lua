-- Check-and-add with a recrawl window, RedisBloom engine (bloom/window.py): is each
-- item in a live time slice? Add the new ones to the current slice.
-- Time is cut into slices of L ms of Redis's clock (TIME); slice c holds the items
-- added during it, in one NONSCALING RedisBloom filter a generation, and expires
-- (PEXPIREAT, set when it is made) at (c + S + 1) * L, once no call looks at it any
-- more: a call looks at slices c - S .. c.
-- A slice grows as a filter without a window does: once its newest generation holds
-- its share of items (cap), a larger generation is made beside it (at most M).
--
-- KEYS[1]        this client's op log for the shard (bloom/oplog.py)
-- KEYS[2]        the shard's slice record, a hash: 'made' (set when the filter was
--                made: its loss is lost state), '<s>' the generations slice s has,
--                '<s>n' the items in slice s's newest generation
-- KEYS[3]        the shard's lock (lock mode)
-- KEYS[4]        the shard's forgotten items (`bloomdupe forget`): each answered new once
-- KEYS[5..]      the shard's BF keys: for each slice c - S .. c (the current one last),
--                b[s] keys, its generations oldest first; for slice c one more,
--                the generation growth would make next
-- KEYS[last 5]   optional: the sink's five keys, a queue shard's (frontier/sink.lua),
--                which queues each new item into its download slot's list
-- ARGV[1]        the lock token, '' in atomic mode
-- ARGV[2]        this call's id (the op id of its first item)
-- ARGV[3]        the ack: calls below it have their answers, the op log may forget them
-- ARGV[4]        the op log's TTL in ms
-- ARGV[5]        L, a slice's length in ms
-- ARGV[6]        S: a call looks at S + 1 slices
-- ARGV[7]        c, the current slice as the client believes it
-- ARGV[8]        n, the item count
-- ARGV[9]        G, the most generations the client believes a live slice has
-- ARGV[10]       M, the most generations a slice may have (1: no growth)
-- then for each generation 0 .. G: its BF.RESERVE error rate and capacity, and cap
-- (the items it holds before the next is made);
-- then b[c - S] .. b[c], the generations of each slice as the client believes them
-- (1 for a slice it knows nothing of);
-- then the n items (the filter's keyed hashes, never the fingerprints);
-- then, with the sink, its arguments (frontier/sink.lua: the slot prefix, then five
-- values an item).
--
-- Returns a string of one character an item: '1' new (now in the current slice's
-- newest generation, and queued), '0' seen in a live slice, 'F' not added: the
-- newest generation is full and may not grow, 'G' not looked at: the current slice
-- grew in this call and its new generation holds its share too (the client asks
-- again, as a new call); or, having written nothing:
--   -1 (LOCK_BUSY)      lock mode, and the lock does not hold this token
--   -3 (SHARD_MISSING)  the record, or a generation of a slice it holds, is gone
--                       before its time
--   {slice, now, g...}  (STALE_SLICE) Redis's current slice is not c, or a live slice
--                       has other generations than b says: Redis's slice, its time
--                       in ms and the generations of its slices slice - S .. slice
--                       (0: not made); the client asks again with those
--   a NOPERM error      the ACL does not allow a command of the sink, PEXPIREAT on a
--                       generation to make, or SREM on KEYS[4] while it holds items
-- A call whose id the op log holds (a retry after a lost reply) returns the
-- answer recorded the first time and changes nothing else.

-- #include bf_insert.lua (BF.INSERT's flags, on Redis and on Valkey)
-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)

-- #include shard_lock.lua (token, held, release)
-- #include op_log.lua (a retry's recorded answer; answer(reply))

-- The fence: a holder paused past the lock's TTL is refused, not trusted.
if token ~= '' and not held then return -1 end

-- A generation's key made, empty (window_slices.lua's make): a NONSCALING filter of the
-- call's shape's error rate and capacity.
local function reserve(name, rate, capacity)
  redis.call('BF.RESERVE', name, rate, capacity, 'NONSCALING')
end

-- #include window_slices.lua (the slices' check: S, c, slices, gens, mine, ...)
local newest = KEYS[slices[S + 1] + mine - 1]

-- A forgotten item is new once: taken out of the set and answered new (and queued)
-- whatever its insert says, even when the newest generation is full ('F') or the
-- call grew ('G'), so a forget is never lost. Else an item is looked up in every
-- live generation (the newest too: BF.INSERT answers for it).
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

-- Into the newest generation, no more than its share when it may grow; at most one
-- generation is made in a call (the client sent one key for it).
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
