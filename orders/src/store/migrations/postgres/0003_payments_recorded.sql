-- Every validly signed payment notification is recorded, whatever it says. A payment for an
-- order the consumer has not stored yet waits for it ('awaiting_order'); one that cannot settle
-- its order (a wrong amount or currency, after expiry, a second payment) owes the buyer a
-- refund, which the refund job takes from 'owed' through 'pending' to 'refunded'.
ALTER TABLE payments DROP CONSTRAINT payments_outcome_check;
ALTER TABLE payments ADD CONSTRAINT payments_outcome_check
    CHECK (outcome IN ('paid', 'paid_after_expiry', 'already_paid', 'mismatch', 'awaiting_order'));
ALTER TABLE payments ADD COLUMN refund TEXT CHECK (refund IN ('owed', 'pending', 'refunded'));
ALTER TABLE payments ADD COLUMN refund_reason TEXT;
ALTER TABLE payments ADD COLUMN refunded_at_ms BIGINT;

UPDATE payments SET refund = 'owed', refund_reason = 'paid after the order expired or was cancelled'
    WHERE outcome = 'paid_after_expiry';
UPDATE payments SET refund = 'owed', refund_reason = 'the order was already paid'
    WHERE outcome = 'already_paid';

CREATE INDEX payments_awaiting ON payments (received_at_ms) WHERE outcome = 'awaiting_order';
CREATE INDEX payments_refunds ON payments (received_at_ms) WHERE refund IN ('owed', 'pending');

-- The sweeper does not expire an order a payment is waiting for.
CREATE INDEX payments_awaiting_by_order ON payments (order_id) WHERE outcome = 'awaiting_order';
