-- Takes up to ARGV[2] unsold units out of one stripe of a striped SKU (a stripe is a SKU ledger
-- of its own, hash tag `{s/i}`) for transfer_in.lua to put into another stripe. The units leave
-- total and remaining together and sold is never touched, so `sold + remaining == total` holds
-- and, with confirm.lua's `remaining >= qty`, the stripes of a SKU can never sell more between
-- them than its total: a unit is in one stripe's remaining, or in flight, never in two.
--
-- Exactly once per transfer id: the count taken is recorded in the stripe's transfers hash, and
-- a repeat returns that count and changes nothing, even if remaining moved since, so a caller
-- that lost the answer asks again without taking twice and learns what is in flight. The
-- records never expire: transfers are a handful a second at most, and one forgotten would let
-- a late retry take units a second time. A closed stripe gives nothing (and records 0): its
-- remaining is no longer for sale anywhere.
--
-- KEYS[1] meta hash   KEYS[2] transfers hash (`out:<id>` / `in:<id>` -> units)
-- ARGV[1] transfer id   ARGV[2] most units to take
-- Returns the units taken, as decimal text.

local meta, transfers = KEYS[1], KEYS[2]
local field, most = 'out:' .. ARGV[1], tonumber(ARGV[2])

local function exact(n)
  return string.format('%.0f', n)
end

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'closed', 'transferred_out')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
if sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end

local taken = redis.call('HGET', transfers, field)
if taken then
  return taken
end
local n = 0
if state[4] ~= '1' then
  n = math.min(most, remaining)
end
-- Asserted before the first write (Redis does not roll back): a transfer takes only units
-- still for sale, so sold + remaining == total holds on the smaller total.
if n < 0 or n > remaining then
  return redis.error_reply('SECKILL_CORRUPT a transfer larger than what remains')
end
if n > 0 then
  -- Absent on ledgers that never transferred anything.
  local out = tonumber(state[5] or '0') + n
  redis.call('HSET', meta, 'total', exact(total - n), 'remaining', exact(remaining - n), 'transferred_out', exact(out))
end
redis.call('HSET', transfers, field, exact(n))
return exact(n)
