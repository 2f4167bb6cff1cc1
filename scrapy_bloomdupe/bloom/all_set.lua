-- A block, not a script: the bit-array check-and-add scripts include it. Whether every reply of
-- a BITFIELD GET (or SET's old values) is 1: the item's bits all set.
local function all_set(bits)
  for _, bit in ipairs(bits) do
    if bit == 0 then return false end
  end
  return true
end
