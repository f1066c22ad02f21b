-- Payments as a lifecycle. An order whose payment the buyer started keeps a provider check due
-- (payment_check_at_ms): at its deadline the query job asks the provider what became of the
-- payment instead of expiring it blind, and after an expiry or a cancel it closes the payment
-- at the provider, so a success learned late is recorded (and refunded), never lost. The check
-- is over when payment_check_at_ms is NULL again.
ALTER TABLE orders ADD COLUMN payment_started_at_ms INTEGER;
ALTER TABLE orders ADD COLUMN payment_check_at_ms INTEGER;
ALTER TABLE orders ADD COLUMN payment_checks INTEGER NOT NULL DEFAULT 0;
CREATE INDEX orders_payment_checks ON orders (payment_check_at_ms) WHERE payment_check_at_ms IS NOT NULL;

-- How the order service learned of a payment: the provider's callback, or its own query.
ALTER TABLE payments ADD COLUMN source TEXT NOT NULL DEFAULT 'callback' CHECK (source IN ('callback', 'query'));
-- The refund job's retries: attempts so far and when the next one is due (NULL: now).
ALTER TABLE payments ADD COLUMN refund_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN refund_at_ms INTEGER;
