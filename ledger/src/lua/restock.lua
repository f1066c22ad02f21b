-- Adds units to an existing SKU: total and remaining grow together, so `sold + remaining ==
-- total` still holds. A missing ledger is an error, not a fresh start.
--
-- KEYS[1] meta hash   ARGV[1] units to add
-- Returns the new remaining count.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
redis.call('HINCRBY', KEYS[1], 'total', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'remaining', ARGV[1])
