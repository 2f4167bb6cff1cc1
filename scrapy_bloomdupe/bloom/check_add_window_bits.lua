-- Check-and-add with a recrawl window, Lua engine (bloom/window.py): is each item in
-- a live time slice? Add the new ones to the current slice.
-- Time is cut into slices of L ms of Redis's clock (TIME); slice c holds the items
-- added during it and expires (PEXPIREAT, set when it is made) at (c + S + 1) * L,
-- once no call looks at it any more: a call looks at slices c - S .. c.
-- A slice grows as a filter without a window does: once its newest generation holds
-- its share of items (cap), a larger generation is made beside it (at most M).
--
-- KEYS[1]        this client's op log for the shard (bloom/oplog.py)
-- KEYS[2]        the shard's slice record, a hash: 'made' (set when the filter was
--                made: its loss is lost state), '<s>' the generations slice s has,
--                '<s>n' the items in slice s's newest generation
-- KEYS[3]        the shard's lock (lock mode)
-- KEYS[4]        the shard's forgotten items (`bloomdupe forget`): each answered new once
-- KEYS[5..]      the shard's bits: for each slice c - S .. c (the current one last),
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
-- ARGV[9]        G, the generations each item's offsets are given for
-- ARGV[10]       M, the most generations a slice may have (1: no growth)
-- then for each generation 0 .. G: its shard's length in bytes, k (its bits per
-- item) and cap (the items it holds before the next is made);
-- then b[c - S] .. b[c], the generations of each slice as the client believes them
-- (1 for a slice it knows nothing of);
-- then per item its member (its keyed 16-byte hash) and its k bit offsets in each
-- generation 0 .. G - 1;
-- then, with the sink, its arguments (frontier/sink.lua: the slot prefix, then five
-- values an item).
--
-- Returns a string of one character an item: '1' new (now set in the current
-- slice's newest generation, and queued), '0' seen in a live slice, 'G' not looked
-- at: the current slice has just grown a generation G the call has no offsets for
-- (the client asks again, as a new call, with one more); or, having written nothing:
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

-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)

-- #include shard_lock.lua (token, held, release)
-- #include op_log.lua (a retry's recorded answer; answer(reply))
-- #include all_set.lua (all_set(bits): every bit of an item set)

-- The fence: a holder paused past the lock's TTL is refused, not trusted.
if token ~= '' and not held then return -1 end

-- A generation's key made, empty and at full size (window_slices.lua's make): its
-- length in bytes from the call's shape.
local function reserve(name, bytes)
  redis.call('BITFIELD', name, 'SET', 'u1', tonumber(bytes) * 8 - 1, 0)
end

-- #include window_slices.lua (the slices' check: S, c, slices, gens, mine, ...)

-- Every generation an item is looked up in ({key, generation}), and the newest.
local older = {}
for g = 0, S do
  for j = 0, gens[g + 1] - 1 do
    if not (g == S and j == mine - 1) then older[#older + 1] = {KEYS[slices[g + 1] + j], j} end
  end
end
local newest = KEYS[slices[S + 1] + mine - 1]

-- BITFIELD's arguments per generation, kept between items: only the offsets change.
local get, set, offset_at, ks, width = {}, {}, {}, {}, 1
for g = 0, G - 1 do
  local k = tonumber(ARGV[shape_at + 3 * g + 1])
  get[g], set[g], offset_at[g], ks[g] = {}, {}, width, k
  for i = 0, k - 1 do
    get[g][3 * i + 1], get[g][3 * i + 2], get[g][3 * i + 3] = 'GET', 'u1', 0
    set[g][4 * i + 1], set[g][4 * i + 2], set[g][4 * i + 3], set[g][4 * i + 4] = 'SET', 'u1', 0, '1'
  end
  width = width + k
end
-- BITFIELD on generation g's bits at ``name``: its k offsets from ARGV[at].
local function bits(command, name, g, at)
  local args, step = command == 'BITFIELD' and set[g] or get[g], command == 'BITFIELD' and 4 or 3
  for i = 0, ks[g] - 1 do args[step * i + 3] = ARGV[at + i] end
  return redis.call(command, name, unpack(args))
end
local sink_at = item_at + n * width

-- At most one generation is made in a call (the client sent one key for it); items
-- past its share, or with no offsets for it, are 'G'.
local out, added, grown = {}, 0, false
for j = 1, n do
  local at = item_at + (j - 1) * width
  if M > mine and count >= cap_of(mine - 1) and not grown then
    older[#older + 1] = {newest, mine - 1}
    newest = make(mine)
    mine = mine + 1
    grown = true
  end
  if mine > G or (grown and M > mine and count >= cap_of(mine - 1)) then
    out[j] = 'G'
  else
    -- A forgotten item is new once; else seen when every bit is set in a live
    -- generation; else set in the newest, new when one of its bits was 0.
    local found = false
    local g = mine - 1
    if not (forgot and redis.call('SREM', KEYS[4], ARGV[at]) == 1) then
      for _, gen in ipairs(older) do
        found = all_set(bits('BITFIELD_RO', gen[1], gen[2], at + offset_at[gen[2]]))
        if found then break end
      end
      if not found then
        found = all_set(bits('BITFIELD', newest, g, at + offset_at[g]))
      end
    else
      bits('BITFIELD', newest, g, at + offset_at[g])
    end
    out[j] = found and '0' or '1'
    if not found then
      count = count + 1
      added = added + 1
    end
  end
end
local reply = table.concat(out)
if added > 0 and M > 1 then redis.call('HSET', KEYS[2], field .. 'n', count) end

if sunk then sink(sunk, sink_at, out) end

return answer(reply)
