-- Stores a fresh submit token for one purchase of a SKU by one user. A script, not a bare SET, so
-- that a token is never issued for a SKU the ledger does not know (that would look like a usable
-- token for a sale that does not exist).
--
-- KEYS[1] meta hash   KEYS[2] the token's key   ARGV[1] user   ARGV[2] time to live in ms
-- Returns 1 if it stored the token, 0 if the key was taken (a collision: the caller draws again).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
if redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2], 'NX') then
  return 1
end
return 0
