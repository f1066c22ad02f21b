//! `[payments]`: the payment provider the order service starts payments with, and the
//! lifecycle's clocks — the grace a started payment adds to its order's deadline, and how long
//! an unknown payment is asked about before the order expires anyway.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// Longest `pay_grace_s`: an hour past the pay timeout is already a different sale.
pub const PAY_GRACE_MAX_S: u64 = 3600;
/// Longest `query_limit_s`: a day of asking a provider that does not know is an outage to fix,
/// not a payment to wait for.
pub const QUERY_LIMIT_MAX_S: u64 = 86_400;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaymentsSection {
    /// `none` (the default: no pay route, payments only notified) or `sandbox` (`seckill
    /// paysim`, which `seckill fleet up` starts at `url` when it is on loopback).
    pub provider: String,
    /// The provider's API, `http://host:port`.
    pub url: Option<String>,
    /// Where the provider notifies the order service; default
    /// `http://<[orders] listen>/v1/payments/callback`.
    pub callback_url: Option<String>,
    /// Added once to an order's deadline when its payment starts.
    pub pay_grace_s: u64,
    /// After the deadline, how long an unknown payment is asked about before the order expires.
    pub query_limit_s: u64,
}

impl Default for PaymentsSection {
    fn default() -> Self {
        let settings = orders::payments::PaymentSettings::default();
        Self {
            provider: "none".into(),
            url: None,
            callback_url: None,
            pay_grace_s: settings.pay_grace.as_secs(),
            query_limit_s: settings.query_limit.as_secs(),
        }
    }
}

impl PaymentsSection {
    pub fn enabled(&self) -> bool {
        self.provider != "none"
    }

    /// The longest an order can stay unreleased past its pay timeout by the lifecycle's doing:
    /// the grace, then the queries.
    pub fn deadline_stretch_s(&self) -> u64 {
        if self.enabled() {
            self.pay_grace_s.saturating_add(self.query_limit_s)
        } else {
            0
        }
    }

    pub fn validate(&self, orders_at: Option<&str>) -> Result<(), ConfigError> {
        match self.provider.as_str() {
            "none" => return Ok(()),
            "sandbox" => {}
            other => return Err(invalid("payments.provider", format!("is \"none\" or \"sandbox\", not {other:?}"))),
        }
        let url = self.url.as_deref().ok_or_else(|| invalid("payments.url", "names the sandbox: http://host:port"))?;
        orders::provider::SandboxProvider::new(url).map_err(|e| invalid("payments.url", e.to_string()))?;
        if self.callback_url.is_none() && orders_at.is_none() {
            return Err(invalid(
                "payments.callback_url",
                "is needed when [orders] listen is not set: where does the provider notify payments?",
            ));
        }
        if let Some(callback) = &self.callback_url {
            if !(callback.starts_with("http://") || callback.starts_with("https://")) {
                return Err(invalid("payments.callback_url", "is an http:// or https:// URL"));
            }
        }
        if self.pay_grace_s > PAY_GRACE_MAX_S {
            return Err(invalid("payments.pay_grace_s", format!("is at most {PAY_GRACE_MAX_S}")));
        }
        if !(1..=QUERY_LIMIT_MAX_S).contains(&self.query_limit_s) {
            return Err(invalid("payments.query_limit_s", format!("is from 1 to {QUERY_LIMIT_MAX_S}")));
        }
        Ok(())
    }

    /// The order service's provider and settings; `None` for `provider = "none"`.
    /// `orders_at`: where the provider reaches the order API (`OrdersSection::reached_at`).
    pub fn payments(&self, orders_at: Option<&str>) -> Result<Option<orders::payments::Payments>, ConfigError> {
        if !self.enabled() {
            return Ok(None);
        }
        self.validate(orders_at)?;
        let url = self.url.as_deref().unwrap_or_default();
        let provider =
            orders::provider::SandboxProvider::new(url).map_err(|e| invalid("payments.url", e.to_string()))?;
        let callback_url = match (&self.callback_url, orders_at) {
            (Some(url), _) => url.clone(),
            (None, Some(orders)) => format!("http://{orders}/v1/payments/callback"),
            (None, None) => return Err(invalid("payments.callback_url", "is needed without [orders] listen")),
        };
        Ok(Some(orders::payments::Payments {
            provider: Arc::new(provider),
            callback_url,
            settings: orders::payments::PaymentSettings {
                pay_grace: Duration::from_secs(self.pay_grace_s),
                query_limit: Duration::from_secs(self.query_limit_s),
                ..orders::payments::PaymentSettings::default()
            },
        }))
    }
}
