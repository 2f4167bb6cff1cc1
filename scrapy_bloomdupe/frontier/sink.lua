-- A block, not a script: the filter's check-and-add scripts (bloom/check_add_*.lua)
-- include it ("-- #include frontier/sink.lua") to queue each item they find new
-- straight into its download slot's list (slots.py), in the same script: a request
-- is never in the filter without being queued.
--
-- A section's sink is five keys of its queue shard, in this order (sink_keys):
--   the intake (a sorted set), the ready set, the default limits of a slot, the count
--   of requests waiting in the slots, the robots.txt delays (slot -> ms)
-- and its arguments (ARGV from ``at``): the shard's slot prefix, then five values an
-- item: its slot's name (keys.slot_name), or '' for the intake instead (a Redis
-- Cluster's "crawl" mode, where the slot's home is another shard: a pop moves it
-- there, leased.py); its priority as its list's key spells it (for the intake,
-- its score); the slot's concurrency (0: no limit) and delay in ms (raised to the
-- slot's robots.txt delay here); the entry's bytes.
-- Defines sink_refusal(k), the NOPERM error when the ACL refuses one of the sink's
-- commands on the section's keys ``k`` (asked before the script's first write), and
-- sink(k, at, news), which queues item j where news[j] is '1'.
local prefix, defaults_key
-- #include slot_state.lua
-- #include slot_queue.lua
-- #include acl_check.lua

local function sink_refusal(k)
  return acl_refusal(k[2])
end

local function sink(k, at, news)
  prefix = ARGV[at]
  local items = {}
  for j = 1, #news do
    if news[j] == '1' then
      local i = at + 1 + 5 * (j - 1)
      if ARGV[i] == '' then
        redis.call('ZADD', k[1], ARGV[i + 1], ARGV[i + 4])
      else
        for v = 0, 4 do items[#items + 1] = ARGV[i + v] end
      end
    end
  end
  if #items > 0 then
    defaults_key = k[3]
    read_defaults()
    queue_in_slots(items, 1, k[2], k[4], nil, k[5])
  end
end
