-- weir sliding-window log: acquire `cost` to `want` units from one key, atomically.
--
-- Runs after common.lua (clock_us, idiv, ns_of_us, int, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::sliding_log::SlidingLog::acquire: every admitted unit
-- is one event; an event at t counts while now − window < t.
--
-- KEYS[1]  log key weir:{<tag>}:sliding_log, a sorted set: score = event time (µs),
--          member = a sequence number, so that events at the same µs stay distinct.
-- KEYS[2]  sequence key weir:{<tag>}:sliding_log:seq, the last member number used
--          (same hash tag, so same slot; same TTL as the log).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
--          Key deadlines (PXAT) are absolute instants of this clock, so a pinned
--          clock behind Redis's real one writes keys that are already expired.
-- ARGV[2]  cost    units the request needs (0 = peek).
-- ARGV[3]  want    units it would like now (>= cost): a lease.
-- ARGV[4]  reserve (unused)
-- ARGV[5]  hold_us how long a granted unit may wait to be spent: every unit is logged
--                  at now + hold_us, the latest instant it may be spent, so the log
--                  counts it in every window that can contain its real spend.
-- ARGV[6]  horizon_us (unused)
-- ARGV[7]  limit   events per window (<= 100000: the log holds at most that many).
-- ARGV[8]  window_us
--
-- Reply {allowed 0/1, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us,
-- due_ns, spacing_ns, valid_ns}: granted units are due now and valid for hold_us;
-- the two durations as decimal strings of ns ("-1" = no retry time), now_us in µs.
--
-- Exactness: scores are µs since the epoch, exact in the set's doubles.
--
-- Why atomic: trim, count, compare and add must see no other request in between, or two
-- requests that both count limit − 1 events would both be added. The count is taken
-- before adding, and a denied request adds nothing (hammering a limited key does not
-- extend its ban). The TTL is the newest event + window: then every event has left.

local log, seq = KEYS[1], KEYS[2]
local now = clock_us()
local cost = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local hold = tonumber(ARGV[5])
local limit = tonumber(ARGV[7])
local window = tonumber(ARGV[8])

-- Events at or before now − window have left (inclusive bound).
if now >= window then
  redis.call('ZREMRANGEBYSCORE', log, '-inf', int(now - window))
end
local count = redis.call('ZCARD', log)
local free = limit - count
if free < 0 then free = 0 end

-- When the event of 0-based rank `rank` (oldest first) leaves the window, in ns from now.
local function leaves_ns(rank)
  local r = redis.call('ZRANGE', log, rank, rank, 'WITHSCORES')
  return ns_of_us(tonumber(r[2]) + window - now)
end

local function idle_ns()
  if count == 0 then return '0' end
  return leaves_ns(count - 1)
end

if cost > free then
  -- `cost` fits once the oldest count + cost − limit events have left.
  local retry = '-1'
  if cost <= limit then retry = leaves_ns(count + cost - limit - 1) end
  return {0, 0, limit, free, retry, idle_ns(), now, '0', '0', '0'}
end

local granted = want
if granted < cost then granted = cost end
if granted > free then granted = free end
if granted == 0 then
  return {1, 0, limit, free, '-1', idle_ns(), now, '0', '0', '0'}
end

local last = redis.call('INCRBY', seq, granted)
local score = int(now + hold)
local args = {}
for member = last - granted + 1, last do
  args[#args + 1] = score
  args[#args + 1] = int(member)
  -- unpack() is bounded by Lua's C stack: add in chunks.
  if #args >= 1000 then
    redis.call('ZADD', log, unpack(args))
    args = {}
  end
end
if #args > 0 then redis.call('ZADD', log, unpack(args)) end

-- The newest event is now + hold, or a later one if the clock went back.
local newest = now + hold
local top = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) > newest then newest = tonumber(top[2]) end
local deadline = expire_at_ms(newest + window)
redis.call('PEXPIREAT', log, deadline)
redis.call('PEXPIREAT', seq, deadline)
return {1, granted, limit, free - granted, '-1', ns_of_us(hold + window), now, '0', '0',
  ns_of_us(hold)}
