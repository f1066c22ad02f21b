-- An order's identity is its order id alone. A purchase's idempotency key is forgotten by the
-- ledger after its TTL, and a key reused after that is a new sale with a new order id: it must
-- become its own order, not be skipped as a duplicate (which lost the order and its unit).
ALTER TABLE orders DROP CONSTRAINT orders_sku_idempotency_key_key;

-- Why the ledger refused to release an order's units, once it has: the order leaves the
-- releaser's queue and waits for an operator (`seckill reconcile` lists it).
ALTER TABLE orders ADD COLUMN release_refused TEXT;

-- The releaser's scan, taken by deadline with a cursor, refused orders left out.
DROP INDEX orders_unreleased;
CREATE INDEX orders_unreleased ON orders (pay_deadline_ms, id)
    WHERE released_at_ms IS NULL AND release_refused IS NULL
        AND state IN ('expired', 'cancelled', 'paid_after_expiry');
