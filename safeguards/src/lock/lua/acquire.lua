-- Takes a lock, or takes it again for the owner that holds it (reentrancy), atomically.
--
-- KEYS[1]  the lock: a hash {owner, fence, h:<hold>...} with the lock's ttl. One field per hold,
--          not a counter, so a retried acquisition (its answer was lost) adds nothing.
-- KEYS[2]  the lock's fencing counter. Never expires: a fence is never handed out twice.
-- ARGV[1]  owner token   ARGV[2] hold id   ARGV[3] ttl ms   ARGV[4] holds max
--
-- Returns {1, fence, holds} when the caller holds the lock now; {0, pttl ms, 0} when another
-- owner does. Both keys carry the same {name} hash tag, so this runs on Redis Cluster.
local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
local hold = 'h:' .. ARGV[2]
if held[1] == ARGV[1] then
  local holds = redis.call('HLEN', KEYS[1]) - 2
  if redis.call('HEXISTS', KEYS[1], hold) == 0 then
    if holds >= tonumber(ARGV[4]) then
      return redis.error_reply('SECKILL_HOLDS_MAX')
    end
    redis.call('HSET', KEYS[1], hold, 1)
    holds = holds + 1
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, tonumber(held[2]), holds}
end
if held[1] then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
-- Free. A hash without an owner is debris (nothing writes one); start clean.
redis.call('DEL', KEYS[1])
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, hold, 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fence, 1}
