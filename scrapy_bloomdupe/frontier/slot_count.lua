-- What a shard's download slots hold, for the crawl's end: the counters, each checked
-- against the lists it counts where it would keep the crawl open. A counter can
-- disagree with the lists (an entry another program pushed into a slot's list, then
-- popped and retired, leaves the waiting count at -1): a crawl whose end rested on it
-- would never end, or end with requests left.
--
-- KEYS[1]  the shard's ready set (the slots with requests and room)
-- KEYS[2]  the shard's count of requests waiting in its slots
-- KEYS[3]  the shard's count of requests leased from its slots
-- KEYS[4]  the shard's owners (the workers, whose lease lists are ARGV[1] .. owner)
-- KEYS[5]  the shard's intake (a sorted set)
-- KEYS[6]  the shard's lease hash of the sorted-set layout (an earlier build's)
-- ARGV[1]  what a worker's lease list's key starts with ("{K:i}:slotleased:")
-- ARGV[2]  a pattern every slot's list matches, and no other key ("{K:i}:slot:*:*")
--
-- Returns {waiting, leased, elsewhere}: the leased count is the counter's when a lease
-- list holds an entry, else 0 (or 1 when the counter says less); the waiting count is
-- the counter's (at least 1) when a slot is ready; when none is and nothing is leased,
-- the counter's (at least 1) only if a slot's list holds an entry (SCAN: only then,
-- when the crawl may be ending), else 0; with leases out, the counter's (at least 0). ``elsewhere``: the intake's and the lease
-- hash's entries. Reads only (LRANGE ... 0 0 looks at a list: the crawler's ACL,
-- docs/security.md, has no LLEN).
local function holds(list)
  return #redis.call('LRANGE', list, 0, 0) > 0
end
local waiting = tonumber(redis.call('GET', KEYS[2]) or '0')
local leased = tonumber(redis.call('GET', KEYS[3]) or '0')
local held = false
for _, owner in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if holds(ARGV[1] .. owner) then
    held = true
    break
  end
end
leased = held and math.max(leased, 1) or 0
if redis.call('ZCARD', KEYS[1]) > 0 then
  waiting = math.max(waiting, 1)
elseif leased == 0 then
  local found, cursor = false, '0'
  repeat
    local reply = redis.call('SCAN', cursor, 'MATCH', ARGV[2], 'COUNT', 1000)
    cursor = reply[1]
    for _, name in ipairs(reply[2]) do
      if holds(name) then found = true end
    end
  until cursor == '0' or found
  waiting = found and math.max(waiting, 1) or 0
else
  waiting = math.max(waiting, 0)  -- leases out: the crawl goes on, whatever it says
end
return {waiting, leased, redis.call('ZCARD', KEYS[5]) + redis.call('HLEN', KEYS[6])}
