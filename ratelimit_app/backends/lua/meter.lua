-- Every leaky bucket of a request, atomically (see ratelimit_app/gcra.py).
--
-- KEYS[i] is the i-th subject's TAT key. ARGV[1] is the client's time in microseconds, t;
-- then seven ARGV per subject, from offset o (ARGV[n] stands for ARGV[o + n]): ARGV[1] the
-- rate's count n; the request's emissions c * T (c: its cost; T: the interval) and the
-- tolerance tau, each as microseconds and ticks of 1/n microsecond: ARGV[2] and ARGV[3],
-- ARGV[4] and ARGV[5]; ARGV[6] the mode: "c" counts (stores the new TAT when the request
-- fits), "f" counts whether it fits or not (a charge after the view), "l" only looks, "u"
-- takes back the request that stored ARGV[7], if the TAT is still that one.
-- A TAT is stored as "<microseconds>:<ticks>", so every number stays an exact integer in
-- Lua's doubles. The value of margin below is put in by redis.py when it loads this file:
-- the milliseconds a stored TAT outlives the moment its bucket is empty.
--
-- The reply, per subject: the TAT read ("" if none) and the TAT stored ("" if none).
local t = tonumber(ARGV[1])
local margin = MARGIN_MS
-- The microseconds ahead of t a charge ("f") may put a TAT at most: put in by redis.py.
local most = MOST_US
local function parse(text, n)
  local a, r = string.match(text, '^(%d+):(%d+)$')
  if not a or tonumber(r) >= n then
    error('not a leaky-bucket TAT: ' .. string.sub(text, 1, 40))
  end
  return tonumber(a), tonumber(r)
end
local function store(key, a, r)
  local text = string.format('%.0f:%.0f', a, r)
  redis.call('SET', key, text, 'PX', math.floor((a - t) / 1000) + margin)
  return text
end
local reply = {}
for i = 1, #KEYS do
  local o = 1 + (i - 1) * 7
  local key, mode = KEYS[i], ARGV[o + 6]
  local n = tonumber(ARGV[o + 1])
  local q, rem = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  local stored = redis.call('GET', key)
  local written = ''
  if stored then parse(stored, n) end
  if mode == 'u' then
    if stored == ARGV[o + 7] then
      local a, r = parse(stored, n)
      a, r = a - q, r - rem
      if r < 0 then a, r = a - 1, r + n end
      if a > t or (a == t and r > 0) then store(key, a, r) else redis.call('DEL', key) end
    end
  elseif (mode == 'c' or mode == 'f') and n > 0 then
    local a, r = t, 0
    if stored then
      local sa, sr = parse(stored, n)
      if sa > t or (sa == t and sr > 0) then a, r = sa, sr end
    end
    a, r = a + q, r + rem
    if r >= n then a, r = a + 1, r - n end
    local tau_a, tau_r = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
    if mode == 'f' and a - t >= most then a, r = t + most, 0 end
    if mode == 'f' or a - t < tau_a or (a - t == tau_a and r <= tau_r) then
      written = store(key, a, r)
    end
  end
  reply[#reply + 1] = stored or ''
  reply[#reply + 1] = written
end
return reply
