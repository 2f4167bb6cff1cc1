-- Queue requests into their download slots' lists (frontier/slots.py), once: a retry after a lost
-- reply queues nothing again. KEYS[1] the shard's ready set; KEYS[2] this client's push record;
-- KEYS[3] the default slot limits; KEYS[4] the waiting count; KEYS[5] optional: with ARGV[1] '' the
-- intake (where a Cluster's filter queues a request whose slot is on another shard; only entries
-- this call removes from it are queued, so a retry or another worker's move queues nothing), else
-- the robots.txt delays (slot -> ms; a slot's delay is at least its robots.txt's). ARGV: push
-- number (this client's, increasing; '' for a move from the intake, unrecorded), record TTL ms,
-- slot prefix ("{K:i}:slot:"), then per request: slot name (keys.slot_name), priority, concurrency
-- (0: none), delay ms, entry bytes (slot_queue.lua queues them).
-- Returns how many it queued, or -1 when this push already ran (a retry).
-- #include slot_acl.lua (the ACL asked before anything is written)
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then return -1 end
local items, first = ARGV, 4
local intake = ARGV[1] == '' and KEYS[5] or nil
local robots = not intake and KEYS[5] or nil
local prefix = ARGV[3]
local defaults_key = KEYS[3]
-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)
-- #include slot_queue.lua (the push itself, shared with the filter's sink)
local queued = queue_in_slots(items, first, KEYS[1], KEYS[4], intake, robots)
if ARGV[1] ~= '' then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2]) end
return queued
