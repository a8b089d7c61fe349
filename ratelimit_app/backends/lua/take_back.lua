-- Takes back refused hits, inside a check's transaction (redis.py): a transaction cannot
-- decide on a reply, and a bucket back at zero must go.
--
-- KEYS[1] is the subject's key base; it carries the subject's hash tag, as every key built
-- from it does (one Redis Cluster slot per subject). ARGV[1] "hash field ..." are hash
-- fields, ARGV[2] "suffix ..." keys of their own, ARGV[3] the amount to take back (the
-- request's cost). Each is decremented by it; one back at zero or below is dropped (as
-- memcached's decrement stops at zero), as is one that had vanished, which the decrement
-- would recreate below zero with no TTL.
local base, amount = KEYS[1], tonumber(ARGV[3])
for hash, field in string.gmatch(ARGV[1], "(%S+) (%S+)") do
  local key = base .. hash
  if redis.call('HINCRBY', key, field, -amount) <= 0 then redis.call('HDEL', key, field) end
end
for suffix in string.gmatch(ARGV[2], "%S+") do
  local key = base .. suffix
  if redis.call('DECRBY', key, amount) <= 0 then redis.call('DEL', key) end
end
return 0
