-- Removes a blacklist entry; bumps the version only if there was one.
--
-- KEYS[1] entries   KEYS[2] version counter   ARGV[1] member
-- Returns 1 if removed, 0 if it was not listed.

if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
