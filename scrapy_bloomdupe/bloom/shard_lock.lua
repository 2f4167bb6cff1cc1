-- A block, not a script: check_add_bf.lua and the window's two scripts include it. KEYS[3], the
-- shard lock, holds its holder's token; ARGV[1] is this call's ('' atomic mode). `held`: ours.
local token = ARGV[1]
local held = token ~= '' and redis.call('GET', KEYS[3]) == token
local function release()
  if held then redis.call('DEL', KEYS[3]) end
end
