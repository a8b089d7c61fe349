-- Drops the stale fields of a subject's hashes, after a check's transaction created a
-- coarse bucket in a hash that holds more fields than three windows need (redis.py).
--
-- KEYS[1] is the subject's key base (it carries the subject's hash tag). ARGV[1] is
-- "hash fine coarse ...": in the hash base .. hash, the fine fields (an index) before fine
-- and the coarse fields ("x" and an index) before coarse are deleted.
local base = KEYS[1]
for hash, fine, coarse in string.gmatch(ARGV[1], "(%S+) (%S+) (%S+)") do
  local key = base .. hash
  local before, coarse_before = tonumber(fine), tonumber(coarse)
  local dropped = {}
  for _, field in ipairs(redis.call('HKEYS', key)) do
    local old
    if string.byte(field) == 120 then  -- "x": a coarse bucket
      old = tonumber(string.sub(field, 2)) < coarse_before
    else
      old = tonumber(field) < before
    end
    if old then dropped[#dropped + 1] = field end
  end
  if #dropped > 0 then redis.call('HDEL', key, unpack(dropped)) end
end
return 0
