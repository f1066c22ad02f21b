//! Submit tokens (anti-duplicate submission): `POST /v1/tokens` hands a buyer a one-time token
//! for one purchase of one SKU, and a SKU that requires tokens sells only to a purchase that
//! brings one.
//!
//! The ledger issues, stores and spends tokens (`SalesLedger::issue_token`, `confirm.lua`), one live
//! token per buyer and SKU (asked again, it returns the one the buyer holds); the node adds no
//! state of its own. It turns away from memory what could never use a token (an unknown,
//! ended or sold-out SKU, one that sells without tokens, a sale that has not started) and passes
//! every request through the same admission gate as a purchase (blacklist, per-user and
//! per-address limits, lock-out), then the gate's limit of tokens per address (on by default:
//! a user id costs nothing to invent, so per-user limits alone let one address take every token
//! of a window), then the fleet-wide limit, so tokens cost a ledger write only for a caller who
//! could buy now. The ledger caps tokens per SKU and TTL window, which bounds
//! their memory (`ledger::TOKEN_ISSUE_MAX_DEFAULT`); past the cap the answer is 429.

use std::net::IpAddr;
use std::time::Duration;

use ledger::{LedgerError, SkuId, SubmitToken, UserId};

use crate::gate::Caller;
use crate::outcome::Outcome;
use crate::pipeline::Node;

/// A token request whose ids passed validation (`SkuId::validate`, `UserId::validate`).
#[derive(Debug, Clone, Copy)]
pub struct TokenRequest<'a> {
    pub sku: &'a str,
    pub user: &'a str,
    pub ip: IpAddr,
}

/// How a token request ended.
fn caller<'a>(request: &TokenRequest<'a>) -> Caller<'a> {
    Caller { sku: request.sku, user: request.user, ip: request.ip }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOutcome {
    Issued {
        token: SubmitToken,
        sku: SkuId,
        user: UserId,
        /// How long the token stays usable from now: less than the SKU's TTL when the buyer
        /// already held it.
        ttl: Duration,
    },
    /// Refused for the reason a purchase would be, so the status mapping stays in one place.
    Refused(Outcome),
}

impl Node {
    /// Issues a submit token for `request.user` on `request.sku`. Never panics on bad input;
    /// every failure is a [`TokenOutcome::Refused`], counted by its code.
    pub async fn issue_token(&self, request: TokenRequest<'_>) -> TokenOutcome {
        let outcome = self.decide_token(request).await;
        match &outcome {
            TokenOutcome::Issued { .. } => self.metrics().count_token_issued(),
            TokenOutcome::Refused(refusal) => {
                self.metrics().count_token_refused(refusal.code());
                // Token floods count towards auto-bans as purchase floods do.
                if matches!(refusal, Outcome::RateLimited { .. }) {
                    self.gate().observe_abuse(caller(&request));
                }
            }
        }
        outcome
    }

    /// A striped SKU's token is issued on the buyer's stripe, the ledger its purchase goes to.
    async fn decide_token(&self, request: TokenRequest<'_>) -> TokenOutcome {
        let refuse = TokenOutcome::Refused;
        let Some(parent) = self.buyer_sku(request.sku) else { return refuse(Outcome::UnknownSku) };
        let Some(sku) = crate::stripes::buyer_stripe(&parent, request.user) else {
            return refuse(Outcome::Unavailable {
                reason: "this node has not taken in every stripe of this SKU yet; retry",
            });
        };
        let config = sku.config();
        // A room's tickets are its only tokens: one from here would skip the line.
        if config.terms.waiting_room.is_some() {
            return refuse(Outcome::NoTicket);
        }
        if !config.terms.require_token {
            return refuse(Outcome::BadRequest { reason: "this SKU sells without submit tokens; buy directly" });
        }
        // Only inside the sale window: a token hoarded before the start would let a script queue
        // thousands of ledger keys ahead of the buyers.
        let now = self.clock().now_unix_ms();
        if config.terms.starts_at_ms.is_some_and(|start| now < start) {
            return refuse(Outcome::NotStarted);
        }
        if config.terms.ends_at_ms.is_some_and(|end| now >= end) || sku.is_closed() {
            return refuse(Outcome::Ended);
        }
        if sku.is_sold_out() {
            let striped = parent.stripe_count() > 1 && self.stripe_reader().others_may_sell(&parent, sku);
            return refuse(if striped {
                Outcome::StripeEmpty { key_spent: false }
            } else {
                Outcome::SoldOut { replayed: false }
            });
        }
        if let Some(refused) = self.refused_by_gate(self.gate().admit(caller(&request))) {
            return refuse(refused);
        }
        if let Some(refused) = self.refused_by_gate(self.gate().admit_token(caller(&request))) {
            return refuse(refused);
        }
        if let Some(check) = self.gate().admit_fleet_wide(caller(&request)) {
            if let Some(refused) = self.refused_by_gate(check.await) {
                return refuse(refused);
            }
        }
        let Ok(user) = UserId::new(request.user) else {
            return refuse(Outcome::BadRequest { reason: "the user is not a valid id" });
        };
        let sku_id = config.sku.clone();
        match self.ledger().issue_token(&sku_id, &user, config.terms.token_ttl()).await {
            Ok(issued) => {
                TokenOutcome::Issued { token: issued.token, sku: parent.id().clone(), user, ttl: issued.expires_in }
            }
            Err(LedgerError::TokensExhausted { retry_after_ms }) => {
                tracing::debug!(sku = %sku_id, "the SKU's submit tokens for this window are all issued");
                refuse(Outcome::RateLimited { retry_after: Duration::from_millis(retry_after_ms) })
            }
            Err(e) => {
                tracing::warn!(sku = %sku_id, "issuing a submit token failed: {e}");
                refuse(Outcome::from_ledger_error(&e))
            }
        }
    }
}
