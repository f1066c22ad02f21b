-- Ends a seller's epoch for one SKU and returns what it sold in it: from here on confirm.lua
-- refuses every batch of that node with an epoch at or below this one, so the count returned is
-- final and the coordinator can hand out the rest without the old epoch selling it again.
-- Idempotent: ending an epoch twice, or an older one after a newer, changes nothing.
--
-- KEYS[1] meta hash   KEYS[2] sold-by-node-epoch hash
-- ARGV[1] node   ARGV[2] epoch   ARGV[3] "node#epoch"

local meta, sold_by_epoch = KEYS[1], KEYS[2]
local node, epoch, seller = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local ended = redis.call('HMGET', meta, 'total', 'ended:' .. node)
if not ended[1] then
  return redis.error_reply('SECKILL_MISSING the ledger has no record of this SKU')
end
if not ended[2] or tonumber(ended[2]) < epoch then
  redis.call('HSET', meta, 'ended:' .. node, epoch)
end
return tonumber(redis.call('HGET', sold_by_epoch, seller) or '0')
