-- Takes back refused hits, inside a check's transaction (redis.py): a transaction cannot
-- decide on a reply, and a bucket back at zero must go.
--
-- KEYS[1] is the subject's key base; it carries the subject's hash tag, as every key built
-- from it does (one Redis Cluster slot per subject). ARGV[1] "hash field ..." are hash
-- fields, ARGV[2] "suffix ..." keys of their own. Each is decremented; one back at zero is
-- dropped, as is one that had vanished, which the decrement would recreate at -1 with no
-- TTL.
local base = KEYS[1]
for hash, field in string.gmatch(ARGV[1], "(%S+) (%S+)") do
  local key = base .. hash
  if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
end
for suffix in string.gmatch(ARGV[2], "%S+") do
  local key = base .. suffix
  if redis.call('DECR', key) <= 0 then redis.call('DEL', key) end
end
return 0
