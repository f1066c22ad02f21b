-- Adds (or extends) a blacklist entry and bumps the list's version, in one step, so a node that
-- sees the new version also sees the entry.
--
-- KEYS[1] entries (sorted set: member → expiry in ms of Redis time, +inf = until removed)
-- KEYS[2] version counter
-- ARGV[1] member ("user:<id>" or "ip:<address>")   ARGV[2] ttl in ms, 0 = until removed
-- Returns the new version.

local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[2])
local until_ms = '+inf'
if ttl > 0 then
  until_ms = now + ttl
end
-- GT: a shorter ban (say, an automatic one) never shortens a longer one already in place.
redis.call('ZADD', KEYS[1], 'GT', until_ms, ARGV[1])
return redis.call('INCR', KEYS[2])
