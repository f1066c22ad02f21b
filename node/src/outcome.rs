//! The outcome vocabulary: every way a purchase (or a token request) can end, and the code each
//! is counted and reported under. The pipeline decides an [`Outcome`]; `http.rs` maps it to a
//! status code and body in one place; the metrics count it by [`Code`].
//!
//! This module imports nothing else from the crate, so every other module can depend on it
//! without a circle. Business refusals (sold out, user limit, rate limited) are values here, not
//! errors: they are the normal answers of a sale.

use std::time::Duration;

use ledger::{Decision, LedgerError, Receipt, SkuId, Verdict};

/// Every way a purchase can end; each maps to one HTTP status and error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Purchased {
        sku: SkuId,
        receipt: Receipt,
        replayed: bool,
    },
    SoldOut {
        replayed: bool,
    },
    UserLimit {
        replayed: bool,
    },
    /// The same key is being confirmed by this node right now.
    InProgress,
    KeyReused,
    NotStarted,
    Ended,
    Blocked,
    RateLimited {
        retry_after: Duration,
    },
    UnknownSku,
    /// Nothing was decided; retry with the same key.
    Unavailable {
        reason: &'static str,
    },
    /// The ledger's circuit breaker is open (`breaker.rs`): nothing was decided and the unit went
    /// back to the allotment; retry after `retry_after` with the same key.
    LedgerBreakerOpen {
        retry_after: Duration,
    },
    /// The buyer's stripe of a striped SKU has nothing left while another stripe still has
    /// units (or units are moving between stripes): the coordinator moves unsold units to where
    /// the buyers are, so a retry may sell. `key_spent`: the ledger decided this key sold out on
    /// its stripe and stored that, so the retry needs a new key.
    StripeEmpty {
        key_spent: bool,
    },
    /// The request broke a rule the SKU sets (qty above the per-order max).
    BadRequest {
        reason: &'static str,
    },
    /// The SKU requires a submit token and the request brought none; decided from memory.
    TokenRequired,
    /// The SKU sells through its waiting room and the request brought no valid ticket (none,
    /// forged, expired or another buyer's); decided from memory.
    NoTicket,
    /// The ledger found no live submit token of this user for this SKU under the request's.
    TokenInvalid {
        replayed: bool,
    },
    /// `[auth]` is on and the request's credential proved no buyer: missing, malformed,
    /// forged, expired. Nothing was decided.
    Unauthenticated,
    /// The body names a user other than the one the credential proves.
    UserMismatch,
}

/// Machine-readable outcome codes: the `error` field of error bodies and the `outcome` label of
/// the request counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Purchased,
    Replayed,
    SoldOut,
    UserLimit,
    InProgress,
    KeyReused,
    NotStarted,
    Ended,
    Blocked,
    RateLimited,
    UnknownSku,
    Unavailable,
    BadRequest,
    TokenRequired,
    TokenInvalid,
    Unauthenticated,
    UserMismatch,
    StripeEmpty,
    NoTicket,
}

impl Code {
    pub const ALL: [Code; 19] = [
        Code::Purchased,
        Code::Replayed,
        Code::SoldOut,
        Code::UserLimit,
        Code::InProgress,
        Code::KeyReused,
        Code::NotStarted,
        Code::Ended,
        Code::Blocked,
        Code::RateLimited,
        Code::UnknownSku,
        Code::Unavailable,
        Code::BadRequest,
        Code::TokenRequired,
        Code::TokenInvalid,
        Code::Unauthenticated,
        Code::UserMismatch,
        Code::StripeEmpty,
        Code::NoTicket,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::Purchased => "purchased",
            Code::Replayed => "replayed",
            Code::SoldOut => "sold_out",
            Code::UserLimit => "user_limit",
            Code::InProgress => "in_progress",
            Code::KeyReused => "key_reused",
            Code::NotStarted => "not_started",
            Code::Ended => "ended",
            Code::Blocked => "blocked",
            Code::RateLimited => "rate_limited",
            Code::UnknownSku => "unknown_sku",
            Code::Unavailable => "unavailable",
            Code::BadRequest => "bad_request",
            Code::TokenRequired => "token_required",
            Code::TokenInvalid => "token_invalid",
            Code::Unauthenticated => "unauthenticated",
            Code::UserMismatch => "user_mismatch",
            Code::StripeEmpty => "stripe_empty",
            Code::NoTicket => "no_ticket",
        }
    }
}

impl Outcome {
    pub fn code(&self) -> Code {
        match self {
            Outcome::Purchased { replayed: false, .. } => Code::Purchased,
            Outcome::Purchased { replayed: true, .. } => Code::Replayed,
            Outcome::SoldOut { .. } => Code::SoldOut,
            Outcome::UserLimit { .. } => Code::UserLimit,
            Outcome::InProgress => Code::InProgress,
            Outcome::KeyReused => Code::KeyReused,
            Outcome::NotStarted => Code::NotStarted,
            Outcome::Ended => Code::Ended,
            Outcome::Blocked => Code::Blocked,
            Outcome::RateLimited { .. } => Code::RateLimited,
            Outcome::UnknownSku => Code::UnknownSku,
            Outcome::Unavailable { .. } | Outcome::LedgerBreakerOpen { .. } => Code::Unavailable,
            Outcome::BadRequest { .. } => Code::BadRequest,
            Outcome::TokenRequired => Code::TokenRequired,
            Outcome::TokenInvalid { .. } => Code::TokenInvalid,
            Outcome::Unauthenticated => Code::Unauthenticated,
            Outcome::UserMismatch => Code::UserMismatch,
            Outcome::StripeEmpty { .. } => Code::StripeEmpty,
            Outcome::NoTicket => Code::NoTicket,
        }
    }

    /// The outcome of a ledger verdict on a purchase of `sku`.
    pub(crate) fn from_verdict(sku: &SkuId, verdict: Verdict) -> Outcome {
        let (decision, replayed) = match verdict {
            Verdict::Fresh(decision) => (decision, false),
            Verdict::Replayed(decision) => (decision, true),
            Verdict::KeyReused => return Outcome::KeyReused,
        };
        match decision {
            Decision::Purchased(receipt) => Outcome::Purchased { sku: sku.clone(), receipt, replayed },
            Decision::SoldOut => Outcome::SoldOut { replayed },
            Decision::UserLimit => Outcome::UserLimit { replayed },
            Decision::Ended => Outcome::Ended,
            Decision::TokenInvalid => Outcome::TokenInvalid { replayed },
        }
    }

    /// A ledger call that decided nothing: 503, and the client retries with the same key.
    pub(crate) fn from_ledger_error(error: &LedgerError) -> Outcome {
        Outcome::Unavailable {
            reason: match error {
                LedgerError::Missing(_) => "the ledger has no record of this SKU; sales are suspended",
                LedgerError::Unavailable(_) => "the ledger did not answer; retry with the same Idempotency-Key",
                LedgerError::NotReplicated { .. } => {
                    "the ledger stored the decision but its replicas have not confirmed it yet; retry with the same Idempotency-Key"
                }
                LedgerError::Misconfigured(_) => "the ledger's Redis is misconfigured; sales are suspended",
                LedgerError::Corrupt(_) => "the ledger failed a consistency check; sales are suspended",
                LedgerError::EpochEnded(_) => {
                    "this node's lease ended; retry on another node with the same Idempotency-Key"
                }
                // Only token issuance meets it (`tokens.rs` answers 429 for it); a purchase never.
                LedgerError::TokensExhausted { .. } => "the SKU issued its submit tokens for now; retry later",
            },
        }
    }
}
