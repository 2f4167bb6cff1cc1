-- Take entries out of a shard's intake for a move into their slots' home shards
-- (``"crawl"`` politeness on a Redis Cluster, frontier/leased.py): each entry
-- still in the intake leaves it for the owner's lease list, as "m|<score>|<entry>",
-- counted with the leases until the move is done (slot_ack.lua takes it out) or,
-- its owner dead, put back in the intake (slot_reap.lua). A request is so always
-- in the intake, in a move, or in its slot: never lost, whatever fails between the
-- move's round trips.
--
-- KEYS[1]  the shard's intake (a sorted set: entry -> score, -priority)
-- KEYS[2]  the shard's count of slot leases (a string); KEYS[2] .. ':' .. owner is
--          the owner's lease list
-- KEYS[3]  the shard's owners (a sorted set: owner -> last heartbeat, ms): the
--          owner's heartbeat, as a pop's (an owner a reap forgot, back from a pause,
--          is known again before its list holds anything, or its reap would never
--          find the list)
-- ARGV[1]  the owner
-- ARGV[2..] per entry: its score (an integer), the entry's bytes
--
-- Returns every entry the owner's list holds in a move: this call's, and those of
-- a call whose reply was lost (one move at a time: the caller pushes them all).

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
