-- Puts units that transfer_out.lua took from one stripe of a striped SKU into another: total
-- and remaining grow together, so `sold + remaining == total` holds, and the stripes' totals
-- plus what is in flight stay the SKU's total.
--
-- Exactly once per transfer id, recorded in the stripe's transfers hash (never expiring, as in
-- transfer_out.lua): a caller that lost the answer repeats the call and nothing is added twice.
-- A closed stripe still takes the units, so the counts add up across the stripes; it never
-- sells them.
--
-- KEYS[1] meta hash   KEYS[2] transfers hash (`out:<id>` / `in:<id>` -> units)
-- ARGV[1] transfer id   ARGV[2] units
-- Returns 1 when it added them, 0 for a repeat.

local meta, transfers = KEYS[1], KEYS[2]
local field, units = 'in:' .. ARGV[1], tonumber(ARGV[2])
-- Counts are Lua doubles: past 2^53 - 1 (protocol's TOTAL_MAX) they stop being exact.
local TOTAL_MAX = 9007199254740991

local function exact(n)
  return string.format('%.0f', n)
end

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'transferred_in')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
if sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end

if redis.call('HEXISTS', transfers, field) == 1 then
  return 0
end
if units > TOTAL_MAX - total then
  return redis.error_reply('SECKILL_CORRUPT a transfer would lift the total past TOTAL_MAX')
end
-- Absent on ledgers that never transferred anything.
local transferred = tonumber(state[4] or '0') + units
redis.call('HSET', meta, 'total', exact(total + units), 'remaining', exact(remaining + units),
  'transferred_in', exact(transferred))
redis.call('HSET', transfers, field, exact(units))
return 1
