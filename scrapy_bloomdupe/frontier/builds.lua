-- The crawl's builds as a starting worker (or `bloomdupe info`) finds them (frontier/builds.py).
-- KEYS[1] the format record; KEYS[2] the builds (owner -> "<version> <format>", heartbeat.lua);
-- KEYS[3] shard 0's owners. ARGV: lease timeout ms (live within it); "1" to delete first the
-- builds of non-owners (a worker that may start; a refused one leaves them, naming the newer
-- build), "0" read only. Returns {format record or false, {owner, build, ...}, {live owner, ...}}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local records = redis.call('HGETALL', KEYS[2])
if ARGV[2] == '1' and #records > 0 then
  local known = {}
  for _, owner in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do known[owner] = true end
  local kept = {}
  for i = 1, #records, 2 do
    if known[records[i]] then
      kept[#kept + 1] = records[i]
      kept[#kept + 1] = records[i + 1]
    else
      redis.call('HDEL', KEYS[2], records[i])
    end
  end
  records = kept
end
local live = redis.call('ZRANGEBYSCORE', KEYS[3], now - tonumber(ARGV[1]), '+inf')
return {redis.call('GET', KEYS[1]), records, live}
