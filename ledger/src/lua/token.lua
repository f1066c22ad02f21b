-- Stores a fresh submit token for one purchase of a SKU by one user. A script, not a bare SET, so
-- that a token is never issued for a SKU the ledger does not know (that would look like a usable
-- token for a sale that does not exist).
--
-- The SKU issues at most ARGV[3] tokens per window of one TTL (KEYS[3] counts them and expires
-- after two windows): a token lives at most one TTL, so at most two windows' worth are live,
-- which bounds the memory tokens take whatever callers do.
--
-- KEYS[1] meta hash   KEYS[2] the token's key   KEYS[3] this window's count
-- ARGV[1] user   ARGV[2] time to live in ms   ARGV[3] tokens per window
-- Returns 1 if it stored the token, 0 if the key was taken (a collision: the caller draws again),
-- -1 if the window's tokens are all issued.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local issued = redis.call('INCR', KEYS[3])
if issued == 1 then
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
end
if issued > tonumber(ARGV[3]) then
  return -1
end
if redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2], 'NX') then
  return 1
end
return 0
