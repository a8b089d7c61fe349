-- Drops the stale fields of a subject's hashes, for the checks sent as a transaction
-- (RedisBackend._transaction), which cannot decide on a reply inside their round trip.
-- Follows drop_stale.lua. KEYS[1] routes the call (it carries the subject's hash tag),
-- ARGV[1] is the subject's key base, ARGV[2] "hash fine coarse ...", as ARGV[7] of
-- window.lua.
drop_stale(ARGV[1], ARGV[2])
return 0
