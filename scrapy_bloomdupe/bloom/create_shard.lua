-- Create one Lua-engine shard (bloom/lua.py), all zeros, only if absent: never overwrites bits.
-- KEYS[1] the shard's bits; ARGV[1] its size in bytes. Returns the key's length after.
-- A 0 at the last bit (BITFIELD, which the least-privilege ACL grants) allocates it at full size
-- at once, without its bytes crossing the network.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('BITFIELD', KEYS[1], 'SET', 'u1', tonumber(ARGV[1]) * 8 - 1, 0)
end
return redis.call('STRLEN', KEYS[1])
