-- Retire queue entries that do not decode into requests (frontier/queue.py): each goes raw, with
-- its reason, to the failed record (bloomdupe failed) and out of the lease hash or the queue (a
-- reap put it back), never to come back. Only where record and shard share a slot (shard 0).
-- KEYS[1] the shard's leases; KEYS[2] its queue; KEYS[3] the failed stream. ARGV: its MAXLEN ~,
-- then per entry 'lease' or 'queued', the field or member, url, method, reason, score, request.
-- Returns, an entry, 1 if this call removed and recorded it, else 0: a retry, or two workers that
-- met one entry, record and count it once.
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
