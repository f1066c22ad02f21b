-- Every validly signed payment notification is recorded, whatever it says. A payment for an
-- order the consumer has not stored yet waits for it ('awaiting_order'); one that cannot settle
-- its order (a wrong amount or currency, after expiry, a second payment) owes the buyer a
-- refund, which the refund job takes from 'owed' through 'pending' to 'refunded'. SQLite cannot
-- change a CHECK, so the table is rebuilt.

CREATE TABLE payments_v3 (
    reference TEXT PRIMARY KEY NOT NULL,
    order_id TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    outcome TEXT NOT NULL
        CHECK (outcome IN ('paid', 'paid_after_expiry', 'already_paid', 'mismatch', 'awaiting_order')),
    received_at_ms INTEGER NOT NULL,
    refund TEXT CHECK (refund IN ('owed', 'pending', 'refunded')),
    refund_reason TEXT,
    refunded_at_ms INTEGER
);

INSERT INTO payments_v3 (reference, order_id, amount, currency, outcome, received_at_ms, refund, refund_reason)
SELECT reference, order_id, amount, currency, outcome, received_at_ms,
    CASE WHEN outcome IN ('paid_after_expiry', 'already_paid') THEN 'owed' END,
    CASE outcome
        WHEN 'paid_after_expiry' THEN 'paid after the order expired or was cancelled'
        WHEN 'already_paid' THEN 'the order was already paid'
    END
FROM payments;

DROP TABLE payments;
ALTER TABLE payments_v3 RENAME TO payments;

CREATE INDEX payments_by_order ON payments (order_id);
CREATE INDEX payments_awaiting ON payments (received_at_ms) WHERE outcome = 'awaiting_order';
CREATE INDEX payments_refunds ON payments (received_at_ms) WHERE refund IN ('owed', 'pending');
