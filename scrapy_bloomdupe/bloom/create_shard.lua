-- Create one Lua-engine shard (bloom/lua.py), all zeros, only if it is absent.
--
-- KEYS[1]  the shard's bits
-- ARGV[1]  its size in bytes
--
-- Returns the key's length after. Never overwrites bits. Writing a 0 at the last
-- bit (what SETRANGE key size-1 "\0" does, with BITFIELD, which the
-- least-privilege ACL of docs/security.md already grants) allocates the string
-- once, at full size, without its bytes crossing the network.

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('BITFIELD', KEYS[1], 'SET', 'u1', tonumber(ARGV[1]) * 8 - 1, 0)
end
return redis.call('STRLEN', KEYS[1])
