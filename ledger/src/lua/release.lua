-- Gives one unpaid order's units back to the SKU: remaining goes up, the buyer's count goes
-- down, and the release is logged, all in one atomic step, so the units can be sold again.
--
-- The guard: the ledger's own record of the sale. It must say this user bought this qty under
-- this order id, or nothing is released ('never_sold'); a release leaves a mark, so a second
-- release of the same order finds it ('already'). It does not depend on the caller holding a
-- lock. The record is found in one of two places:
-- - the idempotency record of the sale's key (confirm.lua; under the key, or under `user US
--   key` for a buyer who was not the key's first): in the SKU's window hash of the
--   sale's time (its `at`, read from the same Redis clock that filed the record, so exactly one
--   window), which a window holding a sale keeps for the sale record TTL even after the
--   idempotency TTL made the record invisible to lookups (or under `GS <order id>` in that
--   hash, where confirm.lua moves it if its key is decided afresh in the same window); the
--   mark is the field `RS <order id>` in the same hash (RS and GS, control characters, are in
--   no idempotency key);
-- - for sales confirmed by the script before those records (a rolling upgrade), the sales hash
--   of the seller's window, field = order id, marked by a leading RELEASED.
--
-- KEYS[1] meta hash   KEYS[2] bought-by-user hash   KEYS[3..5] the older sales hashes of the
-- window of the sale's time and its two neighbours (the seller's clock picked the window)
-- KEYS[6] release log stream
-- ARGV[1] order id   ARGV[2] user   ARGV[3] qty   ARGV[4] the sale's idempotency key
-- ARGV[5] the sale's time, Unix ms, as its order event has it
--
-- Returns {outcome, remaining, released}; outcome is released|already|never_sold.

local meta, bought_by_user, log = KEYS[1], KEYS[2], KEYS[6]
local order_id, user, qty = ARGV[1], ARGV[2], tonumber(ARGV[3])
local key, sold_at_ms = ARGV[4], tonumber(ARGV[5])

local function exact(n)
  return string.format('%.0f', n)
end
local SEP = '\30'
local FP_SEP = '\31'
local GS = '\29'
local RELEASED = '-'

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'released', 'release_seq', 'idem_window_ms')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
-- Absent on ledgers that never released anything.
local released = tonumber(state[4] or '0')
if sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end

local sale = user .. FP_SEP .. exact(qty)

-- The window hash holding this order's sale as an idempotency record, if this SKU files them
-- in windows and it does, and whether the order was released already.
local function window_record()
  local window_ms = tonumber(state[6] or '')
  if not window_ms or not sold_at_ms then
    return nil, false
  end
  local window = string.sub(meta, 1, -5) .. 'ids:' .. exact(window_ms) .. ':' .. exact(math.floor(sold_at_ms / window_ms))
  -- The record under its key, or under GS <order id> where confirm.lua moved it when the key
  -- was decided afresh in the same window (see confirm.lua).
  -- Under the key alone (its first buyer's) or under buyer and key (any other buyer's).
  local found = redis.call('HMGET', window, key, user .. FP_SEP .. key, GS .. order_id, SEP .. order_id)
  local prefix = sale .. SEP .. 'purchased' .. SEP .. order_id .. SEP
  for i = 1, 3 do
    local value = found[i]
    local gs_at = value and string.find(value, GS, 1, true)
    if gs_at and string.sub(value, gs_at + 1, gs_at + #prefix) == prefix then
      return window, found[4] ~= false
    end
  end
  return nil, false
end

local sales, already = window_record()
local in_window = sales ~= nil
if already then
  return {'already', exact(remaining), exact(released)}
end
if not in_window then
  local record
  for at = 3, 5 do
    record = redis.call('HGET', KEYS[at], order_id)
    if record then
      sales = KEYS[at]
      break
    end
  end
  if record == RELEASED .. sale then
    return {'already', exact(remaining), exact(released)}
  end
  if record ~= sale then
    return {'never_sold', exact(remaining), exact(released)}
  end
end
if sold < qty then
  return redis.error_reply('SECKILL_CORRUPT a release larger than what is sold')
end

sold = sold - qty
remaining = remaining + qty
released = released + qty
local release_seq = tonumber(state[5] or '0') + 1
-- Asserted before the first write (Redis does not roll back).
if sold + remaining ~= total or sold < 0 or released < qty then
  return redis.error_reply('SECKILL_CORRUPT the release would break sold + remaining == total')
end
redis.call('HSET', meta, 'sold', exact(sold), 'remaining', exact(remaining), 'released', exact(released),
  'release_seq', exact(release_seq))
if redis.call('HINCRBY', bought_by_user, user, -qty) <= 0 then
  redis.call('HDEL', bought_by_user, user)
end
if in_window then
  redis.call('HSET', sales, SEP .. order_id, '1')
else
  redis.call('HSET', sales, order_id, RELEASED .. sale)
end
-- Numbered like the order stream, so a reader resumes from the last release it saw.
redis.call('XADD', log, '0-' .. exact(release_seq), 'order_id', order_id, 'user', user, 'qty', exact(qty))
return {'released', exact(remaining), exact(released)}
