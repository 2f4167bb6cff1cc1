-- A block, not a script: check_add_bf.lua and check_add_window_bf.lua include it.
-- bf_insert(key, items): BF.INSERT NOCREATE into the NONSCALING filter ``key``; a flag an item:
-- 1 added, 0 there before, false refused (full). Never more new items in one BF.INSERT than the
-- filter has room for: Redis answers a refused item with an error among the flags, but Valkey
-- fails the whole call, the items before it added, and which were there before is lost.
local function bf_insert(key, items)
  local info, field = redis.call('BF.INFO', key), {}
  for x = 1, #info, 2 do field[info[x].ok or info[x]] = info[x + 1] end  -- names: status replies
  local room = field['Capacity'] - field['Number of items inserted']
  if #items <= room then
    return redis.call('BF.INSERT', key, 'NOCREATE', 'ITEMS', unpack(items))
  end
  local flags, at = {}, 1
  while at <= #items and room > 0 do
    local part = {unpack(items, at, math.min(#items, at + room - 1))}
    local got = redis.call('BF.INSERT', key, 'NOCREATE', 'ITEMS', unpack(part))
    for x = 1, #part do
      flags[at + x - 1] = got[x]
      if got[x] == 1 then room = room - 1 end
    end
    at = at + #part
  end
  if at <= #items then  -- full: the items left are there before, or refused
    local rest = {unpack(items, at)}
    local seen = redis.call('BF.MEXISTS', key, unpack(rest))
    for x = 1, #rest do flags[at + x - 1] = seen[x] == 1 and 0 or false end
  end
  return flags
end
