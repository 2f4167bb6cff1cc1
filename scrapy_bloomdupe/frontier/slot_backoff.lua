-- Pause a download slot for every worker until a time (frontier/slots.py): a
-- Retry-After, or an adaptive back-off.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  the slot's hash
-- ARGV[1]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[2]  the slot's name (keys.slot_name)
-- ARGV[3]  until when, ms on Redis's clock (an earlier back-off already set stays
--          when it ends later)
--
-- No worker's pop takes from the slot before then; a slot not yet known keeps
-- the back-off for the requests pushed into it later.
-- Returns when the slot's back-off ends.

local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]

local function place(name, now)
  local h = prefix .. name
  local v = redis.call('HMGET', h, 'waiting', 'flight', 'conc', 'next', 'backoff')
  local waiting, flight = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  local conc = tonumber(v[3]) or 0
  local at = math.max(tonumber(v[4]) or 0, tonumber(v[5]) or 0)
  if waiting > 0 and (conc == 0 or flight < conc) then
    redis.call('ZADD', KEYS[1], at, name)
  else
    redis.call('ZREM', KEYS[1], name)
    if waiting == 0 and flight == 0 and at <= now then redis.call('DEL', h) end
  end
end

local until_ms = math.max(tonumber(redis.call('HGET', KEYS[2], 'backoff')) or 0,
                          tonumber(ARGV[3]))
redis.call('HSET', KEYS[2], 'backoff', until_ms)
place(ARGV[2], now)
return until_ms
