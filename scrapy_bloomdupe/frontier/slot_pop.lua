-- Lease requests from the download slots that may go now (frontier/slots.py). KEYS[1] the shard's
-- ready set (slot -> when it may go, ms); KEYS[2] its slot-lease count (KEYS[2]..':'..owner: the
-- owner's leases, in the order taken); KEYS[3] its owners (-> last heartbeat, ms); KEYS[4] its
-- default slot limits; KEYS[5] its waiting count; KEYS[6..] optional: the hashes of the slots to
-- try (a cluster's caller read the ready set first). ARGV: owner id, its pop number (increasing),
-- most requests, slot prefix ("{K:i}:slot:"), jitter (DOWNLOAD_DELAY_JITTER: a gap is the delay
-- times 1 + u, u uniform in [-jitter, jitter], >= 0), its seed (the same on a retry); optional:
-- horizon ms (slots due within it are taken now, each lease starting when its slot may go), slots
-- freed by the acks before it in its round trip, then (ARGV[9..]) pairs of a slot's name and its
-- own jitter (DOWNLOAD_SLOTS). Takes, slot by slot as they fall due (Redis's clock), the heads of
-- each slot's highest priorities, as many as its room (concurrency less leases; 0: none) allows,
-- only one with a delay, into the owner's list as "<pop>.<j>|<priority>[@<start>]|<slot>|<entry>"
-- (field "<owner>:<pop>.<j>"); the slot's next start becomes start + jittered delay; without
-- requests or room it leaves the ready set (an ack puts it back). Claiming ahead lets a worker pop
-- about once a horizon, not racing others for the same moment.
-- Returns {now, when the next slot may go (-1: none, or this pop took its share), field, value,
-- ...}; a pop that already ran (a retry after a lost reply) returns its leases, taking nothing.
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
local function p_mark(start)
  if start > now then return '@' .. start end
  return ''
end
local jitters = {}
for a = 9, #ARGV - 1, 2 do jitters[ARGV[a]] = tonumber(ARGV[a + 1]) end
local jitter = tonumber(ARGV[5]) or 0
-- A fair share: the slots this worker's acks just freed (ARGV[8], so they wait for no other pop)
-- plus its share of the other ready slots among the owners (dead ones until reaped), so one
-- worker does not take every slot's room while others wait; stopped by it, it answers -1.
-- (ZCARD, not ZCOUNT, which the least-privilege ACL lacks: the share errs larger, never smaller.)
local freed = tonumber(ARGV[8]) or 0
local share = freed + math.ceil(math.max(0, redis.call('ZCARD', KEYS[1]) - freed)
                                / math.max(1, redis.call('ZCARD', KEYS[3])))
local slots, capped = 0, false
local x = (tonumber(ARGV[6]) % 2147483646) + 1  -- Park and Miller's generator, a few steps in
for _ = 1, 4 do x = (x * 16807) % 2147483647 end  -- so that close seeds draw apart
local leased, back, gone = {}, {}, {}  -- one RPUSH of leases, one ZADD and ZREM of the ready set
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
  if start > horizon then room = 0 end  -- due by its score, later by its state (a declared slot)
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
      if #got == want then  -- fewer than asked: the list is gone; as many: it may hold more
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
  -- The next start is kept only when ahead (a delay); else the slot goes back scored now, behind
  -- those served before it.
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
