-- What a shard's download slots hold, for the crawl's end: each counter checked against the lists
-- it counts where it would keep the crawl open (a counter can be off, e.g. -1 after another
-- program's entry was pushed, popped and retired: the crawl would never end, or end too soon).
-- KEYS[1] the shard's ready set; KEYS[2] its waiting count; KEYS[3] its leased count; KEYS[4] its
-- owners; KEYS[5] its intake; KEYS[6] an earlier build's lease hash. ARGV: a lease list key's
-- start ("{K:i}:slotleased:"), a pattern all slot lists and no other key match ("{K:i}:slot:*:*").
-- Returns {waiting, leased, elsewhere}: leased the counter's (at least 1) if a lease list holds an
-- entry, else 0; waiting the counter's (at least 1) if a slot is ready, else with nothing leased
-- the same only if a slot's list holds an entry (SCAN, only when ending) or 0, with leases at
-- least 0; elsewhere: intake and lease hash entries. Reads only (LRANGE 0 0: the ACL has no LLEN).
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
