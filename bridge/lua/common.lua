-- Helpers shared by every weir script. The bridge sends each script as this prelude
-- followed by the algorithm's own file (one chunk, so these locals are in scope); the
-- scripts are never run without it.
--
-- ARGV[1] of every script is the now_us override: 0 = Redis TIME (production); > 0 pins
-- the clock (tests).

local function clock_us()
  local pinned = tonumber(ARGV[1])
  if pinned and pinned > 0 then return pinned end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for integers a >= 0, b > 0, a + b < 2^53: the double quotient may round
-- up across an integer; the remainder puts it back.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then return q - 1 elseif r >= b then return q + 1 end
  return q
end

local function ns_of_us(us)
  if us <= 0 then return '0' end
  return string.format('%.0f', us) .. '000'
end

local function int(x) return string.format('%.0f', x) end

-- A token bucket brought to `now`: the refills owed since `last` (none if the clock went
-- back, or while a debt keeps the next refill in the future), never above the capacity.
-- Returns the tokens and the instant of the last refill.
local function bucket_refilled(tokens, last, now, capacity, refill, period)
  if tokens > capacity then tokens = capacity end
  local periods = 0
  if now > last then periods = idiv(now - last, period) end
  if periods > 0 and tokens < capacity then
    local needed = idiv(capacity - tokens + refill - 1, refill)
    if periods >= needed then
      tokens = capacity
    else
      tokens = tokens + periods * refill
    end
  end
  return tokens, last + periods * period
end

-- A fixed window's count read in the window starting at `now_start`: the count of that
-- window, or of a later aligned one (the clock went back), as stored; an earlier aligned
-- window's debt, `limit` repaid per window since (k × limit is formed only below the
-- count, so it stays exact); 0 for a misaligned start. Returns the count and the start of
-- the window it counts in.
local function window_current(count, start, now_start, limit, window)
  local aligned = start - idiv(start, window) * window == 0
  if start == now_start or (start > now_start and aligned) then return count, start end
  if start < now_start and aligned then
    local k = idiv(now_start - start, window)
    if k < idiv(count + limit - 1, limit) then return count - k * limit, now_start end
  end
  return 0, now_start
end

-- The key's deadline (ms since the epoch, for PXAT/PEXPIREAT) when its state stops
-- carrying information at idle_at_us: Redis keeps a key while its ms clock reads at most
-- the deadline, so rounding up keeps it for every instant before idle_at_us.
local function expire_at_ms(idle_at_us)
  return idiv(idle_at_us + 999, 1000)
end
