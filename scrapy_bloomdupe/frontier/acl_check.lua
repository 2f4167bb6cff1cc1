-- A block, not a script: slot_acl.lua and the filter's sink (sink.lua) include it.
-- Redis does not undo what a script wrote before a command of it was refused: a
-- slot's list pushed and its place in the ready set not, or a counter not moved,
-- would leave requests no pop finds (a crawl that never ends). So the ACL is asked
-- first whether every command of the slot scripts may run on a shard's keys:
-- acl_refusal(k) is the NOPERM error to answer, having written nothing, when one may
-- not on key ``k`` (nil when all may, or when Redis has no redis.acl_check_cmd).
-- (slot_pop.lua's ZSCORE, of the declared pop a Redis Cluster would need, is not
-- asked: no crawl runs it yet, and the crawler's ACL, docs/security.md, lacks it.)
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
