-- A block, not a script: check_add_bf.lua and check_add_window_bf.lua include it (luascript.read
-- puts it where their "-- #include bf_insert.lua" line stands).
-- bf_insert(key, items): BF.INSERT NOCREATE of items into key, and a flag an item: 1 added,
-- 0 there before, false refused (a full NONSCALING filter). Redis answers a full filter
-- item by item (an error reply among the flags); Valkey raises the whole call as that
-- error, with the items before the refusal added. Then an item in the filter counts as
-- added: a page perhaps fetched twice, never one lost; the others as refused.
local function bf_insert(key, items)
  local flags = redis.pcall('BF.INSERT', key, 'NOCREATE', 'ITEMS', unpack(items))
  if type(flags) == 'table' and flags.err then
    if not string.find(flags.err, 'full', 1, true) then error(flags) end
    flags = redis.call('BF.MEXISTS', key, unpack(items))
    for x = 1, #items do flags[x] = flags[x] == 1 and 1 or false end
  end
  return flags
end
