-- weir fixed window: settle a cost after the response (`commit`), atomically.
--
-- Runs after common.lua (clock_us, idiv, int, window_current, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::fixed_window::FixedWindow::settle (through
-- Limit::settle): `reserved` units counted at `counted_at_us` really cost `actual`. A
-- refund is given while the key's counted window is the one the units were counted in
-- (the count is then exactly what the actual cost would have made it); a missing key (it
-- expired: its window, and any debt, is over) has nothing to refund. An excess is added
-- to now's window (or to a later one the key already counts in), with the debt an
-- earlier window carries into it (`limit` less per window since), beyond the limit if
-- need be: what the window cannot hold is a debt the next windows carry, which the
-- acquire script reads the same way. The count is kept at most 2^49 and within the
-- windows that end by now + 2^48 µs; the rest is forgiven.
--
-- KEYS[1]  state key weir:{<tag>}:fixed_window, "<count> <window_start_us>" (as the
--          acquire script writes it; absent = nothing counted, no debt).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
-- ARGV[2]  counted_at_us  Redis's clock when the units were counted.
-- ARGV[3]  reserved
-- ARGV[4]  actual
-- ARGV[5]  limit   units per window: what each window repays of a debt.
-- ARGV[6]  window_us
--
-- Reply {changed 0/1, now_us}.
--
-- Exactness: counts below 2^50 and instants in µs below 2^53, so Lua's doubles are
-- exact; windows × limit is formed only when it is below the count.
--
-- Why atomic: read-modify-write of the count; a request acquiring in between must see
-- the count before or after the settle, never lose its own increment.

local key = KEYS[1]
local now = clock_us()
local counted_at = tonumber(ARGV[2])
local reserved = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local window = tonumber(ARGV[6])

if reserved == actual then return {0, now} end
local now_start = idiv(now, window) * window
local count, start = 0, now_start
local stored = redis.call('GET', key)
if stored then
  local c, s = string.match(stored, '^(%d+) (%d+)$')
  if not c then return {0, now} end
  count, start = tonumber(c), tonumber(s)
elseif actual < reserved then
  return {0, now}
end

if actual < reserved then
  if start ~= idiv(counted_at, window) * window then return {0, now} end
  count = count - (reserved - actual)
  if count < 0 then count = 0 end
else
  count, start = window_current(count, start, now_start, limit, window)
  count = count + (actual - reserved)
  if count > 562949953421312 then count = 562949953421312 end
  -- At most `limit` in each window that ends by now + 2^48 µs.
  local windows = 0
  local horizon = now + 281474976710656
  if horizon > start then windows = idiv(horizon - start, window) end
  if idiv(count + limit - 1, limit) > windows then count = windows * limit end
end
local windows = idiv(count + limit - 1, limit)
if windows < 1 then windows = 1 end
redis.call('SET', key, int(count) .. ' ' .. int(start), 'PXAT',
  expire_at_ms(start + windows * window))
return {1, now}
