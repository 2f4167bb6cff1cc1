-- A block, not a script: every slot_*.lua includes it first, before any write: NOPERM when the
-- ACL refuses a slot script's command on the shard's keys (acl_check.lua).
-- #include acl_check.lua
do
  local refused = acl_refusal(KEYS[1])
  if refused then return refused end
end
