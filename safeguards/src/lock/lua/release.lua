-- Drops one hold of a lock, if the caller still owns that acquisition; the last hold frees it.
--
-- KEYS[1]  the lock hash (see acquire.lua)
-- ARGV[1]  owner token   ARGV[2] fence of the acquisition   ARGV[3] hold id
--
-- Returns the holds left (0: the lock is free now), or -1 when the lock is not the caller's: it
-- expired, another owner took it, or this owner's acquisition was replaced by a newer one (the
-- fence differs). Repeating a release changes nothing.
local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end
redis.call('HDEL', KEYS[1], 'h:' .. ARGV[3])
local holds = redis.call('HLEN', KEYS[1]) - 2
if holds <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
return holds
