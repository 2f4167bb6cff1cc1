-- Put failed requests back in the queue (frontier/failed.py: bloomdupe failed --requeue).
-- KEYS[1] the failed stream (fields: score, request, ...); KEYS[2] shard 0's queue. ARGV: ids.
-- Moves each record's request back with its score and deletes the record, atomically.
-- Returns how many it moved (ids not found are skipped).
local moved = 0
for _, id in ipairs(ARGV) do
  local found = redis.call('XRANGE', KEYS[1], id, id)[1]
  if found then
    local fields, score, request = found[2], nil, nil
    for j = 1, #fields, 2 do
      if fields[j] == 'score' then score = fields[j + 1] end
      if fields[j] == 'request' then request = fields[j + 1] end
    end
    redis.call('ZADD', KEYS[2], score, request)
    redis.call('XDEL', KEYS[1], id)
    moved = moved + 1
  end
end
return moved
