-- The payment the provider opened for an order when its buyer pressed pay: a second press while
-- the provider is unreachable answers this one, with its pay URL, instead of an error.
CREATE TABLE payment_starts (
    order_id      TEXT PRIMARY KEY NOT NULL REFERENCES orders (id),
    payment_id    TEXT NOT NULL,
    pay_url       TEXT NOT NULL,
    amount        INTEGER NOT NULL CHECK (amount > 0),
    currency      TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
