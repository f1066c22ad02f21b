-- An order's identity is its order id alone. A purchase's idempotency key is forgotten by the
-- ledger after its TTL, and a key reused after that is a new sale with a new order id: it must
-- become its own order, not be skipped as a duplicate (which lost the order and its unit).
-- SQLite cannot drop a constraint, so the table is rebuilt without it (its indexes go with it).
-- The new column `release_refused` says why the ledger refused to release an order's units,
-- once it has: the order leaves the releaser's queue and waits for an operator.

CREATE TABLE orders_v2 (
    id TEXT PRIMARY KEY NOT NULL,
    sku TEXT NOT NULL,
    user_id TEXT NOT NULL,
    qty INTEGER NOT NULL CHECK (qty > 0),
    node TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    stream_seq INTEGER NOT NULL CHECK (stream_seq >= 0),
    unit_price INTEGER NOT NULL CHECK (unit_price >= 0),
    currency TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('pending_payment', 'paid', 'expired', 'cancelled', 'paid_after_expiry')),
    created_at_ms INTEGER NOT NULL,
    pay_deadline_ms INTEGER NOT NULL,
    payment_ref TEXT,
    paid_at_ms INTEGER,
    expired_at_ms INTEGER,
    cancelled_at_ms INTEGER,
    released_at_ms INTEGER,
    updated_at_ms INTEGER NOT NULL,
    expire_fence INTEGER,
    release_refused TEXT,
    -- A stream entry is one order: a redelivered event can never make a second one.
    UNIQUE (sku, stream_seq)
);

INSERT INTO orders_v2 (id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, currency, state,
    created_at_ms, pay_deadline_ms, payment_ref, paid_at_ms, expired_at_ms, cancelled_at_ms, released_at_ms,
    updated_at_ms, expire_fence)
SELECT id, sku, user_id, qty, node, idempotency_key, stream_seq, unit_price, currency, state,
    created_at_ms, pay_deadline_ms, payment_ref, paid_at_ms, expired_at_ms, cancelled_at_ms, released_at_ms,
    updated_at_ms, expire_fence
FROM orders;

DROP TABLE orders;
ALTER TABLE orders_v2 RENAME TO orders;

CREATE INDEX orders_due ON orders (pay_deadline_ms, id) WHERE state = 'pending_payment';
CREATE INDEX orders_by_user ON orders (user_id, created_at_ms);
CREATE INDEX orders_unreleased ON orders (pay_deadline_ms, id)
    WHERE released_at_ms IS NULL AND release_refused IS NULL
        AND state IN ('expired', 'cancelled', 'paid_after_expiry');
