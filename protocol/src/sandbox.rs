//! The sandbox payment provider's wire format: the JSON bodies of its API and of the signed
//! notification it posts back. The order service's client (`orders::provider::SandboxProvider`)
//! writes them and the sandbox (`paysim`) reads them, from this one definition, so neither needs
//! the other's crate and the two cannot drift apart.

use serde::{Deserialize, Serialize};

/// The header a payment notification's signature travels in (`t=<unix s>,v1=<hex HMAC>`, see
/// the order service's `signature` module, which checks it).
pub const SIGNATURE_HEADER: &str = "seckill-signature";

/// `POST /v1/payments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateBody {
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    pub callback_url: String,
}

/// A payment, as every payment route answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentBody {
    pub id: String,
    pub order_id: String,
    pub amount: u64,
    pub currency: String,
    pub status: Status,
    /// Why it failed, for `status: "failed"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub pay_url: String,
    pub created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pending,
    Succeeded,
    Failed,
}

/// `POST /v1/payments/{id}/pay`: what the buyer did at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayBody {
    pub outcome: PayOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayOutcome {
    Succeed,
    Decline,
}

/// `POST /v1/payments/close`: the merchant closes the order's payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseBody {
    pub order_id: String,
}

/// `GET /v1/settlements`: every payment and refund the sandbox holds, for audits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlements {
    pub payments: Vec<PaymentBody>,
    pub refunds: Vec<RefundAnswer>,
}

/// `POST /v1/refunds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundBody {
    pub refund_id: String,
    pub reference: String,
    pub amount: u64,
    pub currency: String,
}

/// A refund, as `POST /v1/refunds` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundAnswer {
    pub refund_id: String,
    pub reference: String,
    pub amount: u64,
    pub currency: String,
    pub status: RefundState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundState {
    Succeeded,
    Pending,
    Failed,
}

/// The signed notification the sandbox posts to a payment's `callback_url`: exactly the
/// body the order service's `POST /v1/payments/callback` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackBody {
    pub order_id: String,
    pub reference: String,
    pub amount: u64,
    pub currency: String,
}

/// Every refusal: `{"error": "<code>", "message": "<text>"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default)]
    pub message: String,
}

/// The `error` of a 404 that means "no payment for that order", as opposed to a path the
/// server does not know.
pub const NO_PAYMENT: &str = "no_payment";

/// The `error` of a 409 to a create whose order id holds a payment of another amount or
/// currency.
pub const ORDER_ID_REUSED: &str = "order_id_reused";

pub use crate::percent::{percent_decode, percent_encode};
