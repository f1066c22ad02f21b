-- Closes a SKU's sale: confirm.lua decides every later purchase 'ended'. Kept in the ledger, not
-- only on the nodes, so that once the operator is told "closed" no node can still sell, however
-- late it hears of it.
--
-- KEYS[1] meta hash
-- Returns 1.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
redis.call('HSET', KEYS[1], 'closed', 1)
return 1
