-- Confirms a batch of local sales of one SKU in one atomic step. This script is the only code
-- that ever lowers a SKU's remaining count, which is why the fleet can never sell more than the
-- total: every unit sold passes `remaining >= qty` here, with no other writer in between.
--
-- KEYS[1] meta hash (total, sold, remaining, per_user_limit, order_seq, closed, require_token,
-- released)
-- KEYS[2] sold-by-node-epoch hash  KEYS[3] bought-by-user hash  KEYS[4] order stream
-- KEYS[5] the sales hash of the seller's current window (order id -> buyer and qty: what
-- release.lua checks a release against, kept for the sale record TTL whatever the idempotency
-- TTL; one hash per window so a whole window expires at once, Redis 7.0 having no field TTL)
-- KEYS[3+3i] idempotency record of purchase i   KEYS[4+3i] its submit-token key (the bare
-- token prefix when it brought no token: a key issue_token never writes, in the same slot)
-- KEYS[5+3i] its buyer's token holder key (token.lua: the token the buyer holds)
-- ARGV[1] sku   ARGV[2] node   ARGV[3] idempotency ttl in seconds   ARGV[4] "node#epoch"
-- ARGV[5] the seller's epoch (0: no coordinator)   ARGV[6] sale record ttl in milliseconds
-- ARGV[7+4(i-1)..] idempotency key, user, qty, order id of purchase i (the seller's Snowflake id;
-- empty: the ledger numbers the order `sku-seq`). The qty is stored and replied as given, so it
-- comes as the caller's canonical decimal text (Rust's), as the embedded ledger's fingerprint has it.
--
-- Returns {verdict_1, decision_1, ..., sold, remaining, released}; verdict is
-- fresh|replayed|key_reused. `sold` counts units sold and not released (release.lua gives an
-- unpaid order's units back), so `sold + remaining == total` always holds.
-- A seller whose epoch the coordinator ended (`ended:<node>` in meta, written by end_epoch.lua)
-- is refused whole: once its units were counted for reallocation, it must not sell another.
--
-- Cost. Redis spends most of a script's time per `redis.call`, so the batch pays per batch
-- what it can and per sale only what it must:
-- 1. reads, one call each for the whole batch: meta (HMGET), every idempotency record (MGET),
--    and the count of every buyer whose purchase may need it (HMGET);
-- 2. decisions in order, in Lua: a key decided earlier in this batch is looked up in
--    `decided` (what its SET stored) before the MGET's answer, and each buyer's count is
--    carried in `bought`, so the batch decides exactly as reading Redis before every step
--    would, repeats of a key or of a buyer included;
-- 3. writes: per sale the XADD (each order is its own stream entry, numbered by its seq),
--    per fresh decision the SET of its record (each with its own TTL), and on a SKU that
--    requires tokens the GET of its token and, for the buyer's own, one DEL of the token and
--    the buyer's holder key; per batch one HINCRBY of the seller's count (all sales of a
--    batch are one seller's), one HSET of every buyer's new count, one HSET of every sale's
--    record (and the window's expiry pushed out to the last sale plus the record TTL) and one
--    HSET of meta.
-- Every check that can fail (a missing or ended SKU, an epoch ended, a corrupt count) happens
-- in 1, before the first write, because Redis does not roll back a script that errors halfway.
--
-- Submit tokens (SKUs created with require_token): a fresh decision first reads the token key;
-- a live token issued to this buyer passes and is deleted in the same step, so no second
-- purchase can ever see it, and the token is spent whatever follows (sold_out, user_limit): one
-- token, one attempt. The buyer's holder key goes with it, so the buyer's next ask draws a fresh
-- token. A token presented by another user is refused and left alone: that purchase cannot name
-- the owner's holder key, so deleting the token would leave its owner holding a dead token until
-- it expired. A replay of a decided key never touches its token.

local meta, sold_by_epoch, bought_by_user, orders, sales = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- The ttl goes to SET as the caller's integer text.
local sku, node, ttl, seller, epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local sale_record_ttl_ms = tonumber(ARGV[6])
local ITEMS_AT = 7
-- Counts go up to 2^53 - 1; Lua turns a number into text with "%.14g" (1.1258999068426e+15) in
-- concatenation, tostring and redis.call arguments alike, so every count is written through this.
-- Lua 5.1 formats '%d' through a C long: exact up to 2^53 where long has 64 bits, and half the
-- cost of '%.0f' (about 0.3 µs against 0.7, once or twice per sale); '%.0f' where it has not.
local INTEGER = string.format('%d', 9007199254740991) == '9007199254740991' and '%d' or '%.0f'
local function exact(n)
  return string.format(INTEGER, n)
end
local SEP = '\30'
local FP_SEP = '\31'

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'per_user_limit', 'order_seq', 'closed',
  'require_token', 'ended:' .. node, 'released', 'price', 'currency', 'pay_timeout_s')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
if epoch > 0 and state[8] and tonumber(state[8]) >= epoch then
  return redis.error_reply('SECKILL_EPOCH_ENDED ' .. seller .. ' was ended by the coordinator')
end
local total, sold, remaining = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
local limit, order_seq = tonumber(state[4]), tonumber(state[5])
local first_seq = order_seq
local closed = state[6] == '1'
-- Absent until the first release (release.lua).
local released = tonumber(state[9] or '0')
-- Absent on ledgers created before tokens existed: those never required one.
local require_token = state[7] == '1'
-- The terms each order is priced on, as the SKU's are at this sale (pricing.lua changes them
-- for later sales only); absent on ledgers created before events carried them.
local priced = {}
if state[10] and state[11] and state[12] then
  priced = {'price', state[10], 'currency', state[11], 'pay_timeout_s', state[12]}
end
if sold + remaining ~= total or remaining < 0 then
  return redis.error_reply('SECKILL_CORRUPT sold + remaining ~= total')
end

local count = (#ARGV - ITEMS_AT + 1) / 4
if count == 0 then
  return {exact(sold), exact(remaining), exact(released)}
end

-- Spends the token under `token_key` if it is a live token issued to `user` (GET answers false
-- for one never issued, spent or expired), with the buyer's holder key; says whether it did.
local function spend_token(token_key, holder_key, user)
  if redis.call('GET', token_key) ~= user then
    return false
  end
  redis.call('DEL', token_key, holder_key)
  return true
end

-- 1. Reads. `stored[i]` is purchase i's record, false where there is none.
local records = {}
for i = 1, count do
  records[i] = KEYS[3 + 3 * i]
end
local stored = redis.call('MGET', unpack(records))

-- A buyer's count decides the limit and is raised by a sale: read for every buyer with an
-- undecided key, unless the sale is closed or that purchase can neither meet the limit check
-- nor sell (no limit, and more asked than is left: a sold-out SKU without a limit).
local bought, users = {}, {}
if not closed then
  for i = 1, count do
    local at = ITEMS_AT + 4 * (i - 1)
    local user = ARGV[at + 1]
    if not stored[i] and not bought[user] and (limit > 0 or tonumber(ARGV[at + 2]) <= remaining) then
      bought[user] = 0
      users[#users + 1] = user
    end
  end
  if #users > 0 then
    local counts = redis.call('HMGET', bought_by_user, unpack(users))
    for j = 1, #users do
      local n = tonumber(counts[j] or '0')
      if not n then
        return redis.error_reply('SECKILL_CORRUPT an unreadable count of what a buyer bought')
      end
      bought[users[j]] = n
    end
  end
end

-- 2. and 3. Decisions in order, with their per-sale writes.
local out, decided = {}, {}
local raised, raised_users = {}, {}
local sale_records = {}
local sold_here = 0
local at_ms = nil
for i = 1, count do
  local record = KEYS[3 + 3 * i]
  local at = ITEMS_AT + 4 * (i - 1)
  local key, user, qty_text, given_id = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local record_text = decided[record] or stored[i]
  if record_text then
    local sep_at = string.find(record_text, SEP, 1, true)
    if string.sub(record_text, 1, sep_at - 1) == user .. FP_SEP .. qty_text then
      out[2 * i - 1], out[2 * i] = 'replayed', string.sub(record_text, sep_at + 1)
    else
      out[2 * i - 1], out[2 * i] = 'key_reused', ''
    end
  else
    local qty = tonumber(qty_text)
    local decision
    if require_token and not spend_token(KEYS[4 + 3 * i], KEYS[5 + 3 * i], user) then
      decision = 'token_invalid'
    elseif closed then
      decision = 'ended'
    elseif limit > 0 and bought[user] + qty > limit then
      decision = 'user_limit'
    elseif remaining < qty then
      decision = 'sold_out'
    else
      remaining = remaining - qty
      sold = sold + qty
      sold_here = sold_here + qty
      order_seq = order_seq + 1
      local seq_text = exact(order_seq)
      bought[user] = bought[user] + qty
      if not raised[user] then
        raised[user] = true
        raised_users[#raised_users + 1] = user
      end
      local order_id = given_id
      if order_id == '' then
        order_id = sku .. '-' .. seq_text
      end
      -- Read once per batch, at its first sale: when the units sold, by the ledger's clock
      -- (allowed in a script that writes: Redis 7 replicates effects, not the script).
      if not at_ms then
        local time = redis.call('TIME')
        at_ms = exact(tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
      end
      -- The entry id is the order's sequence number, so readers can resume from a seq.
      redis.call('XADD', orders, '0-' .. seq_text, 'order_id', order_id, 'key', key, 'user', user,
        'qty', qty_text, 'node', node, 'at', at_ms, unpack(priced))
      sale_records[#sale_records + 1] = order_id
      sale_records[#sale_records + 1] = user .. FP_SEP .. qty_text
      decision = 'purchased' .. SEP .. order_id .. SEP .. node .. SEP .. qty_text
    end
    -- The purchase's fingerprint, then the decision.
    local text = user .. FP_SEP .. qty_text .. SEP .. decision
    redis.call('SET', record, text, 'EX', ttl)
    decided[record] = text
    out[2 * i - 1], out[2 * i] = 'fresh', decision
  end
end

-- A batch that sold nothing (the common case in the Redis-only baseline) writes nothing here.
if order_seq ~= first_seq then
  -- Per-node totals are sums over this hash: one write per batch instead of two per sale.
  redis.call('HINCRBY', sold_by_epoch, seller, exact(sold_here))
  local counts = {}
  for _, user in ipairs(raised_users) do
    counts[#counts + 1] = user
    counts[#counts + 1] = exact(bought[user])
  end
  redis.call('HSET', bought_by_user, unpack(counts))
  redis.call('HSET', sales, unpack(sale_records))
  -- The window lives until its last sale's record is due; PEXPIRETIME is -1 on a new hash.
  local due = tonumber(at_ms) + sale_record_ttl_ms
  if redis.call('PEXPIRETIME', sales) < due then
    redis.call('PEXPIREAT', sales, exact(due))
  end
  redis.call('HSET', meta, 'sold', exact(sold), 'remaining', exact(remaining), 'order_seq', exact(order_seq))
end
out[2 * count + 1], out[2 * count + 2], out[2 * count + 3] = exact(sold), exact(remaining), exact(released)
return out
