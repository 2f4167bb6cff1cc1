-- A block, not a script: the four check_add_*.lua include it after defining release(). The op
-- log (bloom/oplog.py), KEYS[1]: "<ack>|<call>:<reply>|..."; ARGV[2] the call id, ARGV[3] the ack
-- (calls below it are forgotten), ARGV[4] its TTL ms. A call it holds (a retry after a lost
-- reply) returns its recorded answer, changing nothing; any other ends with answer(reply).
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
local function answer(reply)  -- the call's end: its reply logged, its locks freed
  redis.call('SET', KEYS[1], log .. call .. ':' .. reply .. '|', 'PX', ARGV[4])
  release()
  return reply
end
