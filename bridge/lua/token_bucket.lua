-- weir token bucket: acquire `cost` to `want` tokens from one key, atomically.
--
-- Runs after common.lua (clock_us, idiv, ns_of_us, int, bucket_refilled, expire_at_ms), in one
-- chunk.
--
-- Mirrors weir_core::algorithms::token_bucket::TokenBucket::decide and Limit::acquire
-- integer for integer (discrete refills of `refill` tokens at last_refill + k × period).
--
-- KEYS[1]  state key weir:{<tag>}:token_bucket, a string "<tokens> <last_refill_us>"
--          (absent = a full bucket whose refills are phased from now).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
--          Key deadlines (PXAT) are absolute instants of this clock, so a pinned
--          clock behind Redis's real one writes keys that are already expired.
-- ARGV[2]  cost    units the request needs (0 = peek).
-- ARGV[3]  want    units it would like now (>= cost): a lease.
-- ARGV[4]  reserve (unused: no schedule to reserve)
-- ARGV[5]  hold_us how long a granted unit may be spent.
-- ARGV[6]  horizon_us (unused)
-- ARGV[7]  capacity
-- ARGV[8]  refill  tokens per period, already capped at the capacity by the caller (a
--                  refill above the capacity only fills the bucket, so this is exact).
-- ARGV[9]  period_us
--
-- Reply {allowed 0/1, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us,
-- due_ns, spacing_ns, valid_ns}: granted units are due now ('0', '0') and valid for
-- valid_ns;
-- counts in tokens, the two durations as decimal strings of ns ("-1" = no retry time),
-- now_us in µs since the Unix epoch.
--
-- Units and exactness: every value is an integer below 2^53 (instants in µs, the
-- bridge rejects parameters whose products could pass it), so Lua's doubles are exact;
-- ns are only ever printed, never computed, as "<µs>000".
--
-- Why atomic: read, refill, compare and write must see no other request in between, or
-- two requests that both see the last token would both take it. The TTL is the instant
-- the bucket is full again: from then on the key decides like a fresh one (only the
-- phase of the next refill differs, as in the core's slot takeover).

local key = KEYS[1]
local now = clock_us()
local cost = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local hold = tonumber(ARGV[5])
local capacity = tonumber(ARGV[7])
local refill = tonumber(ARGV[8])
local period = tonumber(ARGV[9])

local tokens, last = capacity, now
local stored = redis.call('GET', key)
if stored then
  local t, l = string.match(stored, '^(%d+) (%d+)$')
  if t then tokens, last = tonumber(t), tonumber(l) end
end
tokens, last = bucket_refilled(tokens, last, now, capacity, refill, period)
-- A last refill ahead of now (a debt paying off) holds its tokens from then on only.
local available = tokens
if now < last then available = 0 end

-- The first refill instant at which `have` tokens have become `need`.
local function refilled_at(have, need)
  if need <= have then return last end
  return last + idiv(need - have + refill - 1, refill) * period
end

local function until_ns(at)
  return ns_of_us(at - now)
end

if cost > available then
  local retry = '-1'
  if cost <= capacity then retry = until_ns(refilled_at(tokens, cost)) end
  return {0, 0, capacity, available, retry, until_ns(refilled_at(tokens, capacity)), now,
    '0', '0', '0'}
end

local granted = want
if granted > available then granted = available end
local after = tokens - granted
local full_at = refilled_at(after, capacity)
if granted > 0 then
  redis.call('SET', key, int(after) .. ' ' .. int(last), 'PXAT', expire_at_ms(full_at))
end
-- Granted units may be spent until the next refill at most: spent in the next refill
-- period, a unit counted in this one would let both periods' refills be spent together.
local valid = last + period - now
if valid > hold then valid = hold end
if granted == 0 then valid = 0 end
-- Units granted only while the bucket's tokens are available: then available = tokens.
return {1, granted, capacity, available - granted, '-1', until_ns(full_at), now, '0', '0',
  ns_of_us(valid)}
