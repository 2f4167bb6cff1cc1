-- Release a shard lock (bloom/lock.py) only if it still holds this token. KEYS[1] the lock;
-- ARGV[1] the token that took it. Returns 1 when deleted, 0 otherwise (it expired, and another
-- client may hold it now: left alone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
