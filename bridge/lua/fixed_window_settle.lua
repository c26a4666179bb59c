-- weir fixed window: settle a cost after the response (`commit`), atomically.
--
-- Runs after common.lua (clock_us, idiv, int, expire_at_ms), in one chunk.
--
-- Mirrors weir_core::algorithms::fixed_window::FixedWindow::settle: `reserved` units
-- counted at `counted_at_us` really cost `actual`. A refund is given while the key's
-- counted window is the one the units were counted in (the count is then exactly what
-- the actual cost would have made it); an excess is added to now's window (or to a later
-- one the key already counts in), beyond the limit if need be.
--
-- KEYS[1]  state key weir:{<tag>}:fixed_window, "<count> <window_start_us>" (as the
--          acquire script writes it; absent = nothing to settle).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
-- ARGV[2]  counted_at_us  Redis's clock when the units were counted.
-- ARGV[3]  reserved
-- ARGV[4]  actual
-- ARGV[5]  limit   units per window (unused: a settle never decides).
-- ARGV[6]  window_us
--
-- Reply {changed 0/1, now_us}.
--
-- Why atomic: read-modify-write of the count; a request acquiring in between must see
-- the count before or after the refund, never lose its own increment.

local key = KEYS[1]
local now = clock_us()
local counted_at = tonumber(ARGV[2])
local reserved = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local window = tonumber(ARGV[6])

if reserved == actual then return {0, now} end
local stored = redis.call('GET', key)
if not stored then return {0, now} end
local count, start = string.match(stored, '^(%d+) (%d+)$')
if not count then return {0, now} end
count, start = tonumber(count), tonumber(start)

if actual < reserved then
  if start ~= idiv(counted_at, window) * window then return {0, now} end
  count = count - (reserved - actual)
  if count < 0 then count = 0 end
else
  local excess = actual - reserved
  local now_start = idiv(now, window) * window
  local later = start > now_start and start - idiv(start, window) * window == 0
  if start == now_start or later then
    count = count + excess
  else
    count, start = excess, now_start
  end
end
redis.call('SET', key, int(count) .. ' ' .. int(start), 'PXAT', expire_at_ms(start + window))
return {1, now}
