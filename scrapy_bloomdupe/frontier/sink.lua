-- A block, not a script: the filter's bloom/check_add_*.lua include it to queue each new item
-- into its download slot's list (slots.py) in the same script: a request is never in the filter
-- without being queued. A sink: five keys of its queue shard (intake, ready set, default slot
-- limits, waiting count, robots.txt delays) and arguments from ARGV[at]: slot prefix, then five an
-- item as slot_queue.lua takes them, but a slot name '' queues into the intake, the priority then
-- its score (a Cluster's "crawl" mode: a pop moves it home, leased.py). sink_refusal(k): NOPERM if
-- the ACL refuses a sink command on keys ``k`` (asked before the first write); sink(k, at, news)
-- queues item j where news[j] is '1'.
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
