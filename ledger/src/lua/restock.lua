-- Raises an existing SKU's total to ARGV[1]: total and remaining grow together, so `sold +
-- remaining == total` still holds. Stating the new total rather than a number of units to add
-- makes a retried restock harmless. A missing ledger is an error, not a fresh start.
--
-- KEYS[1] meta hash   ARGV[1] new total
-- Returns the total after the call (unchanged when ARGV[1] is not above it).

local state = redis.call('HMGET', KEYS[1], 'total', 'sold', 'remaining')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
-- Checked before writing, as every script that moves units: a restock must not grow a ledger
-- whose books no longer balance (it would hide how far off they were).
if not (total and sold and remaining) or sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end
local target = tonumber(ARGV[1])
if target > total then
  -- "%.0f", not the "%.14g" Lua would use: totals go up to 2^53 - 1.
  local added = string.format('%.0f', target - total)
  redis.call('HINCRBY', KEYS[1], 'total', added)
  redis.call('HINCRBY', KEYS[1], 'remaining', added)
  return target
end
return total
