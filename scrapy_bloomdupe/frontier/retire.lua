-- Retire queue entries that cannot be decoded into requests (frontier/queue.py): each
-- goes to the failed requests' record (bloomdupe failed), raw, with its reason, and
-- leaves the lease hash (a popped entry) or the queue (one a reap put back), so that it
-- never comes back by itself. Only where the record and the shard share a slot (one
-- node; shard 0 of a cluster).
--
-- KEYS[1]  the shard's leases (a hash: "<owner>:<pop>.<j>" -> "<score>|<request>")
-- KEYS[2]  the shard's queue (a sorted set)
-- KEYS[3]  the failed requests' stream (fields: score, request, url, method, reason)
-- ARGV[1]  the stream's length limit (XADD MAXLEN ~)
-- ARGV[2..] per entry seven values: 'lease' or 'queued', the lease's field or the
--          queued member, url, method, reason, score, request (the raw bytes)
--
-- An entry is recorded only if this call removed it: a retry after a lost reply, or
-- an entry another worker took or retired meanwhile, records nothing again.
-- Returns, an entry, 1 if this call retired it, else 0 (the caller counts and logs
-- only those: two workers that met one entry, say in an intake both sorted, count it
-- once).

local retired = {}
for i = 2, #ARGV, 7 do
  local removed
  if ARGV[i] == 'lease' then
    removed = redis.call('HDEL', KEYS[1], ARGV[i + 1])
  else
    removed = redis.call('ZREM', KEYS[2], ARGV[i + 1])
  end
  if removed == 1 then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*', 'url', ARGV[i + 2],
               'method', ARGV[i + 3], 'reason', ARGV[i + 4], 'score', ARGV[i + 5],
               'request', ARGV[i + 6])
  end
  retired[#retired + 1] = removed
end
return retired
