-- Creates a SKU's ledger unless one exists. Never overwrites: re-creating a ledger that holds
-- sales would hand out its sold units a second time.
--
-- KEYS[1] meta hash   ARGV[1] total   ARGV[2] per-user limit (0 = none)
-- ARGV[3] require_token: 1 = every purchase must consume a submit token, 0 = none needed
-- Returns 1 if it created the ledger, 0 if one was already there.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'total', ARGV[1], 'sold', 0, 'remaining', ARGV[1],
  'per_user_limit', ARGV[2], 'order_seq', 0, 'require_token', ARGV[3])
return 1
