-- A block, not a script: check_add_bf.lua and the window's two scripts include it.
-- The shard lock of a one-shard check-and-add: KEYS[3] holds the token of the call that holds it, ARGV[1]
-- this call's ('' in atomic mode: no lock). `held`: whether this call holds it.

local token = ARGV[1]
local held = token ~= '' and redis.call('GET', KEYS[3]) == token
local function release()
  if held then redis.call('DEL', KEYS[3]) end
end
