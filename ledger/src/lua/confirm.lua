-- Confirms a batch of local sales of one SKU in one atomic step. This script is the only code
-- that ever lowers a SKU's remaining count, which is why the fleet can never sell more than the
-- total: every unit sold passes `remaining >= qty` here, with no other writer in between.
--
-- KEYS[1] meta hash (total, sold, remaining, per_user_limit, order_seq, closed, require_token,
-- released)
-- KEYS[2] sold-by-node-epoch hash  KEYS[3] bought-by-user hash  KEYS[4] order stream
-- KEYS[3+2i] idempotency record of purchase i   KEYS[4+2i] its submit-token key (the bare
-- token prefix when it brought no token: a key issue_token never writes, in the same slot)
-- ARGV[1] sku   ARGV[2] node   ARGV[3] idempotency ttl in seconds   ARGV[4] "node#epoch"
-- ARGV[5] the seller's epoch (0: no coordinator)
-- ARGV[6+4(i-1)..] idempotency key, user, qty, order id of purchase i (the seller's Snowflake id;
-- empty: the ledger numbers the order `sku-seq`)
--
-- Returns {verdict_1, decision_1, ..., sold, remaining, released}; verdict is
-- fresh|replayed|key_reused. `sold` counts units sold and not released (release.lua gives an
-- unpaid order's units back), so `sold + remaining == total` always holds.
-- A seller whose epoch the coordinator ended (`ended:<node>` in meta, written by end_epoch.lua)
-- is refused whole: once its units were counted for reallocation, it must not sell another.
-- Every check that can fail happens before the first write, because Redis does not roll back a
-- script that errors halfway.
--
-- Submit tokens (SKUs created with require_token): a fresh decision first deletes the token key
-- and validates what the delete returned (GETDEL, Redis >= 6.2). Validating by deleting means no
-- second purchase can ever see the token, and the token is spent whatever follows (sold_out,
-- user_limit): one token, one attempt. A replay of a decided key never touches its token. On a
-- Redis without GETDEL the first fresh decision of such a SKU errors before any write of its own,
-- and every item before it was a replay, which writes nothing: the batch is refused whole.

local meta, sold_by_epoch, bought_by_user, orders = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local sku, node, ttl, seller, epoch = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local ITEMS_AT = 6

-- Counts go up to 2^53 - 1; Lua turns a number into text with "%.14g" (1.1258999068426e+15) in
-- concatenation, tostring and redis.call arguments alike, so every count is written through this.
local function exact(n)
  return string.format('%.0f', n)
end
local SEP = '\30'
local FP_SEP = '\31'

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'per_user_limit', 'order_seq', 'closed',
  'require_token', 'ended:' .. node, 'released')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
if epoch > 0 and state[8] and tonumber(state[8]) >= epoch then
  return redis.error_reply('SECKILL_EPOCH_ENDED ' .. seller .. ' was ended by the coordinator')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
local limit, order_seq = tonumber(state[4]), tonumber(state[5])
local closed = state[6] == '1'
-- Absent until the first release (release.lua).
local released = tonumber(state[9] or '0')
-- Absent on ledgers created before tokens existed: those never required one.
local require_token = state[7] == '1'
if sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end

local out = {}
local now_ms = nil
local count = (#ARGV - ITEMS_AT + 1) / 4
for i = 1, count do
  local record, token = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local at = ITEMS_AT + 4 * (i - 1)
  local key, user, qty, given_id = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3]
  local fingerprint = user .. FP_SEP .. exact(qty)
  local stored = redis.call('GET', record)
  if stored then
    local at = string.find(stored, SEP, 1, true)
    if string.sub(stored, 1, at - 1) == fingerprint then
      out[#out + 1] = 'replayed'
      out[#out + 1] = string.sub(stored, at + 1)
    else
      out[#out + 1] = 'key_reused'
      out[#out + 1] = ''
    end
  else
    local decision
    local bought = tonumber(redis.call('HGET', bought_by_user, user) or '0')
    -- GETDEL answers false for a missing (never issued, spent or expired) token.
    if require_token and redis.call('GETDEL', token) ~= user then
      decision = 'token_invalid'
    elseif closed then
      decision = 'ended'
    elseif limit > 0 and bought + qty > limit then
      decision = 'user_limit'
    elseif remaining < qty then
      decision = 'sold_out'
    else
      remaining = remaining - qty
      sold = sold + qty
      order_seq = order_seq + 1
      local order_id = given_id
      if order_id == '' then
        order_id = sku .. '-' .. exact(order_seq)
      end
      -- Per-node totals are sums over this hash: one write per sale instead of two.
      redis.call('HINCRBY', sold_by_epoch, seller, exact(qty))
      redis.call('HINCRBY', bought_by_user, user, exact(qty))
      -- Read once per batch, at its first sale: when the units sold, by the ledger's clock
      -- (allowed in a script that writes: Redis 7 replicates effects, not the script).
      if not now_ms then
        local time = redis.call('TIME')
        now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
      end
      -- The entry id is the order's sequence number, so readers can resume from a seq.
      redis.call('XADD', orders, '0-' .. exact(order_seq), 'order_id', order_id, 'key', key, 'user', user, 'qty', exact(qty),
        'node', node, 'at', exact(now_ms))
      decision = 'purchased' .. SEP .. order_id .. SEP .. node .. SEP .. exact(qty)
    end
    redis.call('SET', record, fingerprint .. SEP .. decision, 'EX', ttl)
    out[#out + 1] = 'fresh'
    out[#out + 1] = decision
  end
end

-- A batch that sold nothing (the common case in the Redis-only baseline) writes nothing here.
if order_seq ~= tonumber(state[5]) then
  redis.call('HSET', meta, 'sold', exact(sold), 'remaining', exact(remaining), 'order_seq', exact(order_seq))
end
out[#out + 1] = exact(sold)
out[#out + 1] = exact(remaining)
out[#out + 1] = exact(released)
return out
