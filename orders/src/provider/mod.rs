//! What the order service asks of a payment provider: start a payment for an order, ask what
//! became of it, and give money back. [`PaymentProvider`] is the whole contract; the one
//! provider shipped is [`SandboxProvider`], the client of `seckill paysim` (docs/payments.md).
//!
//! **Three results, never a guess.** A trade ends in success, failure, or *unknown*. Success and
//! failure are answers ([`PaymentStatus`], [`RefundStatus`]); unknown is an error,
//! [`ProviderError::Unavailable`] (a timeout, a 5xx, an answer that cannot be read): the caller
//! asks again later, with the same order id or refund id, and must not decide anything from it.
//! [`ProviderError::Refused`] is final: the provider understood and said no, so asking again
//! with the same request gets the same no.
//!
//! **Idempotency.** `create` is idempotent by order id (one payment per order at the provider,
//! however often the buyer presses "pay"), `refund` by refund id (a retry after an unknown answer
//! cannot refund twice), `close` by order id. `query` only reads. The "order id" the provider
//! sees is the payment attempt's reference (`crate::payments::attempts`): the order id itself,
//! unless a payment for another amount already held it.
//!
//! **Closing.** An order that expires or is cancelled while its payment is open has it closed
//! at the provider, so the buyer cannot pay an order that no longer holds a unit; a payment that
//! succeeded first is what `close` answers, and is recorded and refunded.
//!
//! **Notifications are not part of the trait.** A provider tells the order service about a
//! payment by calling `callback_url`; the order service's `POST /v1/payments/callback` checks it
//! (`crate::signature`) and records it. A provider whose notifications look different (another
//! signature, another body) needs an adapter in front of that route that verifies the
//! provider's own signature and records the same `Payment`; `query` is how a lost notification
//! is found.
//!
//! # Real providers behind the trait
//!
//! Money crosses as an integer of the currency's minor unit and an ISO 4217 code in capitals;
//! each adapter converts to its provider's form. A 5xx, a rate limit, a network failure or a
//! "system error" code is `Unavailable`; a validation or business refusal is `Refused`.
//!
//! **Stripe (PaymentIntents and webhooks).** `create`: `POST /v1/payment_intents` with
//! `amount`, `currency` (lowercase), `metadata[order_id]` and `Idempotency-Key: <order id>`; the
//! intent's `client_secret` (for Stripe.js) or a Checkout Session's `url` is the `pay_url`, its
//! `pi_…` id the payment id. Notification: the `payment_intent.succeeded` webhook, signed
//! `Stripe-Signature: t=…,v1=<HMAC-SHA256>` (the scheme `crate::signature` uses, under Stripe's
//! endpoint secret); reference = the intent id. `query`: retrieve the intent (its id kept at
//! create, or search by `metadata['order_id']`): `succeeded` → `Succeeded` with
//! `amount_received`; `canceled`, or `requires_payment_method` after a failed attempt →
//! `Failed` with `last_payment_error`; `processing`, `requires_action`,
//! `requires_confirmation` → `Pending`; none → `NotFound`. `close`: cancel the intent (`POST
//! /v1/payment_intents/{id}/cancel`); "already succeeded" → retrieve it → `Succeeded`. `refund`: `POST /v1/refunds` with
//! `payment_intent`, `amount` and `Idempotency-Key: <refund id>`; `succeeded` / `pending` or
//! `requires_action` / `failed` or `canceled` map one to one.
//!
//! **Alipay (trade.precreate / query / refund).** `create`: `alipay.trade.precreate` with
//! `out_trade_no` = the order id, `total_amount` in yuan as a decimal string, `notify_url` =
//! `callback_url`; its `qr_code` is the `pay_url`. Notification: the asynchronous notify
//! (form-encoded, RSA2-signed with Alipay's key; answer the text `success`), reference =
//! `trade_no`, for `trade_status` `TRADE_SUCCESS` or `TRADE_FINISHED`. `query`:
//! `alipay.trade.query` by `out_trade_no`: `TRADE_SUCCESS` / `TRADE_FINISHED` → `Succeeded`,
//! `TRADE_CLOSED` → `Failed`, `WAIT_BUYER_PAY` → `Pending`, `ACQ.TRADE_NOT_EXIST` → `NotFound`
//! (a precreated trade does not exist there until the buyer scans the code, so `NotFound` after
//! a create means "not paid yet", not "failed"). `close`: `alipay.trade.close` by `out_trade_no`
//! (`ACQ.TRADE_STATUS_ERROR` for a paid trade → query → `Succeeded`). `refund`:
//! `alipay.trade.refund` with
//! `out_request_no` = the refund id; `fund_change = Y` → `Succeeded`, otherwise `Pending` until
//! `alipay.trade.fastpay.refund.query` says it is done. Gateway code `20000` and
//! `ACQ.SYSTEM_ERROR` are `Unavailable`; other `40004` business codes `Refused`.
//!
//! **WeChat Pay (API v3).** `create`: `POST /v3/pay/transactions/native` with `out_trade_no` =
//! the order id, `amount.total` in fen, `notify_url` = `callback_url`; its `code_url` is the
//! `pay_url` (JSAPI returns a `prepay_id` for the page instead). Notification: signed with the
//! platform certificate (`Wechatpay-Signature`), its `resource` encrypted with the APIv3 key
//! (AEAD_AES_256_GCM); reference = `transaction_id`. `query`: `GET
//! /v3/pay/transactions/out-trade-no/{order id}`: `SUCCESS` → `Succeeded`, `CLOSED`,
//! `REVOKED`, `PAYERROR` → `Failed`, `NOTPAY`, `USERPAYING` → `Pending`, `ORDER_NOT_EXIST` →
//! `NotFound`. `close`: `POST /v3/pay/transactions/out-trade-no/{order id}/close` (`ORDERPAID`
//! → query → `Succeeded`). `refund`: `POST /v3/refund/domestic/refunds` with `out_refund_no` = the refund
//! id: `SUCCESS` / `PROCESSING` / `ABNORMAL` or `CLOSED`. `SYSTEM_ERROR` and
//! `FREQUENCY_LIMITED` are `Unavailable`; `PARAM_ERROR`, `NOT_ENOUGH` and the like `Refused`.

mod sandbox;

pub use sandbox::{wire, SandboxProvider};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A payment provider, as the order service uses it. Every method may be called again with the
/// same arguments after any error; see the module's documentation for what each result means.
#[async_trait]
pub trait PaymentProvider: Send + Sync {
    /// Starts the payment of one order, or returns the one already started for it.
    async fn create(&self, payment: &CreatePayment) -> Result<ProviderPayment, ProviderError>;

    /// What became of the order's payment.
    async fn query(&self, order_id: &str) -> Result<PaymentStatus, ProviderError>;

    /// Closes the order's payment so it can no longer succeed (the order expired or was
    /// cancelled), answering what it ends as: `Failed` (closed now or before), `Succeeded` (the
    /// buyer paid first: the money must go back) or `NotFound` (none was started). Never
    /// `Pending`.
    async fn close(&self, order_id: &str) -> Result<PaymentStatus, ProviderError>;

    /// Gives (part of) a payment back, once per `refund_id`.
    async fn refund(&self, refund: &RefundRequest) -> Result<RefundStatus, ProviderError>;

    /// The provider's books for payments created in `[from_ms, to_ms)` (Unix ms) and the
    /// refunds of those payments: the settlement report every provider offers its merchants,
    /// which `seckill reconcile` holds the store against.
    async fn settlements(&self, from_ms: u64, to_ms: u64) -> Result<SettlementReport, ProviderError>;
}

/// What the provider's books hold for a time window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlementReport {
    pub payments: Vec<SettledPayment>,
    pub refunds: Vec<SettledRefund>,
}

/// A payment in the provider's books.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettledPayment {
    /// The provider's id: the reference its notification carries.
    pub reference: String,
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    /// The provider holds the buyer's money.
    pub succeeded: bool,
    /// When it succeeded, else when it was created (Unix ms).
    pub at_ms: u64,
}

/// A refund in the provider's books.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettledRefund {
    pub refund_id: String,
    /// The payment it gives back from.
    pub reference: String,
    pub amount: u64,
    pub currency: String,
    /// The money went back.
    pub succeeded: bool,
}

/// A payment to start: `amount` in the currency's minor unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePayment {
    /// The payment attempt's reference (`crate::payments::attempts`): the order id, unless the
    /// provider held it for another amount.
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    /// Where the provider notifies the order service (its `POST /v1/payments/callback`).
    pub callback_url: String,
}

/// A payment as the provider keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderPayment {
    /// The provider's id of the payment: the reference its notification carries.
    pub id: String,
    pub order_id: String,
    /// Where it stands now; `Pending` for a payment just started, but a repeated `create` for an
    /// order already paid or declined says so.
    pub status: PaymentStatus,
    /// Where the buyer goes to pay, when the provider has such a page.
    pub pay_url: Option<String>,
}

/// What became of an order's payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PaymentStatus {
    /// The provider holds the buyer's money: `reference` is the payment's id, and `amount` and
    /// `currency` what was actually taken (which may differ from what the order asks).
    Succeeded { reference: String, amount: u64, currency: String },
    /// It will never succeed (declined, cancelled, closed).
    Failed { reason: String },
    /// Started, not finished: the buyer may still pay.
    Pending,
    /// The provider knows no payment for this order.
    NotFound,
}

/// Money to give back from the payment `reference`, once per `refund_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    pub refund_id: String,
    pub reference: String,
    pub amount: u64,
    pub currency: String,
}

/// Where a refund stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RefundStatus {
    /// The money is on its way back; nothing more to do.
    Succeeded,
    /// Accepted, not done: ask again with the same refund id.
    Pending,
    /// The provider could not pay it back (e.g. the buyer's account is closed): an operator's.
    Failed { reason: String },
}

/// Why a call brought no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The outcome is unknown (unreachable, timed out, 5xx, an unreadable answer): ask again
    /// later with the same request; never read it as success or failure.
    #[error("payment provider unavailable: {0}")]
    Unavailable(String),
    /// The provider understood and said no; the same request will be refused again.
    #[error("payment provider refused: {0}")]
    Refused(String),
    /// `create` only: the provider already holds a payment under this reference for another
    /// amount or currency (the sandbox's `order_id_reused`), so the order's payment needs a
    /// new attempt (`crate::payments::attempts`).
    #[error("payment provider holds another payment under this reference: {0}")]
    ReferenceTaken(String),
}
