-- A block, not a script: slot_acl.lua and sink.lua include it. Redis does not undo a script's
-- writes before a refused command: a list pushed but its slot not ready, or a counter not moved,
-- leaves requests no pop finds (a crawl that never ends). So acl_refusal(k) first asks about every
-- slot-script command on key ``k``: NOPERM, having written nothing, or nil. Not asked: slot_pop's
-- ZSCORE (a Cluster's declared pop, which no crawl runs yet; the crawler's ACL lacks it).
local function acl_refusal(k)
  if not redis.acl_check_cmd then return nil end
  for _, c in ipairs({{'TIME'}, {'ZADD', k, '0', 'm'}, {'ZREM', k, 'm'},
                      {'ZRANGE', k, '0', '0'}, {'ZRANGEBYSCORE', k, '0', '0'},
                      {'HSET', k, 'f', 'v'}, {'HDEL', k, 'f'},
                      {'HGET', k, 'f'}, {'HMGET', k, 'f'}, {'HGETALL', k}, {'DEL', k},
                      {'EXISTS', k}, {'RPUSH', k, 'v'}, {'LPUSH', k, 'v'}, {'LPOP', k},
                      {'LREM', k, '1', 'v'}, {'LRANGE', k, '0', '0'},
                      {'INCRBY', k, '1'}, {'DECRBY', k, '1'}, {'SET', k, 'v'},
                      {'GET', k}}) do
    if not redis.acl_check_cmd(unpack(c)) then
      return redis.error_reply("NOPERM this user has no permissions to run the '" ..
                               string.lower(c[1]) .. "' command")
    end
  end
  return nil
end
