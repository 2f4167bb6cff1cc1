-- A block, not a script: every slot_*.lua includes it first (luascript.read puts it
-- where its "-- #include slot_acl.lua" line stands), before anything is written: the
-- ACL asked about the shard's keys (acl_check.lua), a NOPERM error answered when it
-- refuses one of the slot scripts' commands.
-- #include acl_check.lua
do
  local refused = acl_refusal(KEYS[1])
  if refused then return refused end
end
