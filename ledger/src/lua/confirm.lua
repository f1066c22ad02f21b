-- Confirms a batch of local sales of one SKU in one atomic step. This script is the only code
-- that ever lowers a SKU's remaining count, which is why the fleet can never sell more than the
-- total: every unit sold passes `remaining >= qty` here, with no other writer in between.
--
-- KEYS[1] meta hash (total, sold, remaining, per_user_limit, order_seq, closed, require_token,
-- released)
-- KEYS[2] sold-by-node-epoch hash  KEYS[3] bought-by-user hash  KEYS[4] order stream
-- ARGV[1] sku   ARGV[2] node   ARGV[3] idempotency ttl in seconds   ARGV[4] "node#epoch"
-- ARGV[5] the seller's epoch (0: no coordinator)   ARGV[6] sale record ttl in milliseconds
-- ARGV[7+5(i-1)..] idempotency key, user, qty, order id, submit token of purchase i (order id
-- empty: the ledger numbers the order `sku-seq`; token empty: it brought none). The qty is
-- stored and replied as given, so it comes as the caller's canonical decimal text (Rust's), as
-- the embedded ledger's fingerprint has it.
-- Keys a purchase touches (its token, its buyer's holder key, its legacy record) are not in
-- KEYS: the script names them from the SKU's prefix, in the SKU's `{sku}` slot like every key
-- here. Passing three names per purchase cost Redis more to parse and hand to Lua than the
-- rest of a sale's work.
-- Returns {verdict_1, decision_1, ..., sold, remaining, released}; verdict is
-- fresh|replayed|key_reused. `sold` counts units sold and not released (release.lua gives an
-- unpaid order's units back), so `sold + remaining == total` always holds.
-- A seller whose epoch the coordinator ended (`ended:<node>` in meta, written by end_epoch.lua)
-- is refused whole: once its units were counted for reallocation, it must not sell another.
--
-- Cost. Redis spends most of a script's time per `redis.call`, so the batch pays per batch
-- what it can and per sale only Lua table work (no Redis call per sale but a token's):
-- 1. reads, one call each for the whole batch: meta (HMGET), the clock (TIME), every
--    idempotency record of the windows that may hold one (one or two HMGETs per window, see
--    below),
--    every legacy record (MGET), and, on a SKU with a per-user limit, the count of every buyer
--    with an undecided purchase (HMGET);
-- 2. decisions in order, in Lua: a key decided earlier in this batch is looked up in
--    `decided` before what was read, and each buyer's count is carried in `bought`, so the
--    batch decides exactly as reading Redis before every step would, repeats of a key or of a
--    buyer included;
-- 3. writes, per batch: one XADD holding every sale of the batch, one HSET of every fresh
--    decision's record into the current window (and its expiry pushed out), one HINCRBY of
--    the seller's count (all sales of a batch are one seller's), one HSET of every buyer's new
--    count (a SKU with a per-user limit) and one HSET of meta; per sale only, on a SKU that requires tokens, the GET of its token and, for the
--    buyer's own, one DEL of the token and the buyer's holder key.
-- Every check that can fail (a missing or ended SKU, an epoch ended, a corrupt count) happens
-- in 1, before the first write, because Redis does not roll back a script that errors halfway.
--
-- The order stream: one entry per batch, its id `0-<seq of the batch's last order>`, so
-- `XRANGE (0-<after>` returns every entry holding an order past `after` (readers skip the
-- orders at or before it) and `XTRIM MINID 0-<keep>` keeps every entry holding an order at or
-- past `keep`. Fields: `node`, `at` and the pricing terms once (every sale of a batch shares
-- them), then one field per order named by its seq (decimal), valued
-- `order_id US key US user US qty` (US the unit separator, which no id, key or user holds).
-- One field per order rather than four suffixed ones: a quarter of the field count to build
-- and store, one string concatenation per sale, and a reader finds each order's seq in its
-- field's name. An entry with an `order_id` field is an older script's single order (readers
-- read both; see `FeedEntry::events`).
--
-- Idempotency records: fields of per-window hashes `<prefix>:{sku}:ids:<W>:<n>` (key ->
-- record text), window n covering Redis-clock ms [n*W, (n+1)*W). W is the SKU's, fixed by the
-- first batch that records a decision (meta `idem_window_ms`, from that caller's TTL) and never
-- changed, so every node numbers windows alike whatever its own TTL; meta `idem_ttl_max_ms`
-- keeps the longest TTL any caller asked for. A record goes into the window of now and that
-- hash expires at its end plus that longest TTL (only ever pushed out), so every record is
-- kept at least its caller's TTL, at most W longer. A window holding a sale is kept for the
-- sale record TTL (ARGV[6]) too: a sale's record is what release.lua checks a release of its
-- order against, long after lookups stopped seeing it. (Scripts before kept a second record
-- per sale, by order id, in a sales hash: one more HSET per sale, a quarter of its cost.)
-- Each record's value starts with when its caller's TTL ends (`<Unix ms> GS <record>`) and a lookup treats a record past it as absent:
-- a key reused after its TTL is a new purchase, exactly as with a SET's own expiry, however
-- long the window is kept. Lookups read every window from the one holding
-- now - longest TTL up to the one after now's: the records any caller still promises, and the
-- next window because after a failover to a replica whose clock is behind, records the old
-- master filed may sit one window ahead of the new clock (a clock ahead only ages records
-- early, as it did the SET records' absolute expiry). With one TTL that is 3 HMGETs a batch; a
-- caller with a longer TTL than W reads ceil(TTL/W) + 2, correct if dearer. The window hashes
-- are not in KEYS: they are named from Redis's own clock, inside the script, and share the
-- SKU's `{sku}` hash tag (its slot), as every key of this script does.
-- A key is its buyer's: another buyer who sends it (a guess, a leak) makes a purchase of its own
-- and takes nothing from the key's other buyers. The key's first buyer's record is filed under
-- the key alone, as scripts before this one filed every record, so an older script in a rolling
-- upgrade finds it (and answers any other buyer of the key `key_reused`, never a second sale);
-- a purchase of another buyer, or of a buyer whose key's own record is gone, is filed under
-- `user US key` (US, the unit separator, is in no user or key), and its window marked (field
-- `GS GS shared`, a name no key or `GS <order id>` takes). A lookup reads the key's field and
-- the mark in one HMGET per window; only while a window in reach is marked does it read, for
-- every purchase its key's record does not answer, the buyer's field: one more HMGET per
-- window. A sale where no buyer sent another's key pays nothing for it.
-- Legacy records (one SET key per idempotency key, written by the script before windows, in
-- KEYS) are still read with one MGET a batch and never written: drop that MGET, and the KEYS,
-- once every node runs this script and the longest idempotency TTL has passed since.
--
-- Submit tokens (SKUs created with require_token): a fresh decision first reads the token key;
-- a live token issued to this buyer passes and is deleted in the same step, so no second
-- purchase can ever see it, and the token is spent whatever follows (sold_out, user_limit): one
-- token, one attempt. The buyer's holder key goes with it, so the buyer's next ask draws a fresh
-- token. A token presented by another user is refused and left alone: that purchase cannot name
-- the owner's holder key, so deleting the token would leave its owner holding a dead token until
-- it expired. A replay of a decided key never touches its token.

local meta, sold_by_epoch, bought_by_user, orders = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- `p:{sku}:`, which every key of the SKU starts with (see keys.rs).
local base = string.sub(meta, 1, -5)
local sku, node, seller, epoch = ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[5])
local ttl_ms = tonumber(ARGV[3]) * 1000
local sale_record_ttl_ms = tonumber(ARGV[6])
local ITEMS_AT = 7
-- An order the seller brought no id for is numbered `<sku>-<seq>`, and on stripe i of `s`
-- (`s/i`) `s-i.<seq>`: order ids travel in URL paths, so no `/`, and the `.` keeps a stripe's
-- ids apart from any SKU's own (whose part after the last `-` is digits only).
local parent, stripe = string.match(ARGV[1], '^(.+)/(%d+)$')
local numbered = parent and (parent .. '-' .. stripe .. '.') or (ARGV[1] .. '-')
local PER_PURCHASE = 5
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
local GS = '\29'
-- A field of a window hash that holds a record filed under buyer and key (GS is in no key):
-- lookups read records under buyer and key only while a window in reach holds one.
local SHARED = GS .. GS .. 'shared'

local state = redis.call('HMGET', meta, 'total', 'sold', 'remaining', 'per_user_limit', 'order_seq', 'closed',
  'require_token', 'ended:' .. node, 'released', 'price', 'currency', 'pay_timeout_s', 'idem_window_ms',
  'idem_ttl_max_ms')
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
-- The SKU's record window and longest TTL (see "Idempotency records"); absent until its first
-- decision, when this caller's TTL sets both.
local window_ms = tonumber(state[13] or ttl_ms)
local ttl_max_ms = tonumber(state[14] or ttl_ms)
if not window_ms or not ttl_max_ms or window_ms < 1 then
  return redis.error_reply('SECKILL_CORRUPT an unreadable idempotency window')
end
if ttl_ms > ttl_max_ms then
  ttl_max_ms = ttl_ms
end

local count = (#ARGV - ITEMS_AT + 1) / PER_PURCHASE
if count == 0 then
  return {exact(sold), exact(remaining), exact(released)}
end

-- Spends `token` if it is a live token issued to `user` (GET answers false for one never
-- issued, spent or expired; a purchase without a token brings '', never issued), with the
-- buyer's holder key; says whether it did.
local function spend_token(token, user)
  if token == '' then
    return false
  end
  local token_key = base .. 'token:' .. token
  if redis.call('GET', token_key) ~= user then
    return false
  end
  redis.call('DEL', token_key, base .. 'token_holder:' .. user)
  -- A waiting room's ticket is such a token: spent, it is no longer a live admission
  -- (room.lua); on a SKU without a room the set does not exist and this changes nothing.
  redis.call('ZREM', base .. 'room:live', user)
  return true
end

-- The ledger's clock, read once: the window records go into, and when the batch's units sold
-- (allowed in a script that writes: Redis 7 replicates effects, not the script).
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local at_ms = exact(now_ms)
local window_prefix = base .. 'ids:' .. exact(window_ms) .. ':'
local now_window = math.floor(now_ms / window_ms)
-- When this caller's records expire (see the lookups below).
local expires_at = exact(now_ms + ttl_ms)

-- 1. Reads. `stored[i]` is purchase i's record under its key alone (the key's first buyer's,
-- see "A key is its buyer's"), false where there is none: the newest window holding one first,
-- then the legacy key; `mine[i]` its record under its buyer and key, read for every purchase
-- whose key holds no record of its own buyer.
local idem_keys = {}
for i = 1, count do
  idem_keys[i] = ARGV[ITEMS_AT + PER_PURCHASE * (i - 1)]
end
local stored, mine = {}, {}
-- Sales whose records, past their TTL, sit in the window this batch writes and would be
-- overwritten by their keys' new decisions: kept under `GS <order id>` (GS is in no key) so a
-- release of that order still finds them. Only a caller whose TTL is shorter than the window
-- can reuse a key inside one window.
local moved = {}
local function keep_sale_record(value, gs_at)
  local sep_at = string.find(value, SEP, gs_at + 1, true)
  if sep_at and string.sub(value, sep_at + 1, sep_at + 10) == 'purchased' .. SEP then
    local id_end = string.find(value, SEP, sep_at + 11, true)
    if id_end then
      moved[#moved + 1] = GS .. string.sub(value, sep_at + 11, id_end - 1)
      moved[#moved + 1] = value
    end
  end
end
-- Reads the live record of each field in `fields` from every window a lookup covers, into
-- `into[at[j]]`. Returns an error reply for an unreadable record, nil otherwise.
-- With `marked`, the last field is SHARED, and the answer says whether a window holds it.
local function read_windows(fields, at, into, marked)
  local records, shared = #fields, false
  if marked then
    records = records - 1
  end
  for w = now_window + 1, math.floor((now_ms - ttl_max_ms) / window_ms), -1 do
    local found = redis.call('HMGET', window_prefix .. exact(w), unpack(fields))
    shared = shared or (marked and found[#fields] ~= false)
    for j = 1, records do
      local value, i = found[j], at[j]
      if value and not into[i] then
        -- `<expires at, Unix ms> GS <record>`: a record past its caller's TTL is gone, as its
        -- SET with EX was, even while its window lives on (a key reused after the TTL is a new
        -- purchase).
        local gs_at = string.find(value, GS, 1, true)
        local expiry = gs_at and tonumber(string.sub(value, 1, gs_at - 1))
        if not expiry then
          return redis.error_reply('SECKILL_CORRUPT an unreadable idempotency record')
        end
        if expiry > now_ms then
          into[i] = string.sub(value, gs_at + 1)
        elseif w == now_window then
          keep_sale_record(value, gs_at)
        end
      end
    end
  end
  return nil, shared
end
local every = {}
for i = 1, count do
  every[i] = i
end
idem_keys[count + 1] = SHARED
local failed, shared = read_windows(idem_keys, every, stored, true)
idem_keys[count + 1] = nil
if failed then
  return failed
end
local legacy = {}
for i = 1, count do
  legacy[i] = base .. 'key:' .. idem_keys[i]
end
local legacy_found = redis.call('MGET', unpack(legacy))
for i = 1, count do
  stored[i] = stored[i] or legacy_found[i]
end
-- The owner of a record: the user its fingerprint starts with.
local function owner(record_text)
  return string.sub(record_text, 1, (string.find(record_text, FP_SEP, 1, true) or 1) - 1)
end
local qualified, qualified_at = {}, {}
for i = 1, shared and count or 0 do
  local user = ARGV[ITEMS_AT + PER_PURCHASE * (i - 1) + 1]
  if not stored[i] or owner(stored[i]) ~= user then
    qualified[#qualified + 1] = user .. FP_SEP .. idem_keys[i]
    qualified_at[#qualified_at + 1] = i
  end
end
if #qualified > 0 then
  failed = read_windows(qualified, qualified_at, mine, false)
  if failed then
    return failed
  end
end

-- A buyer's count exists for the per-user limit alone (a SKU's limit is fixed at creation):
-- read for every buyer with an undecided key of an open SKU with a limit, and kept by sales of
-- such a SKU only. A SKU without a limit writes no count at all, a quarter of a sale's writes.
local bought, users = {}, {}
if not closed and limit > 0 then
  for i = 1, count do
    local at = ITEMS_AT + PER_PURCHASE * (i - 1)
    local user = ARGV[at + 1]
    local answered = mine[i] or (stored[i] and owner(stored[i]) == user)
    if not answered and not bought[user] then
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

-- 2. Decisions in order, gathering the batch's writes in tables.
local out, decided = {}, {}
local files_shared = false
local raised, raised_users = {}, {}
local records = {}
local entry = {'node', node, 'at', at_ms}
for _, field in ipairs(priced) do
  entry[#entry + 1] = field
end
local sold_here = 0
for i = 1, count do
  local at = ITEMS_AT + PER_PURCHASE * (i - 1)
  local key, user, qty_text, given_id = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  -- The key's own record answers its buyer; another buyer's purchase under it is answered by
  -- its record under buyer and key, or decided afresh and filed there.
  local field = key
  local record_text = decided[key] or stored[i]
  if record_text and owner(record_text) ~= user then
    field = user .. FP_SEP .. key
    record_text = decided[field] or mine[i]
  elseif not record_text and mine[i] then
    -- The key's own field was another buyer's once; that record expired before this one.
    -- (Nothing else is filed under buyer and key in this batch while the key's field is free.)
    field, record_text = user .. FP_SEP .. key, mine[i]
  end
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
    if require_token and not spend_token(ARGV[at + 4], user) then
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
      if limit > 0 then
        bought[user] = bought[user] + qty
        if not raised[user] then
          raised[user] = true
          raised_users[#raised_users + 1] = user
        end
      end
      local order_id = given_id
      if order_id == '' then
        order_id = numbered .. seq_text
      end
      entry[#entry + 1] = seq_text
      entry[#entry + 1] = order_id .. FP_SEP .. key .. FP_SEP .. user .. FP_SEP .. qty_text
      decision = 'purchased' .. SEP .. order_id .. SEP .. node .. SEP .. qty_text
    end
    -- The purchase's fingerprint, then the decision.
    local text = user .. FP_SEP .. qty_text .. SEP .. decision
    records[#records + 1] = field
    records[#records + 1] = expires_at .. GS .. text
    decided[field] = text
    if field ~= key then
      files_shared = true
    end
    out[2 * i - 1], out[2 * i] = 'fresh', decision
  end
end

-- The figures the batch will write, asserted before the first write of the books (Redis does
-- not roll back; a failed assertion is a script error the caller reports as corrupt books):
-- every unit sold here left remaining, and each sale took at least one unit.
if sold + remaining ~= total or remaining < 0 or sold ~= tonumber(state[2]) + sold_here
  or order_seq - first_seq > sold_here then
  return redis.error_reply('SECKILL_CORRUPT the batch would break sold + remaining == total')
end

-- 3. Writes, a few calls for the whole batch. Pushes `hash`'s expiry out to `due` (Unix ms),
-- never in; PEXPIRETIME is -1 on a new hash.
local function expire_at_least(hash, due)
  if redis.call('PEXPIRETIME', hash) < due then
    redis.call('PEXPIREAT', hash, exact(due))
  end
end
if #records > 0 then
  local window = window_prefix .. exact(now_window)
  for _, field in ipairs(moved) do
    records[#records + 1] = field
  end
  if files_shared then
    records[#records + 1] = SHARED
    records[#records + 1] = '1'
  end
  redis.call('HSET', window, unpack(records))
  local due = (now_window + 1) * window_ms + ttl_max_ms
  -- A sale's record is what release.lua checks a release against, for the sale record TTL.
  if order_seq ~= first_seq and now_ms + sale_record_ttl_ms > due then
    due = now_ms + sale_record_ttl_ms
  end
  expire_at_least(window, due)
  if tonumber(state[13] or '0') ~= window_ms or tonumber(state[14] or '0') ~= ttl_max_ms then
    redis.call('HSET', meta, 'idem_window_ms', exact(window_ms), 'idem_ttl_max_ms', exact(ttl_max_ms))
  end
end
-- A batch that sold nothing (the common case in the Redis-only baseline) writes nothing more.
if order_seq ~= first_seq then
  -- The batch's one entry, numbered by its last order's seq.
  redis.call('XADD', orders, '0-' .. exact(order_seq), unpack(entry))
  -- Per-node totals are sums over this hash: one write per batch instead of two per sale.
  redis.call('HINCRBY', sold_by_epoch, seller, exact(sold_here))
  local counts = {}
  for _, user in ipairs(raised_users) do
    counts[#counts + 1] = user
    counts[#counts + 1] = exact(bought[user])
  end
  if #counts > 0 then
    redis.call('HSET', bought_by_user, unpack(counts))
  end
  redis.call('HSET', meta, 'sold', exact(sold), 'remaining', exact(remaining), 'order_seq', exact(order_seq))
end
out[2 * count + 1], out[2 * count + 2], out[2 * count + 3] = exact(sold), exact(remaining), exact(released)
return out
