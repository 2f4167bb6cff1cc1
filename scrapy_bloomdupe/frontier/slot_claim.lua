-- Take entries out of a shard's intake to move them to their slots' home shards ("crawl"
-- politeness on a Cluster, frontier/leased.py): each still there goes to the owner's lease list as
-- "m|<score>|<entry>", counted as a lease until the move ends (slot_ack.lua) or, its owner dead,
-- goes back (slot_reap.lua): in the intake, a move or its slot, a request is never lost. KEYS[1]
-- the intake (entry -> score, -priority); KEYS[2] the slot-lease count (list KEYS[2]..':'..owner);
-- KEYS[3] the owners: the heartbeat goes first, so an owner a reap forgot is known again before its
-- list holds anything (else no reap finds it). ARGV: owner, then per entry its score and bytes.
-- Returns every entry in a move the list holds: this call's and a lost reply's (one move at a
-- time: the caller pushes them all).
-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
redis.call('ZADD', KEYS[3], t[1] * 1000 + math.floor(t[2] / 1000), ARGV[1])
local held = KEYS[2] .. ':' .. ARGV[1]
local moving = {}
for j = 2, #ARGV, 2 do
  if redis.call('ZREM', KEYS[1], ARGV[j + 1]) == 1 then
    moving[#moving + 1] = 'm|' .. ARGV[j] .. '|' .. ARGV[j + 1]
  end
end
for i = 1, #moving, 1000 do
  redis.call('RPUSH', held, unpack(moving, i, math.min(i + 999, #moving)))
end
if #moving > 0 then redis.call('INCRBY', KEYS[2], #moving) end
local out = {}
for _, e in ipairs(redis.call('LRANGE', held, 0, -1)) do
  if string.sub(e, 1, 2) == 'm|' then out[#out + 1] = e end
end
return out
