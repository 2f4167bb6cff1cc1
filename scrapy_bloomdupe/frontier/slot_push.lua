-- Queue requests into their download slots' lists (frontier/slots.py), once: a
-- retry after a lost reply queues nothing again.
--
-- KEYS[1]  the shard's ready set (a sorted set: slot -> when it may go, ms)
-- KEYS[2]  this client's push record for the shard
-- KEYS[3]  the shard's default limits of a slot (a hash: conc, delay)
-- KEYS[4]  the shard's count of requests waiting in its slots (a string)
-- KEYS[5]  optional: the shard's intake (a sorted set, where a Redis Cluster's
--          filter queues a request whose slot lives on another shard), with
--          ARGV[1] '': an entry is queued only if this call removed it from there
--          (a move, safe to repeat: a retry, or another worker's move, queues
--          nothing); with a push number: the shard's robots.txt delays (slot ->
--          ms), each slot's delay at least its robots.txt's
-- ARGV[1]  this push's number (this client's, increasing); '' for a move from
--          the intake (no record)
-- ARGV[2]  the record's TTL in ms
-- ARGV[3]  the shard's slot prefix ("{K:i}:slot:")
-- ARGV[4..] per request: its slot's name (keys.slot_name), its priority, the
--          slot's concurrency (0: no limit) and delay in ms, the entry's bytes
--
-- Appends each entry to "<prefix><slot>:<priority>" and keeps the slot's state
-- (slot_queue.lua; its hash, slot_state.lua: prios, the priorities in use, highest first,
-- comma-separated; flight; conc; delay; next, the next allowed start; backoff,
-- paused until; both ms on Redis's clock), whose limits the push sets; a slot
-- with room goes into the ready set (one already there keeps its place). Keys
-- touched beyond KEYS: the slots' hashes and lists, all in the shard's hash tag
-- (one Cluster slot; see slots.py).
-- Returns how many it queued, or -1 when this push already ran (a retry).

-- #include slot_acl.lua (the ACL asked before anything is written)
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then return -1 end
-- The requests, five values each (slot, priority, conc, delay, entry).
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
