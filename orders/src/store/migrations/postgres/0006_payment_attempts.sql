-- The order's payment attempt at the provider: attempt 1 is known there by the order id, attempt
-- n > 1 by `<order id>~n`. A new attempt opens only when the provider holds the current one for
-- another amount or currency (a shop's checkout that got the price wrong): the buyer can still
-- pay, and the older attempts are closed, or refunded if they were paid.
ALTER TABLE orders ADD COLUMN payment_attempt INTEGER NOT NULL DEFAULT 1 CHECK (payment_attempt >= 1);
