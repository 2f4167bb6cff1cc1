-- Check-and-add with a recrawl window, Lua engine (bloom/window.py): is each item in a live time
-- slice (window_slices.lua)? Add the new ones to the current slice's newest generation. KEYS[1]
-- this client's op log (bloom/oplog.py); KEYS[2] the slice record (hash: 'made', set with the
-- filter, so its loss is lost state; '<s>' slice s's generations; '<s>n' items in its newest);
-- KEYS[3] the lock (lock mode); KEYS[4] forgotten items; KEYS[5..] bits keys: per slice c - S .. c
-- its b[s] generations, oldest first, and for c the one growth makes next; optional last 5: the
-- sink's keys (frontier/sink.lua). ARGV[1..4] lock token ('' atomic), call id, ack, op log TTL ms
-- (op_log.lua); then L (slice ms), S (a call looks at S + 1 slices), c as the client believes it,
-- n, G (the generations offsets are given for), M (1: no growth); per generation 0 .. G its length
-- in bytes, k (bits per item) and cap; b[c - S] .. b[c] (1: unknown); per item its member (keyed
-- 16-byte hash) and k offsets in each generation 0 .. G - 1; with the sink its arguments.
-- Returns one character an item: '1' new (set, queued), '0' seen in a live slice, 'G' not looked at
-- (the slice just grew a generation G the call has no offsets for: asked again, as a new call, with
-- one more); or, having written nothing: -1 LOCK_BUSY, -3 SHARD_MISSING (the record or a generation
-- it holds gone early), STALE_SLICE (window_slices.lua), NOPERM (the ACL refuses a sink's command,
-- PEXPIREAT on a generation to make, or SREM on a non-empty KEYS[4]). A retried call id gets its
-- recorded answer.
-- #include frontier/sink.lua (the push into the slots' lists: sink_refusal, sink)
-- #include shard_lock.lua (token, held, release)
-- #include op_log.lua (a retry's recorded answer; answer(reply))
-- #include all_set.lua (all_set(bits): every bit of an item set)
-- The fence: a holder paused past the lock's TTL is refused, not trusted.
if token ~= '' and not held then return -1 end
local function reserve(name, bytes)  -- a new generation's key, full size (window_slices.lua)
  redis.call('BITFIELD', name, 'SET', 'u1', tonumber(bytes) * 8 - 1, 0)
end
-- #include window_slices.lua (the slices' check: S, c, slices, gens, mine, ...)
local older = {}  -- {key, generation} of every live generation but the newest (below)
for g = 0, S do
  for j = 0, gens[g + 1] - 1 do
    if not (g == S and j == mine - 1) then older[#older + 1] = {KEYS[slices[g + 1] + j], j} end
  end
end
local newest = KEYS[slices[S + 1] + mine - 1]
local get, set, offset_at, ks, width = {}, {}, {}, {}, 1  -- BITFIELD's args, kept between items
for g = 0, G - 1 do
  local k = tonumber(ARGV[shape_at + 3 * g + 1])
  get[g], set[g], offset_at[g], ks[g] = {}, {}, width, k
  for i = 0, k - 1 do
    get[g][3 * i + 1], get[g][3 * i + 2], get[g][3 * i + 3] = 'GET', 'u1', 0
    set[g][4 * i + 1], set[g][4 * i + 2], set[g][4 * i + 3], set[g][4 * i + 4] = 'SET', 'u1', 0, '1'
  end
  width = width + k
end
local function bits(command, name, g, at)  -- on generation g's bits, k offsets from ARGV[at]
  local args, step = command == 'BITFIELD' and set[g] or get[g], command == 'BITFIELD' and 4 or 3
  for i = 0, ks[g] - 1 do args[step * i + 3] = ARGV[at + i] end
  return redis.call(command, name, unpack(args))
end
local sink_at = item_at + n * width
-- One generation made a call (one key sent); items past its share, or without offsets, are 'G'.
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
    -- A forgotten item is new once; else seen when all bits are set in a live generation; else
    -- set in the newest, new when a bit was 0.
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
