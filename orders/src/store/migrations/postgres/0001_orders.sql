-- The orders, the payments recorded against them, the events that could not become orders, and
-- the sweeper's fencing token. Times are Unix milliseconds; money is in minor units.

CREATE TABLE orders (
    id TEXT PRIMARY KEY NOT NULL,
    sku TEXT NOT NULL,
    user_id TEXT NOT NULL,
    qty BIGINT NOT NULL CHECK (qty > 0),
    node TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    stream_seq BIGINT NOT NULL CHECK (stream_seq >= 0),
    unit_price BIGINT NOT NULL CHECK (unit_price >= 0),
    currency TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('pending_payment', 'paid', 'expired', 'cancelled', 'paid_after_expiry')),
    created_at_ms BIGINT NOT NULL,
    pay_deadline_ms BIGINT NOT NULL,
    payment_ref TEXT,
    paid_at_ms BIGINT,
    expired_at_ms BIGINT,
    cancelled_at_ms BIGINT,
    released_at_ms BIGINT,
    updated_at_ms BIGINT NOT NULL,
    -- The sweeper fence that expired the order: which sweeper did it, for an audit.
    expire_fence BIGINT,
    -- A stream entry is one order, and so is a purchase's idempotency key: a redelivered or
    -- replayed event can never make a second order under a new id.
    UNIQUE (sku, stream_seq),
    UNIQUE (sku, idempotency_key)
);

-- The sweeper's scan: pending orders by deadline.
CREATE INDEX orders_due ON orders (pay_deadline_ms, id) WHERE state = 'pending_payment';

-- A buyer's orders, newest first.
CREATE INDEX orders_by_user ON orders (user_id, created_at_ms);

-- The releaser's scan: orders whose units must go back and did not yet.
CREATE INDEX orders_unreleased ON orders (updated_at_ms, id)
    WHERE released_at_ms IS NULL AND state IN ('expired', 'cancelled', 'paid_after_expiry');

CREATE TABLE payments (
    reference TEXT PRIMARY KEY NOT NULL,
    order_id TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    -- What the first notification did: paid, paid_after_expiry or already_paid. A repeated
    -- notification answers with it.
    outcome TEXT NOT NULL CHECK (outcome IN ('paid', 'paid_after_expiry', 'already_paid')),
    received_at_ms BIGINT NOT NULL
);

CREATE INDEX payments_by_order ON payments (order_id);

CREATE TABLE dead_letters (
    sku TEXT NOT NULL,
    stream_seq BIGINT NOT NULL,
    -- The entry's fields as a JSON array of [name, value] pairs, in stream order.
    fields TEXT NOT NULL,
    reason TEXT NOT NULL,
    deliveries BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    PRIMARY KEY (sku, stream_seq)
);

CREATE INDEX dead_letters_by_time ON dead_letters (at_ms);

-- One row: the highest fencing token any sweeper has presented. An expire with a lower one is
-- refused.
CREATE TABLE sweeper_fence (
    id SMALLINT PRIMARY KEY NOT NULL CHECK (id = 1),
    value BIGINT NOT NULL CHECK (value >= 0)
);

INSERT INTO sweeper_fence (id, value) VALUES (1, 0);
