-- Creates a SKU's ledger unless one exists. Never overwrites: re-creating a ledger that holds
-- sales would hand out its sold units a second time.
--
-- KEYS[1] meta hash   ARGV[1] total   ARGV[2] per-user limit (0 = none)
-- ARGV[3] require_token: 1 = every purchase must consume a submit token, 0 = none needed
-- ARGV[4] price (minor units)   ARGV[5] currency   ARGV[6] pay timeout in seconds: the terms
-- every order event carries (confirm.lua), so an order is priced as the sale was
-- Returns 1 if it created the ledger, 0 if one was already there.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'total', ARGV[1], 'sold', 0, 'remaining', ARGV[1],
  'per_user_limit', ARGV[2], 'order_seq', 0, 'require_token', ARGV[3],
  'price', ARGV[4], 'currency', ARGV[5], 'pay_timeout_s', ARGV[6])
return 1
