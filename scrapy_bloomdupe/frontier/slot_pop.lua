-- Lease requests from the download slots that may go now (frontier/slots.py).
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the shard's count of slot leases (a string); KEYS[2] .. ':' .. owner is
--          the owner's leases (a list, in the order taken)
-- KEYS[3]  the shard's owners (a sorted set: owner -> last heartbeat, ms)
-- KEYS[4]  the shard's default limits of a slot (a hash: conc, delay)
-- KEYS[5]  the shard's count of requests waiting in its slots (a string)
-- KEYS[6..] optional: the hashes of the slots to try (a cluster's caller read
--          them from the ready set first); without them the script reads the
--          ready set itself
-- ARGV[1]  this worker (its owner id)
-- ARGV[2]  its pop number (this worker's, increasing)
-- ARGV[3]  how many requests at most
-- ARGV[4]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[5]  the jitter of each delay (DOWNLOAD_DELAY_JITTER): a gap is the delay
--          times 1 + u, u uniform in [-jitter, jitter], at least 0 (0.5: 0.5x-1.5x,
--          Scrapy's default; 0: the delay as it is)
-- ARGV[6]  the seed of that randomness (an integer; the same on a retry)
-- ARGV[7]  optional: the horizon, ms (default 0): slots due within it are taken
--          now, each lease to start when its slot may go
-- ARGV[8]  optional: how many slots the acks before it in its round trip freed
--          (this worker's, default 0): its share of the ready slots grows by as many
-- ARGV[9..] optional: pairs of a slot's name and its own jitter (DOWNLOAD_SLOTS)
--
-- Takes, slot by slot in the order they become due (Redis's clock), from the
-- slots due now or within the horizon, the heads of each slot's highest
-- priorities: as many as the slot's room (its concurrency less its leases; 0 is
-- no limit) and the count left allow, one only when the slot has a delay. A
-- slot's requests start when it may go (``start``: now, or its next start or the
-- end of its back-off, within the horizon). Each goes at the tail of the owner's
-- lease list as "<pop>.<j>|<priority>|<slot>|<entry>" ("<priority>@<start>" when it
-- starts later than now; its field, the name an ack and a reclaim give it, is
-- "<owner>:<pop>.<j>"); the slot's leases grow by as many, its next
-- allowed start becomes start + its delay (times the random factor), and it
-- leaves the ready set when it has nothing left or no room (an ack puts it back).
-- Claiming ahead lets a worker pop about once a horizon while work is due, and
-- workers no longer race for the same moment (the caller hands a lease out at
-- its start).
-- Keys touched beyond KEYS: the slots' hashes and lists (the shard's hash tag).
-- Returns {now, when the next slot may go (-1: none ready, or this pop took its
-- share), field, value, ...};
-- a pop that already ran (a retry after a lost reply) returns the same leases
-- again and takes nothing.

-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local owner, count, prefix = ARGV[1], tonumber(ARGV[3]), ARGV[4]
local horizon = now + (tonumber(ARGV[7]) or 0)
redis.call('ZADD', KEYS[3], now, owner)
local lease = owner .. ':' .. ARGV[2] .. '.'
local held, mine = KEYS[2] .. ':' .. owner, ARGV[2] .. '.'
local defaults_key = KEYS[4]

-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)

local function next_due()
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #first == 0 then return -1 end
  return tonumber(first[2])
end

local out = {now, 0}
-- A retry: this pop's leases are the list's last (no other pop of this owner ran since).
local last = redis.call('LRANGE', held, -1, -1)[1]
if last and string.sub(last, 1, #mine) == mine then
  for _, e in ipairs(redis.call('LRANGE', held, -count, -1)) do
    if string.sub(e, 1, #mine) == mine then
      local bar = string.find(e, '|', 1, true)
      out[#out + 1] = owner .. ':' .. string.sub(e, 1, bar - 1)
      out[#out + 1] = string.sub(e, bar + 1)
    end
  end
  out[2] = next_due()
  return out
end

local due = {}
if #KEYS > 5 then
  for k = 6, #KEYS do
    local name = string.sub(KEYS[k], #prefix + 1)
    local at = redis.call('ZSCORE', KEYS[1], name)
    if at and tonumber(at) <= horizon then due[#due + 1] = name end
  end
else
  due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon, 'LIMIT', 0, count)
end

-- What a lease's priority carries when it starts later than now.
local function p_mark(start)
  if start > now then return '@' .. start end
  return ''
end

-- Each slot's jitter: its own, or ARGV[5].
local jitters = {}
for a = 9, #ARGV - 1, 2 do jitters[ARGV[a]] = tonumber(ARGV[a + 1]) end
local jitter = tonumber(ARGV[5]) or 0

-- A fair share: this pop takes from at most as many slots as its own acks just
-- freed (ARGV[8]), and its share of the other ready slots, split among the shard's
-- owners (the dead among them until reaped), so that one worker does not take every
-- slot's room and with it every page's parsing while the others wait for room, and
-- a slot an ack frees does not wait for another worker's pop. When the share stopped
-- it, it says no slot is due (-1): its next pop waits for an ack or the slot poll.
-- (The ready set counts the slots due later too: ZCARD, not ZCOUNT, which the
-- least-privilege ACL does not grant; the share is a little larger then, never
-- smaller.)
local freed = tonumber(ARGV[8]) or 0
local share = freed + math.ceil(math.max(0, redis.call('ZCARD', KEYS[1]) - freed)
                                / math.max(1, redis.call('ZCARD', KEYS[3])))
local slots, capped = 0, false

-- Park and Miller's generator, a few steps in so that close seeds draw apart.
local x = (tonumber(ARGV[6]) % 2147483646) + 1
for _ = 1, 4 do x = (x * 16807) % 2147483647 end
-- Leases written in one RPUSH, the ready set changed in one ZADD and one ZREM.
local leased, back, gone = {}, {}, {}
local j = 0
for _, name in ipairs(due) do
  if j >= count then break end
  if slots >= share then
    capped = true
    break
  end
  slots = slots + 1
  local h = prefix .. name
  local s = load(h)
  local flight, conc, delay = tonumber(s.flight), tonumber(s.conc), tonumber(s.delay)
  local start = math.max(now, tonumber(s.next), tonumber(s.backoff))
  local room = count - j
  if conc > 0 then room = math.min(room, conc - flight) end
  if delay > 0 then room = math.min(room, 1) end
  -- Its score was due, its state says later (a declared slot): left as it is.
  if start > horizon then room = 0 end
  local mark = p_mark(start)
  local taken, kept, full = 0, {}, false
  for p in string.gmatch(s.prios, '[^,]+') do
    local want = room - taken
    if full or want <= 0 then
      kept[#kept + 1] = p
    else
      local got = redis.call('LPOP', h .. ':' .. p, want) or {}
      for _, e in ipairs(got) do
        local value = p .. mark .. '|' .. name .. '|' .. e
        leased[#leased + 1] = mine .. j .. '|' .. value
        out[#out + 1] = lease .. j
        out[#out + 1] = value
        j, taken = j + 1, taken + 1
      end
      -- Fewer than asked: the list is gone. As many: it may hold more.
      if #got == want then
        full = true
        if redis.call('EXISTS', h .. ':' .. p) == 1 then kept[#kept + 1] = p end
      end
    end
  end
  flight = flight + taken
  local wait, spread = delay, jitters[name] or jitter
  if spread > 0 and delay > 0 then
    x = (x * 16807) % 2147483647
    wait = math.max(0, math.floor(delay * (1 + spread * (2 * x / 2147483647 - 1))))
  end
  -- The next start is kept only when ahead (a delay); without one the slot still
  -- goes back into the ready set behind those served before it (score now).
  local nxt = start + wait
  if taken == 0 then
    nxt = tonumber(s.next)
  elseif nxt > now then
    s.next = nxt
  else
    s.next = 0
  end
  s.prios, s.flight = table.concat(kept, ','), flight
  save(h, s)
  if #kept > 0 and (conc == 0 or flight < conc) then
    back[#back + 1] = math.max(nxt, tonumber(s.backoff))
    back[#back + 1] = name
  else
    gone[#gone + 1] = name
  end
end
chunked('RPUSH', held, leased)
if j > 0 then
  redis.call('INCRBY', KEYS[2], j)
  redis.call('DECRBY', KEYS[5], j)
end
chunked('ZADD', KEYS[1], back)
chunked('ZREM', KEYS[1], gone)
out[2] = capped and -1 or next_due()
return out
