-- weir GCRA: acquire `cost` to `want` units from one key, atomically; redis-cell's
-- CL.THROTTLE arithmetic, in nanoseconds.
--
-- Runs after common.lua (clock_us, idiv, ns_of_us, int, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::gcra::Gcra::decide and Limit::acquire integer for
-- integer. The emission interval T and the tolerance tau = T × (burst + 1) come from the
-- caller, computed once by the core (T = trunc(period_ns / rate) in doubles, exactly as
-- redis-cell), so the script has a single source for them.
--
-- KEYS[1]  state key weir:{<tag>}:gcra, a string "<tat_us> <tat_ns_rem>": the TAT in
--          ns since the Unix epoch is tat_us × 1000 + tat_ns_rem (0..999). ns since the
--          epoch (~1.7e18) do not fit a double exactly; µs do, so the TAT is kept split.
--          Absent = an idle key (TAT in the past). With ARGV[10] = 1, "<tat_us>
--          <tat_ns_rem> <T_ns>": the emission interval the TAT was counted in too.
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
--          Key deadlines (PXAT) are absolute instants of this clock, so a pinned
--          clock behind Redis's real one writes keys that are already expired.
-- ARGV[2]  cost    units the request needs (0 = peek).
-- ARGV[3]  want    units it would like now (>= cost): a lease.
-- ARGV[4]  reserve units to reserve from the schedule when cost does not fit now (0: none).
-- ARGV[5]  hold_us how long a unit may be spent after it is due (the caller paid for it
--                  with burst: the limit here is already reduced).
-- ARGV[6]  horizon_us  how far ahead reserved units may be due.
-- ARGV[7]  limit   burst + 1.
-- ARGV[8]  T       emission interval, ns (>= 1000, <= 2^52).
-- ARGV[9]  tau     tolerance, ns (<= 2^52).
-- ARGV[10] keep_t  1: the rule's rate comes with each request. The key keeps the T it
--                  is counted in, and a TAT counted in another T is read in this one:
--                  what the key owes, (TAT − now) / T_old units, each T long, rounded up
--                  to the ns (Gcra::tat_in_own_interval). Absent: the TAT as it is.
--
-- Reply {allowed 0/1, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us,
-- due_ns, spacing_ns, valid_ns}: the durations as decimal strings of ns ("-1" = no
-- retry time), now_us in µs. Granted units are due at due_ns + i × spacing_ns from now
-- and may be spent for valid_ns after that. A reservation (cost does not fit, reserve
-- > 0) answers allowed 0 with the units of the schedule due within the horizon: the
-- i-th (from 1) is due when a central limiter would first admit it, base + i × T − tau.
--
-- Exactness: the script works relative to now. base = max(TAT, now) − now is below
-- tau + clock skew, every sum compared is below 2^53 (the horizon is at most 10 s, tau at
-- most 2^52 ns), and the TAT is written back as whole µs plus a ns remainder. due_ns may
-- be negative (units already due), printed as a signed integer.
--
-- Why atomic: two requests reading the same TAT would both be admitted against it. The
-- TTL is the TAT (rounded up to the µs): from then on the key decides like a fresh one.

local key = KEYS[1]
local now = clock_us()
local cost = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local reserve = tonumber(ARGV[4])
local hold = tonumber(ARGV[5])
local horizon = tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
local t = tonumber(ARGV[8])
local tau = tonumber(ARGV[9])
local keep_t = tonumber(ARGV[10]) == 1
local t_us = idiv(t, 1000)

-- ceil(a × b / d) for integers 0 <= a < d <= 2^53 and 0 <= b < 2^53, exactly: a × b may
-- pass 2^53, so it is built bit by bit from b's top, its remainder by d kept below d
-- (each step compares before it adds, so no sum passes 2^53).
local function mul_div_ceil(a, b, d)
  local bits = {}
  while b > 0 do
    local half = math.floor(b / 2)
    bits[#bits + 1] = b - 2 * half
    b = half
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2
    if r >= d - r then r = r - (d - r); q = q + 1 else r = r + r end
    if bits[i] == 1 then
      if r >= d - a then r = r - (d - a); q = q + 1 else r = r + a end
    end
  end
  if r > 0 then q = q + 1 end
  return q
end

-- base = max(TAT, now) − now, in ns.
local base = 0
local stored = redis.call('GET', key)
if stored then
  local us, rem, t_old = string.match(stored, '^(%d+) (%d+) (%d+)$')
  if not us then us, rem = string.match(stored, '^(%d+) (%d+)$') end
  if us then
    us, rem = tonumber(us), tonumber(rem)
    if us >= now then base = (us - now) * 1000 + rem end
    t_old = tonumber(t_old)
    -- Counted in another T: what the key owes, in units of T_old, each T long.
    if base > 0 and t_old and t_old > 0 and t_old ~= t then
      local units = idiv(base, t_old)
      base = units * t + mul_div_ceil(base - units * t_old, t, t_old)
    end
  end
end

-- redis-cell's remaining: (tau − ttl) and T both truncated to µs, then divided; at most
-- the limit. A TAT behind now (only seen when refusing an oversized cost) reads as base
-- 0, which gives the same clamped value.
local function remaining_for(ttl)
  local slack = tau - ttl
  if slack <= 0 then return 0 end
  local r = idiv(idiv(slack, 1000), t_us)
  if r > limit then r = limit end
  return r
end

local function write_tat(ttl)
  local tat_us = now + idiv(ttl, 1000)
  local rem = ttl - idiv(ttl, 1000) * 1000
  local idle_at = tat_us
  if rem > 0 then idle_at = tat_us + 1 end
  local value = int(tat_us) .. ' ' .. int(rem)
  if keep_t then value = value .. ' ' .. int(t) end
  redis.call('SET', key, value, 'PXAT', expire_at_ms(idle_at))
end

if cost * t > tau - base then
  if cost * t > tau then
    return {0, 0, limit, remaining_for(base), '-1', int(base), now, '0', '0', '0'}
  end
  local retry = int(base + cost * t - tau)
  -- Reserve the next slots: as many as are due within the horizon, at most `reserve`.
  local units = 0
  if reserve > 0 and horizon > 0 then
    units = idiv(horizon * 1000 + tau - base, t)
    if units > reserve then units = reserve end
  end
  if units < 1 then
    return {0, 0, limit, remaining_for(base), retry, int(base), now, '0', '0', '0'}
  end
  local ttl = base + units * t
  write_tat(ttl)
  return {0, units, limit, remaining_for(base), retry, int(base), now,
    int(base + t - tau), int(t), ns_of_us(hold)}
end

-- The largest g with base + g × T <= tau, within cost..want and the limit.
local granted = idiv(tau - base, t)
if granted > want then granted = want end
if granted > limit then granted = limit end
local ttl = base + granted * t
if granted > 0 then write_tat(ttl) end
local valid = hold
if granted == 0 then valid = 0 end
return {1, granted, limit, remaining_for(ttl), '-1', int(ttl), now, '0', '0', ns_of_us(valid)}
