-- Hands a buyer the submit token for one purchase of a SKU: the one the buyer already holds, or a
-- fresh one. A script, not a bare SET, so that a token is never issued for a SKU the ledger does
-- not know (that would look like a usable token for a sale that does not exist).
--
-- A buyer holds at most one live token per SKU: KEYS[4] names the token issued to the buyer, with
-- the token's own TTL, and confirm.lua deletes it together with the token it spends. While it
-- lives, an ask returns that token and counts nothing, so a client asking again and again under
-- one user holds one token and takes one slot of the window's cap.
--
-- The SKU issues at most ARGV[3] fresh tokens per window of one TTL (KEYS[3] counts them and
-- expires after two windows): a token lives at most one TTL, so at most two windows' worth are
-- live, which bounds the memory tokens take whatever callers do.
--
-- KEYS[1] meta hash   KEYS[2] the fresh token's key   KEYS[3] this window's count
-- KEYS[4] the buyer's holder key
-- ARGV[1] user   ARGV[2] time to live in ms   ARGV[3] tokens per window   ARGV[4] the fresh token
-- Returns {status, token, ms it lives on}: status 1 if it stored the fresh token, 2 if the buyer
-- holds a live one (returned with what is left of its TTL), 0 if the fresh token's key was taken
-- (a collision: the caller draws again), -1 if the window's tokens are all issued.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
local held = redis.call('GET', KEYS[4])
if held then
  local left = redis.call('PTTL', KEYS[4])
  -- Written only with a TTL; a holder without one would lock the buyer out for good, so it is
  -- replaced below instead.
  if left > 0 then
    return {2, held, left}
  end
end
local issued = redis.call('INCR', KEYS[3])
if issued == 1 then
  redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[2]))
end
if issued > tonumber(ARGV[3]) then
  return {-1, '', 0}
end
if not redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2], 'NX') then
  return {0, '', 0}
end
redis.call('SET', KEYS[4], ARGV[4], 'PX', ARGV[2])
return {1, ARGV[4], tonumber(ARGV[2])}
