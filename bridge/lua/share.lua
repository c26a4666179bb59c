-- weir shared limit: decide one request of a key within its parent, atomically.
--
-- Runs after common.lua (clock_us, idiv, ns_of_us, int, expire_at_ms), in one chunk.
--
-- Mirrors weir_protocol::share::ShareLimit::decide: the parent is admitted at most
-- `limit` units per window (epoch-aligned); when a window starts, the keys that asked in
-- the one just ended are entitled to parts of it by weighted max-min fairness over what
-- they asked (water-filling); a request is admitted when the units counted, its cost and
-- what every key still has of its entitlement fit the limit.
--
-- KEYS[1]  the parent's shares, a hash weir:{<tag>}:<algorithm>:share (absent = none):
--            w      start of the window counted, µs
--            u      units admitted in it, every key together
--            r      what every key still has of its entitlement, added up
--            s      every tracked key's weight, added up
--            n      keys tracked
--            k<id>  "<weight> <entitled> <used> <asked>" for each tracked key
-- ARGV[1]  now_us override: 0 = Redis TIME (production); > 0 pins the clock (tests).
-- ARGV[2]  cost       units the request needs (>= 1).
-- ARGV[3]  limit      units per window, every key together (<= 2^32 - 1).
-- ARGV[4]  window_us
-- ARGV[5]  max_keys   keys tracked per window (<= 1024).
-- ARGV[6]  weight     the key's weight (1 to 1000).
-- ARGV[7]  key id     the key within the parent (decimal, not 0), or 0 when the request
--                     names none: it is entitled to nothing.
-- ARGV[8]  want       units to take now (>= cost, a lease): beyond the cost, only what
--                     is left of the key's own entitlement, spendable to the window's end
--                     (a unit dropped before it would be the key's loss).
--
-- Reply as every acquire script's {allowed 0/1, granted, limit, remaining,
-- retry_after_ns, reset_after_ns, now_us, due_ns, spacing_ns, valid_ns}: granted is the
-- cost and a lease's units when allowed, limit the key's share ⌊limit × w / Σ w⌋ among
-- the keys tracked (itself included), remaining the most it may be admitted now.
--
-- Exactness: demands are kept at most `limit` (< 2^32), weights at most 1000 and keys at
-- most 1024, so every product below (a demand times the weights left, what is left times
-- a weight) stays below 2^52.
--
-- Why atomic: the reserve check reads every key's entitlement and the parent's count; two
-- requests seeing room for one must not both pass. The hash expires two windows after
-- the one it counts: then no key in it is active any more.

local h = KEYS[1]
local now = clock_us()
local cost = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local max_keys = tonumber(ARGV[5])
local weight = tonumber(ARGV[6])
local id = ARGV[7]
local want = tonumber(ARGV[8])

local start = idiv(now, window) * window
local w = tonumber(redis.call('HGET', h, 'w') or '')
local aligned = w ~= nil and w - idiv(w, window) * window == 0

if aligned and w > start then
  -- Counted in a later window (the clock went back): nothing until then, as a fixed
  -- window's unit admitted now would count in a window it did not happen in.
  local wait = ns_of_us(w - now)
  return {0, 0, 0, 0, wait, wait, now, '0', '0', '0'}
end

local function parse(entry)
  local ew, ee, eu, ea = string.match(entry, '^(%d+) (%d+) (%d+) (%d+)$')
  if not ew then return nil end
  return {w = tonumber(ew), e = tonumber(ee), u = tonumber(eu), a = tonumber(ea)}
end

local function reserve(k) local left = k.e - k.u if left < 0 then return 0 end return left end

local used, reserved, weights, tracked = 0, 0, 0, 0
if w == start then
  local f = redis.call('HMGET', h, 'u', 'r', 's', 'n')
  used, reserved = tonumber(f[1]) or 0, tonumber(f[2]) or 0
  weights, tracked = tonumber(f[3]) or 0, tonumber(f[4]) or 0
elseif aligned and w + window == start then
  -- The next window: the keys that asked are entitled by water-filling over what they
  -- asked, in order of demand per weight.
  local all = redis.call('HGETALL', h)
  local keys = {}
  for i = 1, #all, 2 do
    local field = all[i]
    if string.sub(field, 1, 1) == 'k' then
      local k = parse(all[i + 1])
      if k and k.a > 0 and #keys < max_keys then
        k.id = field
        if k.w < 1 then k.w = 1 elseif k.w > 1000 then k.w = 1000 end
        keys[#keys + 1] = k
      end
    end
  end
  local order = {}
  local left, weight_left = limit, 0
  for i, k in ipairs(keys) do order[i] = k weight_left = weight_left + k.w end
  table.sort(order, function(x, y) return x.a * y.w < y.a * x.w end)
  local filling = false
  for _, k in ipairs(order) do
    if filling or k.a * weight_left > left * k.w then
      filling = true
      k.e = idiv(left * k.w, weight_left)
    else
      k.e = k.a
      left = left - k.a
      weight_left = weight_left - k.w
    end
  end
  redis.call('DEL', h)
  for _, k in ipairs(keys) do
    redis.call('HSET', h, k.id, int(k.w) .. ' ' .. int(k.e) .. ' 0 0')
    reserved = reserved + k.e
    weights = weights + k.w
  end
  tracked = #keys
else
  -- Nothing counted, or a window two or more ago (or of another length): afresh.
  redis.call('DEL', h)
end

local field = nil
local entry = nil
if id ~= '0' then
  field = 'k' .. id
  local stored = redis.call('HGET', h, field)
  if stored then entry = parse(stored) end
  if entry then
    weights = weights - entry.w + weight
  elseif tracked < max_keys then
    entry = {w = weight, e = 0, u = 0, a = 0}
    tracked = tracked + 1
    weights = weights + weight
  else
    field = nil
  end
end

local reserve_before, reserve_after = 0, 0
if entry then
  reserve_before = reserve(entry)
  reserve_after = entry.e - (entry.u + cost)
  if reserve_after < 0 then reserve_after = 0 end
end
local others = reserved - reserve_before
local allowed = 0
if used + cost + others + reserve_after <= limit then allowed = 1 end

-- Beyond its cost, a lease takes only what is left of the key's entitlement.
local extra, granted = 0, 0
if allowed == 1 then
  extra = want - cost
  if extra > reserve_after then extra = reserve_after end
  granted = cost + extra
end
local reserve_now = reserve_before
if entry then
  entry.w = weight
  entry.a = entry.a + cost + extra
  if entry.a > limit then entry.a = limit end
  if allowed == 1 then
    entry.u = entry.u + granted
    reserve_now = reserve_after - extra
  end
  redis.call('HSET', h, field, int(entry.w) .. ' ' .. int(entry.e) .. ' ' .. int(entry.u) .. ' ' .. int(entry.a))
end
used = used + granted
reserved = others + reserve_now
redis.call('HSET', h, 'w', int(start), 'u', int(used), 'r', int(reserved), 's', int(weights),
  'n', int(tracked))
redis.call('PEXPIREAT', h, expire_at_ms(start + 2 * window))

local total = weights
if not entry then total = total + weight end
local share = 0
if total > 0 then share = idiv(limit * weight, total) end
local free = limit - used - others
if free < 0 then free = 0 end
local reset = ns_of_us(start + window - now)
local retry = '-1'
if allowed == 0 and cost <= limit then retry = reset end
local valid = 0
if extra > 0 then valid = start + window - now end
return {allowed, granted, share, free, retry, reset, now, '0', '0', ns_of_us(valid)}
