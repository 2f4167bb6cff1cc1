-- Pause a download slot for every worker until a time (frontier/slots.py): a Retry-After, or an
-- adaptive back-off; a slot not yet known keeps it for the requests pushed later.
-- KEYS[1] the shard's ready set; KEYS[2] the slot's hash; KEYS[3] the default slot limits.
-- ARGV: slot prefix ("{K:i}:slot:"), slot name (keys.slot_name), until when (ms, Redis's clock;
-- a later back-off already set stays). Returns when the slot's back-off ends.
-- #include slot_acl.lua (the ACL asked before anything is written)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local defaults_key = KEYS[3]
-- #include slot_state.lua (a slot's state: the same block in every slot_*.lua)
local s = load(KEYS[2])
local until_ms = math.max(tonumber(s.backoff), tonumber(ARGV[3]))
s.backoff = until_ms
place(ARGV[2], s, now, true)
return until_ms
