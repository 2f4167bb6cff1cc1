-- Queue requests without a filter check (frontier/queue.py: dont_filter, requeues), once: a
-- retry after a lost reply queues nothing again. KEYS[1] the shard's queue; KEYS[2] this client's
-- push record. ARGV: push number (increasing), record TTL ms, then per request score and bytes.
-- Returns how many it queued, or -1 when this push already ran (a retry).
if redis.call('GET', KEYS[2]) == ARGV[1] then return -1 end
for j = 3, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], ARGV[j], ARGV[j + 1])
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return (#ARGV - 2) / 2
