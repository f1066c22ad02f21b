-- The waiting room of one SKU (ledger/src/room.rs states its rules): one script for a buyer's
-- join and for a node's tick, so both apply the same draw, heartbeats and admissions.
--
-- KEYS[1] the SKU's meta hash (remaining, closed). The room's keys are named here from its
-- prefix `p:{s}:`, so they share the SKU's slot and an admission reads `remaining` atomically:
--   room         hash: next (last position given), admitted (admissions ever), bucket and
--                bucket_at (the admission bucket), seed, drawn_at, placed (the draw's record)
--   room:pre     set: the pre-queue          room:line  zset: user → position
--   room:seen    zset: waiter → last heartbeat (ms)
--   room:live    zset: admitted user → ticket expiry (ms); confirm.lua removes whoever spends it
--   room:ticket  hash: admitted user → `token expiry`
--   room:log     list: one entry per admission, `seq position user at remaining live`
-- A ticket's token is a submit token (`token:<t>` → user, `token_holder:<u>` → t, with the
-- ticket's TTL), so confirm.lua spends it with the sale, once.
--
-- ARGV[1] 'join' or 'tick'   ARGV[2] sale start (Unix ms; '' for none)   ARGV[3] admit_per_s
-- ARGV[4] admit_factor   ARGV[5] ticket TTL (ms)   ARGV[6] abandon after (ms)
-- ARGV[7] a fresh random seed (recorded if this call draws; salts the tokens it issues)
-- ARGV[8] seconds of admissions the bucket holds   ARGV[9] most admissions per call
-- ARGV[10] how long the room's keys outlive this call (ms)
-- ARGV[11..] users: those joining (in their order of arrival), or the waiters the tick's caller saw
-- Returns {now, remaining, closed, seed, drawn_at, placed, waiting, admitted, live, head} (head:
-- the lowest position still in line, 0 for none) and then,
-- per user, {kind, a, b}: 0 absent, 1 pre-queue, 2 waiting (position, ahead), 3 admitted
-- (token, expiry ms).

local meta = KEYS[1]
local base = string.sub(meta, 1, -5)
local k_room, k_pre, k_line = base .. 'room', base .. 'room:pre', base .. 'room:line'
local k_seen, k_live, k_ticket, k_log = base .. 'room:seen', base .. 'room:live', base .. 'room:ticket', base .. 'room:log'

local state = redis.call('HMGET', meta, 'total', 'remaining', 'closed')
if not state[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local remaining = tonumber(state[2])
local closed = state[3] == '1'
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl, abandon_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
local seed = redis.call('HGET', k_room, 'seed')

-- Places the pre-queue in the order of SHA-1(seed:user): uniform for a random seed, and
-- recomputable by anyone who reads the seed. ZADD in slices: Lua's unpack has a stack limit.
local function draw()
  seed = ARGV[7]
  local members = redis.call('SMEMBERS', k_pre)
  local keyed = {}
  for i, user in ipairs(members) do
    keyed[i] = {redis.sha1hex(seed .. ':' .. user), user}
  end
  table.sort(keyed, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local position = tonumber(redis.call('HGET', k_room, 'next') or '0')
  local args = {}
  for _, entry in ipairs(keyed) do
    position = position + 1
    args[#args + 1] = position
    args[#args + 1] = entry[2]
    if #args >= 2000 then
      redis.call('ZADD', k_line, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', k_line, unpack(args))
  end
  redis.call('DEL', k_pre)
  redis.call('HSET', k_room, 'seed', seed, 'drawn_at', now, 'placed', #keyed, 'next', position)
end

local started = ARGV[2] == '' or now >= tonumber(ARGV[2])
if started and not seed then
  draw()
end

-- Waiters unseen for `abandon_ms` leave; a slice per call keeps the script short.
local function sweep()
  local gone = redis.call('ZRANGEBYSCORE', k_seen, '-inf', '(' .. (now - abandon_ms), 'LIMIT', 0, 1000)
  for _, user in ipairs(gone) do
    redis.call('ZREM', k_line, user)
    redis.call('SREM', k_pre, user)
  end
  if #gone > 0 then
    redis.call('ZREM', k_seen, unpack(gone))
  end
end

-- Lets the line's head through: what the bucket holds, and never past admit_factor × remaining
-- live tickets.
local function admit()
  redis.call('ZREMRANGEBYSCORE', k_live, '-inf', now)
  if closed or remaining <= 0 or not seed then
    return
  end
  local rate = tonumber(ARGV[3])
  local capacity = math.max(1, rate * tonumber(ARGV[8]))
  local bucket_state = redis.call('HMGET', k_room, 'bucket', 'bucket_at')
  local bucket = tonumber(bucket_state[1]) or capacity
  local at = tonumber(bucket_state[2]) or now
  bucket = math.min(capacity, bucket + math.max(0, now - at) * rate / 1000)
  local live = redis.call('ZCARD', k_live)
  local room_for = math.floor(tonumber(ARGV[4]) * remaining) - live
  local n = math.min(math.floor(bucket), room_for, tonumber(ARGV[9]))
  if n > 0 then
    local popped = redis.call('ZPOPMIN', k_line, n)
    for i = 1, #popped, 2 do
      local user, position = popped[i], popped[i + 1]
      local seq = redis.call('HINCRBY', k_room, 'admitted', 1)
      local token = string.sub(redis.sha1hex(ARGV[7] .. ':' .. seq), 1, 32)
      local expires = now + ttl
      redis.call('SET', base .. 'token:' .. token, user, 'PX', ttl)
      redis.call('SET', base .. 'token_holder:' .. user, token, 'PX', ttl)
      redis.call('HSET', k_ticket, user, token .. ' ' .. expires)
      redis.call('ZADD', k_live, expires, user)
      redis.call('ZREM', k_seen, user)
      live = live + 1
      redis.call('RPUSH', k_log, table.concat({seq, position, user, now, remaining, live}, ' '))
    end
    bucket = bucket - #popped / 2
  end
  redis.call('HSET', k_room, 'bucket', string.format('%.6f', bucket), 'bucket_at', now)
end

-- Where `user` stands; a ticket spent or expired is forgotten here.
local function place(user)
  local ticket = redis.call('HGET', k_ticket, user)
  if ticket then
    local space = string.find(ticket, ' ', 1, true)
    local token, expires = string.sub(ticket, 1, space - 1), tonumber(string.sub(ticket, space + 1))
    if expires > now and redis.call('EXISTS', base .. 'token:' .. token) == 1 then
      return {3, token, expires}
    end
    redis.call('HDEL', k_ticket, user)
  end
  local position = redis.call('ZSCORE', k_line, user)
  if position then
    return {2, tonumber(position), redis.call('ZCOUNT', k_line, '-inf', '(' .. position)}
  end
  if redis.call('SISMEMBER', k_pre, user) == 1 then
    return {1, 0, 0}
  end
  return {0, 0, 0}
end

local users = {}
for i = 11, #ARGV do
  users[#users + 1] = ARGV[i]
end

if ARGV[1] == 'join' then
  for _, user in ipairs(users) do
    if place(user)[1] == 0 and not closed and remaining > 0 then
      if seed then
        redis.call('ZADD', k_line, redis.call('HINCRBY', k_room, 'next', 1), user)
      else
        redis.call('SADD', k_pre, user)
      end
      redis.call('ZADD', k_seen, now, user)
    end
  end
end
-- Heartbeats of the waiters named (XX: one who left, or was let through, is not put back).
if #users > 0 then
  local beats = {'XX'}
  for _, user in ipairs(users) do
    beats[#beats + 1] = now
    beats[#beats + 1] = user
  end
  redis.call('ZADD', k_seen, unpack(beats))
end
sweep()
admit()

local reply = {now, remaining, closed and 1 or 0, seed or '', 0, 0, 0, 0, 0, 0}
local record = redis.call('HMGET', k_room, 'drawn_at', 'placed', 'admitted')
reply[5], reply[6], reply[8] = tonumber(record[1] or '0'), tonumber(record[2] or '0'), tonumber(record[3] or '0')
reply[7] = seed and redis.call('ZCARD', k_line) or redis.call('SCARD', k_pre)
reply[9] = redis.call('ZCARD', k_live)
local head = redis.call('ZRANGE', k_line, 0, 0, 'WITHSCORES')
if head[2] then
  reply[10] = tonumber(head[2])
end
for _, user in ipairs(users) do
  local at = place(user)
  reply[#reply + 1] = at[1]
  reply[#reply + 1] = at[2]
  reply[#reply + 1] = at[3]
end
local keys_ttl = tonumber(ARGV[10])
for _, key in ipairs({k_room, k_pre, k_line, k_seen, k_live, k_ticket, k_log}) do
  redis.call('PEXPIRE', key, keys_ttl)
end
return reply
