-- weir token bucket: settle a cost after the response (`commit`), atomically.
--
-- Runs after common.lua (clock_us, idiv, int, bucket_refilled, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::token_bucket::TokenBucket::settle integer for integer:
-- `reserved` tokens counted at `counted_at_us` really cost `actual`. The bucket is first
-- brought to now (its refills owed). A refund is given while no refill came since the
-- units were counted (the bucket then holds exactly what the actual cost would have left),
-- capped at the capacity; an excess takes tokens now, and what the bucket lacks is a debt
-- that pushes the next refills back by as many periods as it takes (rounded up).
--
-- KEYS[1]  state key weir:{<tag>}:token_bucket, "<tokens> <last_refill_us>" (absent =
--          nothing to settle).
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
-- Why atomic: read, refill, adjust and write must see no acquire in between, or a
-- refund could overwrite the tokens another request just took.

local key = KEYS[1]
local now = clock_us()
local counted_at = tonumber(ARGV[2])
local reserved = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local capacity = tonumber(ARGV[5])
local refill = tonumber(ARGV[6])
local period = tonumber(ARGV[7])

if reserved == actual then return {0, now} end
local stored = redis.call('GET', key)
if not stored then return {0, now} end
local tokens, last = string.match(stored, '^(%d+) (%d+)$')
if not tokens then return {0, now} end
tokens, last = tonumber(tokens), tonumber(last)
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
    last = last + idiv(debt + refill - 1, refill) * period
    tokens = 0
  end
end
local full_at = last + idiv(capacity - tokens + refill - 1, refill) * period
redis.call('SET', key, int(tokens) .. ' ' .. int(last), 'PXAT', expire_at_ms(full_at))
return {1, now}
