-- GCRA for one key, shared by every node: the limit holds across the fleet, however a user's
-- requests are spread. Time is Redis' own (TIME), never a node's clock, so nodes with skewed
-- clocks still agree.
--
-- KEYS[1] the key's theoretical arrival time (µs)
-- ARGV[1] emission interval µs   ARGV[2] tolerance µs (burst × interval)
-- Returns 0 if admitted, else the µs to wait.

local now = redis.call('TIME')
now = tonumber(now[1]) * 1000000 + tonumber(now[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
local next = tat + interval
if next - now > tolerance then
  return next - now - tolerance
end
-- The key lives only as long as it constrains anything: memory is bounded by active users.
redis.call('SET', KEYS[1], next, 'PX', math.ceil((next - now) / 1000) + 1)
return 0
