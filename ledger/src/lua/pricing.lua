-- Sets the terms a SKU's orders are priced on from now on (price, currency, pay timeout): every
-- order event written after it carries them, every one before keeps what it carries, so a
-- change never reprices an order already sold.
--
-- KEYS[1] meta hash   ARGV[1] price (minor units)   ARGV[2] currency   ARGV[3] pay timeout (s)
-- Returns 1.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
redis.call('HSET', KEYS[1], 'price', ARGV[1], 'currency', ARGV[2], 'pay_timeout_s', ARGV[3])
return 1
