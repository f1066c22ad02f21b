-- Gives one unpaid order's units back to the SKU: remaining goes up, the buyer's count goes
-- down, and the release is logged, all in one atomic step, so the units can be sold again.
--
-- The guard: the ledger's own record of the sale, written by confirm.lua in the sales hash of
-- the seller's window, field = order id. It must say this user bought this qty, or nothing is
-- released ('never_sold'); a release marks it released (a leading RELEASED), so a second
-- release of the same order finds that ('already'). It does not depend on the caller holding a lock, nor on the
-- idempotency record, which may expire long before an unpaid order does.
--
-- KEYS[1] meta hash   KEYS[2] bought-by-user hash   KEYS[3..5] the sales hashes of the window of
-- the sale's time and its two neighbours (the seller's clock picked the window)
-- KEYS[6] release log stream
-- ARGV[1] order id   ARGV[2] user   ARGV[3] qty
--
-- Returns {outcome, remaining, released}; outcome is released|already|never_sold.

local meta, bought_by_user, log = KEYS[1], KEYS[2], KEYS[6]
local order_id, user, qty = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function exact(n)
  return string.format('%.0f', n)
end
local FP_SEP = '\31'
local RELEASED = '-'

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'released', 'release_seq')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
-- Absent on ledgers that never released anything.
local released = tonumber(state[4] or '0')
if sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end

local sales, record = nil, nil
for at = 3, 5 do
  record = redis.call('HGET', KEYS[at], order_id)
  if record then
    sales = KEYS[at]
    break
  end
end
local sale = user .. FP_SEP .. exact(qty)
if record == RELEASED .. sale then
  return {'already', exact(remaining), exact(released)}
end
if record ~= sale then
  return {'never_sold', exact(remaining), exact(released)}
end
if sold < qty then
  return redis.error_reply('SECKILL_CORRUPT a release larger than what is sold')
end

sold = sold - qty
remaining = remaining + qty
released = released + qty
local release_seq = tonumber(state[5] or '0') + 1
redis.call('HSET', meta, 'sold', exact(sold), 'remaining', exact(remaining), 'released', exact(released),
  'release_seq', exact(release_seq))
if redis.call('HINCRBY', bought_by_user, user, -qty) <= 0 then
  redis.call('HDEL', bought_by_user, user)
end
redis.call('HSET', sales, order_id, RELEASED .. sale)
-- Numbered like the order stream, so a reader resumes from the last release it saw.
redis.call('XADD', log, '0-' .. exact(release_seq), 'order_id', order_id, 'user', user, 'qty', exact(qty))
return {'released', exact(remaining), exact(released)}
