-- Resets a lock's ttl, if the caller still owns that acquisition.
--
-- KEYS[1]  the lock hash (see acquire.lua)
-- ARGV[1]  owner token   ARGV[2] fence of the acquisition   ARGV[3] ttl ms
--
-- Returns 1 when extended, 0 when the lock is not the caller's any more.
local held = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
