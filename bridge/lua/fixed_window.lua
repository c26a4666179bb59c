-- weir fixed window: acquire `cost` to `want` units from one key, atomically.
--
-- Runs after common.lua (clock_us, idiv, ns_of_us, int, window_current, expire_at_ms), in
-- one chunk.
--
-- Mirrors weir_core::algorithms::fixed_window::FixedWindow::decide and Limit::acquire:
-- windows [k × window, (k + 1) × window) aligned to the Unix epoch, one counter each. A
-- count above the limit (a debt a settle left, fixed_window_settle.lua) is carried into
-- the next windows, `limit` less per window elapsed.
--
-- KEYS[1]  state key weir:{<tag>}:fixed_window, a string "<count> <window_start_us>"
--          (absent = nothing counted in the current window, and no debt).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
--          Key deadlines (PXAT) are absolute instants of this clock, so a pinned
--          clock behind Redis's real one writes keys that are already expired.
-- ARGV[2]  cost    units the request needs (0 = peek).
-- ARGV[3]  want    units it would like now (>= cost): a lease.
-- ARGV[4]  reserve (unused: no schedule to reserve)
-- ARGV[5]  hold_us how long a granted unit may be spent.
-- ARGV[6]  horizon_us (unused)
-- ARGV[7]  limit   units per window.
-- ARGV[8]  window_us
--
-- Reply {allowed 0/1, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us,
-- due_ns, spacing_ns, valid_ns}: granted units are due now ('0', '0') and valid for
-- valid_ns;
-- the two durations as decimal strings of ns ("-1" = no retry time), now_us in µs.
--
-- Exactness: counts and instants in µs, all below 2^53 (the bridge bounds the limit and
-- the window; a settle keeps a debt below 2^49 units and its last window within 2^48 µs
-- of its clock, so the windows it spans times the window stay exact too).
--
-- Why atomic: read-compare-increment; two requests seeing count = limit − 1 must not
-- both pass. The TTL is the end of the counted window (an acquire never leaves debt):
-- after it the count means nothing. A count from a later window (the clock went back,
-- e.g. after a failover to a node whose clock is behind) stays current, as in the core.

local key = KEYS[1]
local now = clock_us()
local cost = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local hold = tonumber(ARGV[5])
local limit = tonumber(ARGV[7])
local window = tonumber(ARGV[8])

local start = idiv(now, window) * window
local count, window_start = 0, start
local stored = redis.call('GET', key)
if stored then
  local c, s = string.match(stored, '^(%d+) (%d+)$')
  if c then
    c, s = tonumber(c), tonumber(s)
    if s > start and s - idiv(s, window) * window == 0 then
      -- A state from a later window than now's (the clock went back): nothing but a
      -- peek is admitted until the first window from the key's that has room.
      local retry = '-1'
      if cost > 0 and cost <= limit then
        retry = ns_of_us(s + idiv(c + cost - 1, limit) * window - now)
      end
      local windows = idiv(c + limit - 1, limit)
      if windows < 1 then windows = 1 end
      local allowed = 0
      if cost == 0 then allowed = 1 end
      return {allowed, 0, limit, 0, retry, ns_of_us(s + windows * window - now), now,
        '0', '0', '0'}
    end
    count, window_start = window_current(c, s, start, limit, window)
  end
end

local until_end = ns_of_us(window_start + window - now)

-- The end of the last window `n` units reach into (at least the current one).
local function idle_at(n)
  local windows = idiv(n + limit - 1, limit)
  if windows < 1 then windows = 1 end
  return window_start + windows * window
end

if count + cost > limit then
  local retry = '-1'
  if cost <= limit then
    -- The window that carries little enough: ceil((count + cost − limit) / limit) on.
    retry = ns_of_us(window_start + idiv(count + cost - 1, limit) * window - now)
  end
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  return {0, 0, limit, remaining, retry, ns_of_us(idle_at(count) - now), now, '0', '0', '0'}
end

local granted = limit - count
if granted > want then granted = want end
local after = count + granted
if granted > 0 then
  redis.call('SET', key, int(after) .. ' ' .. int(window_start), 'PXAT',
    expire_at_ms(window_start + window))
end
-- Granted units may be spent until the window ends at most.
local valid = window_start + window - now
if valid > hold then valid = hold end
if granted == 0 then valid = 0 end
return {1, granted, limit, limit - after, '-1', until_end, now, '0', '0', ns_of_us(valid)}
