-- weir sliding window (counter): acquire `cost` to `want` units from one key, atomically.
--
-- Runs after common.lua (clock_us, idiv, ns_of_us, int, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::sliding_window::SlidingWindow::decide and
-- Limit::acquire: estimate = prev × (W − e) / W + curr over epoch-aligned windows of W,
-- compared without rounding.
--
-- KEYS[1]  state key weir:{<tag>}:sliding_window, a string
--          "<prev> <curr> <window_start_us>" (absent = nothing counted).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
--          Key deadlines (PXAT) are absolute instants of this clock, so a pinned
--          clock behind Redis's real one writes keys that are already expired.
-- ARGV[2]  cost    units the request needs (0 = peek).
-- ARGV[3]  want    units it would like now (>= cost): a lease.
-- ARGV[4]  reserve (unused: no schedule to reserve)
-- ARGV[5]  hold_us how long a granted unit may be spent.
-- ARGV[6]  horizon_us (unused)
-- ARGV[7]  limit   units per window (<= 2^32 − 1).
-- ARGV[8]  window_us
--
-- Reply {allowed 0/1, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us,
-- due_ns, spacing_ns, valid_ns}: granted units are due now ('0', '0') and valid for
-- valid_ns;
-- the two durations as decimal strings of ns ("-1" = no retry time), now_us in µs.
--
-- Exactness: the core compares prev × (W − e) with (limit − curr − cost) × W in u128;
-- those products pass 2^53 (a limit of 10^6 per day already does), so they are compared
-- here as base-2^24 limbs (`cmp_mul`), and the quotients the core takes of them
-- (`muldiv_floor`) are a double estimate corrected by exact comparisons.
--
-- Why atomic: read-estimate-increment; concurrent requests must not both pass on the
-- same estimate. The TTL is two windows after the start of the current window: then the
-- estimate is 0 whatever the state says.

-- Exact products of integers in [0, 2^53): six base-2^24 limbs, least significant first.
-- Every partial sum stays below 2^51, so each step is exact in doubles.
local LIMB = 16777216
local function limbs(x)
  local x0 = x % LIMB
  x = (x - x0) / LIMB
  local x1 = x % LIMB
  return x0, x1, (x - x1) / LIMB
end

local function mul(a, b)
  local a0, a1, a2 = limbs(a)
  local b0, b1, b2 = limbs(b)
  local c = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1,
    a2 * b2, 0}
  local carry = 0
  for i = 1, 6 do
    local v = c[i] + carry
    local lo = v % LIMB
    c[i] = lo
    carry = (v - lo) / LIMB
  end
  return c
end

-- The sign of a × b − c × d.
local function cmp_mul(a, b, c, d)
  local x, y = mul(a, b), mul(c, d)
  for i = 6, 1, -1 do
    if x[i] ~= y[i] then
      if x[i] < y[i] then return -1 end
      return 1
    end
  end
  return 0
end

-- floor(a × b / c), for a result below 2^52: the double estimate is off by a few units
-- at most; exact comparisons walk it to the floor.
local function muldiv_floor(a, b, c)
  local q = math.floor(a * b / c)
  if q < 0 then q = 0 end
  while q > 0 and cmp_mul(q, c, a, b) > 0 do q = q - 1 end
  while cmp_mul(q + 1, c, a, b) <= 0 do q = q + 1 end
  return q
end

local key = KEYS[1]
local now = clock_us()
local cost = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local hold = tonumber(ARGV[5])
local limit = tonumber(ARGV[7])
local w = tonumber(ARGV[8])

local aligned = idiv(now, w) * w
local prev, curr, start = 0, 0, aligned
local stored = redis.call('GET', key)
if stored then
  local p, c, s = string.match(stored, '^(%d+) (%d+) (%d+)$')
  if p then
    p, c, s = tonumber(p), tonumber(c), tonumber(s)
    if s > aligned and s - idiv(s, w) * w == 0 then
      -- A state from a later window than now's (the clock went back): nothing but a
      -- peek is admitted until that window starts.
      local retry = '-1'
      if cost > 0 and cost <= limit then retry = ns_of_us(s - now) end
      local reset_at = now
      if c > 0 then reset_at = s + 2 * w elseif p > 0 then reset_at = s + w end
      local allowed = 0
      if cost == 0 then allowed = 1 end
      return {allowed, 0, limit, 0, retry, ns_of_us(reset_at - now), now, '0', '0', '0'}
    elseif s == aligned then
      prev, curr, start = p, c, s
    elseif s + w == aligned then
      prev, curr, start = c, 0, aligned
    end
  end
end
local elapsed = 0
if now > start then elapsed = now - start end

-- ceil(prev × (W − e) / W): what the previous window still weighs, in whole units. For
-- integer k, prev × (W − e) <= k × W exactly when weight <= k.
local weight = 0
if prev > 0 and elapsed < w then
  weight = muldiv_floor(prev, w - elapsed, w)
  if cmp_mul(weight, w, prev, w - elapsed) < 0 then weight = weight + 1 end
end

local function reset_ns(curr_after)
  local at = now
  if curr_after > 0 then at = start + 2 * w elseif prev > 0 then at = start + w end
  return ns_of_us(at - now)
end

if curr + cost + weight > limit then
  local retry = '-1'
  if cost <= limit then
    local at
    if curr + cost <= limit then
      -- The previous window blocks: wait until prev × (W − e) <= slack × W.
      local slack = limit - curr - cost
      local fade = w
      if prev > 0 and slack < prev then fade = muldiv_floor(slack, w, prev) end
      at = start + w - fade
    else
      -- This window is full: in the next one its count fades instead.
      local fade = w
      if curr > 0 and limit - cost < curr then fade = muldiv_floor(limit - cost, w, curr) end
      at = start + 2 * w - fade
    end
    retry = ns_of_us(at - now)
  end
  local remaining = limit - curr - weight
  if remaining < 0 then remaining = 0 end
  return {0, 0, limit, remaining, retry, reset_ns(curr), now, '0', '0', '0'}
end

local granted = limit - curr - weight
if granted > want then granted = want end
local after = curr + granted
if granted > 0 then
  redis.call('SET', key, int(prev) .. ' ' .. int(after) .. ' ' .. int(start), 'PXAT',
    expire_at_ms(start + 2 * w))
end
-- Granted units may be spent until the window ends at most.
local valid = start + w - now
if valid > hold then valid = hold end
if granted == 0 then valid = 0 end
return {1, granted, limit, limit - after - weight, '-1', reset_ns(after), now, '0', '0',
  ns_of_us(valid)}
