-- weir shared limit: settle what a request of a key within its parent was counted with
-- what it really cost, atomically.
--
-- Runs after common.lua (clock_us, idiv, int), in one chunk.
--
-- Mirrors weir_protocol::share::ShareLimit::settle: in the window the units were
-- counted in, and only while it lasts, the difference comes off (or is added to) the
-- parent's count and the key's use, and the parent's sum of reserves follows the key's.
--
-- KEYS[1]  the parent's shares (lua/share.lua's hash).
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
-- ARGV[2]  counted_at_us  Redis's clock when the units were counted.
-- ARGV[3]  reserved       units counted then (the estimate).
-- ARGV[4]  actual         what the request really cost.
-- ARGV[5]  window_us
-- ARGV[6]  key id         the key within the parent (decimal), or 0 when it named none.
--
-- Reply {changed 0/1, now_us}.
--
-- Why atomic: read-modify-write of the count and of the key's use and reserve, racing
-- the parent's requests and other settles.

local h = KEYS[1]
local now = clock_us()
local counted = tonumber(ARGV[2])
local reserved = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local window = tonumber(ARGV[5])
local id = ARGV[6]

local counted_in = idiv(counted, window) * window
local w = tonumber(redis.call('HGET', h, 'w') or '')
if w ~= counted_in or idiv(now, window) * window ~= counted_in or reserved == actual then
  return {0, now}
end

local function apply(x)
  if actual < reserved then
    local left = x - (reserved - actual)
    if left < 0 then return 0 end
    return left
  end
  return x + (actual - reserved)
end

local f = redis.call('HMGET', h, 'u', 'r')
local used, reserves = tonumber(f[1]) or 0, tonumber(f[2]) or 0
if id ~= '0' then
  local field = 'k' .. id
  local stored = redis.call('HGET', h, field)
  if stored then
    local ew, ee, eu, ea = string.match(stored, '^(%d+) (%d+) (%d+) (%d+)$')
    if ew then
      ee, eu = tonumber(ee), tonumber(eu)
      local before = ee - eu
      if before < 0 then before = 0 end
      eu = apply(eu)
      local after = ee - eu
      if after < 0 then after = 0 end
      reserves = reserves - before + after
      redis.call('HSET', h, field, ew .. ' ' .. int(ee) .. ' ' .. int(eu) .. ' ' .. ea)
    end
  end
end
redis.call('HSET', h, 'u', int(apply(used)), 'r', int(reserves))
return {1, now}
