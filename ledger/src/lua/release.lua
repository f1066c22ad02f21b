-- Gives one unpaid order's units back to the SKU: remaining goes up, the buyer's count goes
-- down, and the release is logged, all in one atomic step, so the units can be sold again.
--
-- Two guards, each enough on its own to refuse a double release:
-- 1. the ledger's own record of the sale: the idempotency record of the order's key must say
--    this user bought this qty as this order id, or nothing is released ('never_sold');
-- 2. a release marker per order id: a second release of the same order finds it ('already').
-- Neither depends on the caller holding a lock.
--
-- KEYS[1] meta hash   KEYS[2] bought-by-user hash   KEYS[3] idempotency record of the order's key
-- KEYS[4] release marker of the order   KEYS[5] release log stream
-- ARGV[1] order id   ARGV[2] user   ARGV[3] qty   ARGV[4] marker ttl in seconds (the idempotency
-- ttl: once the record is gone guard 1 refuses anyway, so the marker need not outlive it)
--
-- Returns {outcome, remaining, released}; outcome is released|already|never_sold.

local meta, bought_by_user, record, marker, log = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local order_id, user, qty, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

local function exact(n)
  return string.format('%.0f', n)
end
local SEP = '\30'
local FP_SEP = '\31'

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

if redis.call('EXISTS', marker) == 1 then
  return {'already', exact(remaining), exact(released)}
end
local stored = redis.call('GET', record)
local sale = user .. FP_SEP .. exact(qty) .. SEP .. 'purchased' .. SEP .. order_id .. SEP
-- The stored decision is fingerprint, 'purchased', order id, node, qty; the node is not the
-- caller's to know, so the prefix up to it and the qty at the end are what must match.
if not stored or string.sub(stored, 1, #sale) ~= sale or string.sub(stored, -#(SEP .. exact(qty))) ~= SEP .. exact(qty) then
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
redis.call('SET', marker, exact(qty), 'EX', ttl)
-- Numbered like the order stream, so a reader resumes from the last release it saw.
redis.call('XADD', log, '0-' .. exact(release_seq), 'order_id', order_id, 'user', user, 'qty', exact(qty))
return {'released', exact(remaining), exact(released)}
