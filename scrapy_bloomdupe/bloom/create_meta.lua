-- Store a new filter's parameters (bloom/meta.py), unless a filter is there.
--
-- KEYS[1]  the filter's meta hash
-- ARGV     field, value, field, value, ... to store when the hash is absent
--
-- Returns the stored hash as a flat field/value list: ours, or the one found.

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
