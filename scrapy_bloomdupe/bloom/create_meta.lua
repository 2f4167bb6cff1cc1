-- Store a new filter's parameters (bloom/meta.py) unless a filter is there. KEYS[1] its meta
-- hash; ARGV field, value, ... Returns the stored hash, flat: ours, or the one found.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
