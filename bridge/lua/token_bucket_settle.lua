-- weir token bucket: settle a cost after the response (`commit`), atomically.
--
-- Runs after common.lua (clock_us, idiv, int, bucket_refilled, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::token_bucket::TokenBucket::settle (through Limit::settle)
-- integer for integer: `reserved` tokens counted at `counted_at_us` really cost `actual`.
-- The bucket is first brought to now (its refills owed); a missing key (it expired, full)
-- is a full bucket whose refills are phased from now, as the acquire script starts one.
-- A refund is given while no refill came since the units were counted (the bucket then
-- holds exactly what the actual cost would have left), capped at the capacity; a missing
-- key has nothing to refund. An excess takes tokens now, and what the bucket lacks is a
-- debt paid exactly by the next refills: the state is stored at the refill that pays its
-- last token, holding what that refill leaves over (tokens the acquire script does not
-- see before that instant). A debt reaching beyond now + 2^48 µs is paid by the refills
-- until then and the rest forgiven, so every instant stays below 2^53.
--
-- KEYS[1]  state key weir:{<tag>}:token_bucket, "<tokens> <last_refill_us>" (absent =
--          a full bucket from now).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
-- ARGV[2]  counted_at_us  Redis's clock when the units were counted.
-- ARGV[3]  reserved
-- ARGV[4]  actual
-- ARGV[5]  capacity
-- ARGV[6]  refill  tokens per period, capped at the capacity by the caller.
-- ARGV[7]  period_us
--
-- Reply {changed 0/1, now_us}.
--
-- Exactness: tokens, debts (at most 1,000,000 + the capacity) and instants in µs are
-- integers below 2^53 (instants below 2^52 µs, the bridge bounds the parameters), so
-- Lua's doubles are exact.
--
-- Why atomic: read, refill, adjust and write must see no acquire in between, or a
-- refund could overwrite the tokens another request just took, and a debt could be
-- charged to a bucket another request has already emptied.

local key = KEYS[1]
local now = clock_us()
local counted_at = tonumber(ARGV[2])
local reserved = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local capacity = tonumber(ARGV[5])
local refill = tonumber(ARGV[6])
local period = tonumber(ARGV[7])

if reserved == actual then return {0, now} end
local tokens, last = nil, nil
local stored = redis.call('GET', key)
if stored then
  local t, l = string.match(stored, '^(%d+) (%d+)$')
  if not t then return {0, now} end
  tokens, last = tonumber(t), tonumber(l)
elseif actual < reserved then
  return {0, now}
else
  tokens, last = capacity, now
end
tokens, last = bucket_refilled(tokens, last, now, capacity, refill, period)

if actual < reserved then
  if last > counted_at then return {0, now} end
  tokens = tokens + (reserved - actual)
  if tokens > capacity then tokens = capacity end
else
  local excess = actual - reserved
  if excess <= tokens then
    tokens = tokens - excess
  else
    local debt = excess - tokens
    local periods = idiv(debt + refill - 1, refill)
    local most = 0
    local horizon = now + 281474976710656
    if horizon > last then most = idiv(horizon - last, period) end
    if periods > most then
      periods, tokens = most, 0
    else
      tokens = periods * refill - debt
    end
    last = last + periods * period
  end
end
local full_at = last + idiv(capacity - tokens + refill - 1, refill) * period
redis.call('SET', key, int(tokens) .. ' ' .. int(last), 'PXAT', expire_at_ms(full_at))
return {1, now}
