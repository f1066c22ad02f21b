-- The floor under confirm.lua, for `examples/confirm_cost.rs`: only the work a batch of sales
-- cannot avoid, with confirm.lua's keys, arguments and reply, so the two run alike. Every
-- purchase sells (the example's stock never runs out); nothing is read but the counts it must
-- raise, and nothing is checked. Not a ledger script: it keeps no buyers' counts, reads no
-- idempotency record, spends no token.
--
-- What stays, because every sale must leave it: its idempotency record (one HSET of the batch's
-- records into the current window), its order in the stream (one XADD per batch), the seller's
-- count (one HINCRBY) and the SKU's figures (one HMGET, one HSET).

local meta, sold_by_epoch, orders = KEYS[1], KEYS[2], KEYS[4]
local base = string.sub(meta, 1, -5)
local sku, node, seller = ARGV[1], ARGV[2], ARGV[4]
local ttl_ms = tonumber(ARGV[3]) * 1000
local ITEMS_AT, PER_PURCHASE = 7, 5
local SEP, FP_SEP, GS = '\30', '\31', '\29'
local function exact(n)
  return string.format('%d', n)
end

local state = redis.call('HMGET', meta, 'sold', 'remaining', 'order_seq')
local sold, remaining, order_seq = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires_at = exact(now_ms + ttl_ms)
local count = (#ARGV - ITEMS_AT + 1) / PER_PURCHASE
local out, records, entry = {}, {}, {'node', node, 'at', exact(now_ms)}
local sold_here = 0
for i = 1, count do
  local at = ITEMS_AT + PER_PURCHASE * (i - 1)
  local key, user, qty_text = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local qty = tonumber(qty_text)
  order_seq = order_seq + 1
  sold_here = sold_here + qty
  local seq_text = exact(order_seq)
  local order_id = sku .. '-' .. seq_text
  entry[#entry + 1] = seq_text
  entry[#entry + 1] = order_id .. FP_SEP .. key .. FP_SEP .. user .. FP_SEP .. qty_text
  local decision = 'purchased' .. SEP .. order_id .. SEP .. node .. SEP .. qty_text
  records[#records + 1] = key
  records[#records + 1] = expires_at .. GS .. user .. FP_SEP .. qty_text .. SEP .. decision
  out[2 * i - 1], out[2 * i] = 'fresh', decision
end
if count > 0 then
  redis.call('HSET', base .. 'floor:' .. exact(math.floor(now_ms / ttl_ms)), unpack(records))
  redis.call('XADD', orders, '0-' .. exact(order_seq), unpack(entry))
  redis.call('HINCRBY', sold_by_epoch, seller, exact(sold_here))
  sold, remaining = sold + sold_here, remaining - sold_here
  redis.call('HSET', meta, 'sold', exact(sold), 'remaining', exact(remaining), 'order_seq', exact(order_seq))
end
out[2 * count + 1], out[2 * count + 2], out[2 * count + 3] = exact(sold), exact(remaining), '0'
return out
