-- One check of one or more subjects (the rules of a request), atomically. Follows
-- drop_stale.lua.
--
-- Nine ARGV per subject, from offset o; below, ARGV[n] stands for ARGV[o + n]. ARGV[1] is
-- the subject's key base. The subject's KEYS entry carries its hash tag, so the call is
-- routed to the right node, and every key built from the base shares that tag (one Redis
-- Cluster slot per subject).
--
-- A uniform window's buckets are the fields of one hash per window (base .. ":W/G"): a fine
-- bucket's field is its index, a coarse bucket's "x" and its index. Hierarchical buckets
-- are keys of their own (base .. ":hL:index"). One hash per window, not one per level: a
-- check makes one HMGET and (for a new subject) one EXPIRE per window, and each call into
-- Redis from a script costs the server a few microseconds.
-- Every argument is a string of space-separated words, few and short: parsing them is a
-- good share of the script's time.
--
-- ARGV[2] "hash field ..." and ARGV[3] "suffix ..." are taken back first (a refused hit):
-- decremented, and a bucket back at zero is dropped, as is one that had vanished, which
-- the decrement would otherwise recreate at -1 with no TTL.
-- ARGV[4] "hash field ttl most ..." increments each rate's coarsest level, ARGV[5]
-- "hash field ttl ..." the other hash fields, ARGV[6] "suffix ttl ..." keys.
-- A hash's TTL is set when an increment creates one of its fields (returns 1), once per
-- call: every write into one hash carries the same TTL, the longest any of its fields
-- needs, and a bucket's first hit is its oldest, so that TTL outlives every later check
-- that reads it. A hash lives as long as its newest field needs (the server's clock only
-- moves forward: a later EXPIRE never shortens an earlier one's reach).
-- ARGV[7] "hash fine coarse ..." (see drop_stale): when an increment creates a bucket of
-- a coarsest level (once per coarse bucket: a sixth of a window with 60 buckets a window)
-- and its hash then holds more than "most" fields (so some are stale; never for a new
-- subject), every written hash of the subject is trimmed: its fields from two windows
-- before the oldest one a check at this time reads (redis.py's _stale_before). So a client
-- whose clock runs up to two windows ahead cannot drop what others still count, and a hash
-- holds at most about three windows of fields (its TTL drops it whole when the subject
-- goes quiet).
-- ARGV[8] "hash prefix first last ..." are ranges of hash fields to read (prefix "x" for
-- coarse fields, "." for fine ones): the fields a check reads at one level are
-- consecutive, and the consecutive ranges of one hash are read by one HMGET. ARGV[9]
-- "suffix ..." are keys to read (one MGET).
--
-- The reply is one string for the whole call, numbers separated by spaces: per subject,
-- the new values of its increments (in the order above), then the value of every bucket
-- read ("0" for none), in the order of the reads above. One string, because redis-py
-- parses a reply element by element in Python.

local out = {}
local expiring = {}
local function increment(key, field, ttl)
  local v = redis.call('HINCRBY', key, field, 1)
  if v == 1 and not expiring[key] then
    redis.call('EXPIRE', key, ttl)
    expiring[key] = true
  end
  out[#out + 1] = v
  return v
end
local function read(key, names)
  local values = redis.call('HMGET', key, unpack(names))
  local n = #out
  for i = 1, #names do out[n + i] = values[i] or '0' end
end
for o = 0, #ARGV - 1, 9 do
  local base = ARGV[o + 1]
  for hash, field in string.gmatch(ARGV[o + 2], "(%S+) (%S+)") do
    local key = base .. hash
    if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
  end
  for suffix in string.gmatch(ARGV[o + 3], "%S+") do
    local key = base .. suffix
    if redis.call('DECR', key) <= 0 then redis.call('DEL', key) end
  end
  local trim = false
  for hash, field, ttl, most in string.gmatch(ARGV[o + 4], "(%S+) (%S+) (%S+) (%S+)") do
    local key = base .. hash
    if increment(key, field, ttl) == 1 and redis.call('HLEN', key) > tonumber(most) then
      trim = true
    end
  end
  for hash, field, ttl in string.gmatch(ARGV[o + 5], "(%S+) (%S+) (%S+)") do
    increment(base .. hash, field, ttl)
  end
  for suffix, ttl in string.gmatch(ARGV[o + 6], "(%S+) (%S+)") do
    local key = base .. suffix
    local v = redis.call('INCR', key)
    if v == 1 then redis.call('EXPIRE', key, ttl) end
    out[#out + 1] = v
  end
  if trim then drop_stale(base, ARGV[o + 7]) end
  local hash, names = nil, {}
  for h, prefix, first, last in string.gmatch(ARGV[o + 8], "(%S+) (%S+) (%S+) (%S+)") do
    if h ~= hash then
      if hash then read(base .. hash, names) end
      hash, names = h, {}
    end
    local n = #names
    if prefix == '.' then
      for field = tonumber(first), tonumber(last) do n = n + 1; names[n] = field end
    else
      for field = tonumber(first), tonumber(last) do n = n + 1; names[n] = prefix .. field end
    end
  end
  if hash then read(base .. hash, names) end
  local keys = {}
  for suffix in string.gmatch(ARGV[o + 9], "%S+") do keys[#keys + 1] = base .. suffix end
  if #keys > 0 then
    local values = redis.call('MGET', unpack(keys))
    for i = 1, #keys do out[#out + 1] = values[i] or '0' end
  end
end
return table.concat(out, ' ')
