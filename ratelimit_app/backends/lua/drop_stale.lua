-- A fragment, not a script: redis.py puts it in front of window.lua and trim.lua, which
-- both call drop_stale.
--
-- drop_stale(base, spec) drops the stale fields of a subject's hashes. spec is
-- "hash fine coarse ...": in the hash base .. hash, the fine fields (an index) before fine
-- and the coarse fields ("x" and an index) before coarse are deleted.
local function drop_stale(base, spec)
  for hash, fine, coarse in string.gmatch(spec, "(%S+) (%S+) (%S+)") do
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
end
