-- A block, not a script: the four check_add_*.lua include it (luascript.read puts
-- it where their "-- #include op_log.lua" line stands). The op log of a check-and-add
-- call (bloom/oplog.py): KEYS[1] holds "<ack>|<call>:<reply>|<call>:<reply>|...",
-- ARGV[2] is this call's id, ARGV[3] the ack (calls below it have their answers: the
-- log may forget them), ARGV[4] the log's TTL in ms. The script defines release()
-- (frees the locks this call holds) before it.
--
-- A call the log holds (a retry after a lost reply) returns the answer recorded the
-- first time and changes nothing else; any other ends with answer(reply).

local call, ack = ARGV[2], ARGV[3]
local log = redis.call('GET', KEYS[1])
local head = ack .. '|'
if log and string.sub(log, 1, #head) == head then
  local tag = '|' .. call .. ':'
  local at = string.find(log, tag, #head, true)
  if at then
    release()
    local from = at + #tag
    return string.sub(log, from, string.find(log, '|', from, true) - 1)
  end
else
  log = head
end

-- The call's end: its reply recorded in the log, its locks freed.
local function answer(reply)
  redis.call('SET', KEYS[1], log .. call .. ':' .. reply .. '|', 'PX', ARGV[4])
  release()
  return reply
end
