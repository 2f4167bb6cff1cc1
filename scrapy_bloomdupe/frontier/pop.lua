-- Lease requests from a shard's queue (frontier/queue.py), highest priority first: into the lease
-- hash as "<owner>:<pop>.<j>", marking the owner alive (Redis's clock). KEYS[1] the shard's queue;
-- KEYS[2] its leases; KEYS[3] its owners. ARGV: owner id, pop number (increasing), most requests.
-- Returns the leased "<score>|<request>"; a pop that already ran (a retry after a lost reply)
-- returns the same, moving nothing. NOPERM, having written nothing, if the ACL denies HSET.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.acl_check_cmd and not redis.acl_check_cmd('HSET', KEYS[2], 'f', 'v') then
  return redis.error_reply("NOPERM this user has no permissions to run the 'hset' command")
end
redis.call('ZADD', KEYS[3], now, ARGV[1])
local prefix = ARGV[1] .. ':' .. ARGV[2] .. '.'
local count = tonumber(ARGV[3])
local out = {}
local again = redis.call('HGET', KEYS[2], prefix .. '0')
if again then
  out[1] = again
  for j = 1, count - 1 do
    local entry = redis.call('HGET', KEYS[2], prefix .. j)
    if not entry then break end
    out[#out + 1] = entry
  end
  return out
end
local items = redis.call('ZRANGE', KEYS[1], 0, count - 1, 'WITHSCORES')
if #items == 0 then return out end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #items / 2 - 1)
for j = 1, #items, 2 do
  local entry = items[j + 1] .. '|' .. items[j]
  redis.call('HSET', KEYS[2], prefix .. ((j - 1) / 2), entry)
  out[#out + 1] = entry
end
return out
