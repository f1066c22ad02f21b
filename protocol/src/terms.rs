//! The terms a SKU is sold on: one type, read from `cluster.toml` and from the admin API alike,
//! checked by one [`SkuTerms::validate`], carried in the coordinator's log and in every
//! assignment a node receives, and handed to the ledger when it creates the SKU.
//!
//! Adding a term means adding a field here (with a serde default, so older logs still read),
//! a rule in `validate` if it has one, and the code that uses it: nothing else converts terms.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::room::RoomRules;

/// Largest total a SKU may have: the ledger's Lua scripts count in doubles, exact up to 2^53.
pub const TOTAL_MAX: u64 = (1 << 53) - 1;

/// How long a submit token stays usable, unless configured otherwise: long enough to fill in a
/// checkout page, short enough that hoarded tokens go stale before the sale ends.
pub const TOKEN_TTL_DEFAULT: Duration = Duration::from_secs(300);

/// Longest a submit token may live: an unspent token holds a little ledger memory until it
/// expires, and a day outlives any flash sale.
pub const TOKEN_TTL_MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// Most stripes one SKU may be split into (see [`crate::stripes`]): past a few dozen masters a
/// SKU gains nothing, and every stripe is a ledger to create, watch and move stock between.
pub const STRIPES_MAX: u32 = 64;

/// Larger buffers than 10× the share only add ledger load; they cannot add sales.
pub const BUFFER_PERCENT_MAX: u32 = 1000;

/// What one SKU is sold on. Field names on the wire and in the raft log are fixed (older logs
/// and nodes read them); `starts_at`/`ends_at` are accepted as aliases of the `_ms` fields and
/// take a TOML date-time, an RFC 3339 string or Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkuTerms {
    /// Units on sale. After creation the ledger's own figure is the one that counts; this one
    /// follows restocks.
    pub total: u64,
    /// Units one user may buy over the whole sale; 0 = no limit.
    #[serde(default)]
    pub per_user_limit: u32,
    /// Most units in one order.
    #[serde(default = "qty_max_default")]
    pub qty_max: u32,
    /// Sale window in Unix ms: closed before the start, closed from the end on.
    #[serde(default, alias = "starts_at", deserialize_with = "sale_time::optional")]
    pub starts_at_ms: Option<u64>,
    #[serde(default, alias = "ends_at", deserialize_with = "sale_time::optional")]
    pub ends_at_ms: Option<u64>,
    /// Units the live nodes hold beyond the ledger's remaining count, so the fleet keeps
    /// selling at full speed while a dead node's allotment waits for reallocation.
    #[serde(default)]
    pub buffer: Buffer,
    /// Closed by an operator: nodes stop selling it (the ledger already refuses).
    #[serde(default)]
    pub closed: bool,
    /// Purchases must present a submit token; the ledger enforces it, nodes refuse a purchase
    /// without one from memory.
    #[serde(default)]
    pub require_token: bool,
    /// How long a submit token issued for this SKU stays usable, in seconds.
    #[serde(default = "token_ttl_s_default")]
    pub token_ttl_s: u64,
    /// Price of one unit in the currency's minor unit (cents): integers, so amounts are exact.
    /// The order service checks every payment against price × qty.
    #[serde(default)]
    pub price: u64,
    /// ISO 4217 code of `price`'s currency; payments in another currency are refused.
    #[serde(default = "currency_default")]
    pub currency: String,
    /// How long a buyer has to pay for an order before it expires and its units sell again.
    #[serde(default = "pay_timeout_s_default")]
    pub pay_timeout_s: u64,
    /// Sub-ledgers the SKU's stock is split into (see [`crate::stripes`]); 1 = not striped.
    /// Left out of the wire when 1, so nodes built before stripes read every unstriped SKU.
    #[serde(default = "stripes_default", skip_serializing_if = "is_one")]
    pub stripes: u32,
    /// Buyers go through a waiting room ([`crate::room`]) and buy with its ticket; `true` in
    /// JSON or TOML means the default rules. Left out of the wire when off, so nodes built before
    /// rooms read every SKU without one.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "room_choice")]
    pub waiting_room: Option<RoomRules>,
}

/// `waiting_room`: `true` (the default rules), `false` (none) or the rules themselves.
fn room_choice<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<RoomRules>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Choice {
        Switch(bool),
        Rules(RoomRules),
    }
    Ok(match Option::<Choice>::deserialize(deserializer)? {
        None | Some(Choice::Switch(false)) => None,
        Some(Choice::Switch(true)) => Some(RoomRules::default()),
        Some(Choice::Rules(rules)) => Some(rules),
    })
}

fn stripes_default() -> u32 {
    1
}

fn is_one(stripes: &u32) -> bool {
    *stripes == 1
}

/// The usual rule of Chinese and Western shops alike: 15 minutes to pay.
pub const PAY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(15 * 60);

/// Longest pay window: an unpaid order is released against the ledger's record of its sale,
/// which the ledger keeps `sale_record_ttl_s` (two days by default), and the pay window must
/// leave room in it for an order-service outage.
pub const PAY_TIMEOUT_MAX: Duration = Duration::from_secs(12 * 60 * 60);

fn currency_default() -> String {
    "USD".to_string()
}

fn pay_timeout_s_default() -> u64 {
    PAY_TIMEOUT_DEFAULT.as_secs()
}

fn qty_max_default() -> u32 {
    1
}

fn token_ttl_s_default() -> u64 {
    TOKEN_TTL_DEFAULT.as_secs()
}

/// A term that breaks a rule: which field, and why. Callers put it in context
/// (`skus[2].qty_max: …` in the config loader, a 400 body in the admin API).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidTerms {
    pub field: &'static str,
    pub reason: &'static str,
}

impl SkuTerms {
    /// Terms with every default: `total` units, no per-user limit, one unit per order, no
    /// window, a 10% buffer, open, no submit tokens.
    pub fn new(total: u64) -> Self {
        Self {
            total,
            per_user_limit: 0,
            qty_max: qty_max_default(),
            starts_at_ms: None,
            ends_at_ms: None,
            buffer: Buffer::default(),
            closed: false,
            require_token: false,
            token_ttl_s: token_ttl_s_default(),
            price: 0,
            currency: currency_default(),
            pay_timeout_s: pay_timeout_s_default(),
            stripes: stripes_default(),
            waiting_room: None,
        }
    }

    /// The terms of each stripe of a SKU sold on these terms, stripe 0 first: the same terms
    /// with the total split as evenly as it goes (the first `total % stripes` stripes hold one
    /// unit more), so the stripes' totals add up to the SKU's.
    pub fn stripe_terms(&self) -> Vec<SkuTerms> {
        let stripes = u64::from(self.stripes.max(1));
        (0..stripes)
            .map(|index| SkuTerms {
                total: self.total / stripes + u64::from(index < self.total % stripes),
                ..self.clone()
            })
            .collect()
    }

    /// The one check of every rule terms must keep, wherever they came from.
    pub fn validate(&self) -> Result<(), InvalidTerms> {
        let invalid = |field, reason| Err(InvalidTerms { field, reason });
        if self.total == 0 || self.total > TOTAL_MAX {
            return invalid("total", "must be above zero and at most 2^53 - 1 (the ledger's Lua counts in doubles)");
        }
        if self.qty_max == 0 {
            return invalid("qty_max", "must be at least 1");
        }
        if self.per_user_limit > 0 && self.qty_max > self.per_user_limit {
            return invalid("qty_max", "exceeds per_user_limit, so no order that large could ever succeed");
        }
        if let (Some(start), Some(end)) = (self.starts_at_ms, self.ends_at_ms) {
            if start >= end {
                return invalid("ends_at", "must be after starts_at");
            }
        }
        if self.token_ttl_s == 0 || self.token_ttl_s > TOKEN_TTL_MAX.as_secs() {
            return invalid("token_ttl_s", "must be between 1 and 86400 (a day)");
        }
        if self.pay_timeout_s == 0 || self.pay_timeout_s > PAY_TIMEOUT_MAX.as_secs() {
            return invalid(
                "pay_timeout_s",
                "must be between 1 and 43200 (12 hours, well within a day's idempotency TTL)",
            );
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return invalid("currency", "must be an ISO 4217 code: three capital letters, like USD or CNY");
        }
        if self.price.checked_mul(u64::from(self.qty_max)).is_none_or(|amount| amount > TOTAL_MAX) {
            return invalid("price", "price × qty_max must stay below 2^53 minor units");
        }
        if let Buffer::Percent(pct) = self.buffer {
            if pct > BUFFER_PERCENT_MAX {
                return invalid("buffer", "a percentage buffer is at most 1000%");
            }
        }
        if self.stripes == 0 || self.stripes > STRIPES_MAX {
            return invalid("stripes", "must be between 1 and 64");
        }
        if u64::from(self.stripes) > self.total {
            return invalid("stripes", "must not exceed total: every stripe starts with at least one unit");
        }
        if let Some(room) = &self.waiting_room {
            if self.stripes > 1 {
                return invalid("waiting_room", "a striped SKU cannot have a waiting room yet: set stripes = 1");
            }
            room.validate()
                .map_err(|broken| InvalidTerms { field: room_field(broken.field), reason: broken.reason })?;
        }
        Ok(())
    }

    /// Whether a purchase must spend a ledger token: a submit token, or a room's ticket (which
    /// carries one).
    pub fn requires_token(&self) -> bool {
        self.require_token || self.waiting_room.is_some()
    }

    pub fn pay_timeout(&self) -> Duration {
        Duration::from_secs(self.pay_timeout_s)
    }

    pub fn token_ttl(&self) -> Duration {
        Duration::from_secs(self.token_ttl_s)
    }

    /// Whether the sale window is open at `now_ms` (Unix ms).
    pub fn window_open(&self, now_ms: u64) -> bool {
        self.starts_at_ms.is_none_or(|start| now_ms >= start) && self.ends_at_ms.is_none_or(|end| now_ms < end)
    }

    /// Units the live nodes should hold together when the ledger has `remaining` left.
    pub fn target_local(&self, remaining: u64, live_nodes: u64) -> u64 {
        if remaining == 0 || self.closed || live_nodes == 0 {
            return 0;
        }
        let buffer = match self.buffer {
            Buffer::Units(units) => units.saturating_mul(live_nodes),
            // Each node's share of `remaining` is remaining / live; its buffer a percentage of it.
            Buffer::Percent(_) => self.buffer.units(remaining),
        };
        remaining.saturating_add(buffer)
    }
}

/// The full name of a room setting, for messages (`waiting_room.admit_per_s: …`).
fn room_field(field: &'static str) -> &'static str {
    match field {
        "admit_per_s" => "waiting_room.admit_per_s",
        "admit_factor" => "waiting_room.admit_factor",
        "ticket_ttl_s" => "waiting_room.ticket_ttl_s",
        "abandon_s" => "waiting_room.abandon_s",
        _ => "waiting_room",
    }
}

/// Extra units a node holds beyond its share of the stock, so the fleet keeps selling through a
/// node's death until its allotment is reallocated: a unit count per node, or a percentage of
/// the node's share. Written `50` or `"10%"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    Units(u64),
    Percent(u32),
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer::Percent(10)
    }
}

impl Buffer {
    /// The buffer of a node whose share is `share`.
    pub fn units(self, share: u64) -> u64 {
        match self {
            Buffer::Units(units) => units,
            Buffer::Percent(pct) => share.saturating_mul(u64::from(pct)).div_ceil(100),
        }
    }

    /// Reads `"10%"` or `"50"`.
    pub fn parse(text: &str) -> Option<Buffer> {
        match text.trim().strip_suffix('%') {
            Some(pct) => pct.trim().parse().ok().filter(|pct| *pct <= BUFFER_PERCENT_MAX).map(Buffer::Percent),
            None => text.trim().parse().ok().map(Buffer::Units),
        }
    }
}

impl std::fmt::Display for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Buffer::Units(units) => write!(f, "{units}"),
            Buffer::Percent(pct) => write!(f, "{pct}%"),
        }
    }
}

impl Serialize for Buffer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Buffer::Units(units) => serializer.serialize_u64(*units),
            Buffer::Percent(_) => serializer.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Buffer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Units(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Units(units) => Ok(Buffer::Units(units)),
            Raw::Text(text) => Buffer::parse(&text).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "buffer {text:?} is neither a unit count nor a percentage like \"10%\" (at most {BUFFER_PERCENT_MAX}%)"
                ))
            }),
        }
    }
}

/// Sale-window instants as Unix ms, from whichever form the source writes them in.
pub mod sale_time {
    use std::fmt;
    use std::str::FromStr;

    use serde::de::{self, MapAccess, Visitor};

    /// The key under which the TOML parser hands a date-time to a deserializer.
    const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

    /// Reads a TOML date-time, an RFC 3339 string, Unix ms, or nothing.
    pub fn optional<'de, D: de::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        deserializer.deserialize_option(OptionalVisitor)
    }

    struct OptionalVisitor;

    impl<'de> Visitor<'de> for OptionalVisitor {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a date-time with an offset (2026-11-22T10:00:00+08:00) or Unix milliseconds")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_any(InstantVisitor).map(Some)
        }
    }

    struct InstantVisitor;

    impl<'de> Visitor<'de> for InstantVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a date-time with an offset (2026-11-22T10:00:00+08:00) or Unix milliseconds")
        }

        fn visit_u64<E: de::Error>(self, ms: u64) -> Result<u64, E> {
            Ok(ms)
        }

        fn visit_i64<E: de::Error>(self, ms: i64) -> Result<u64, E> {
            u64::try_from(ms).map_err(|_| E::custom("must not be before 1970"))
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<u64, E> {
            parse(text).map_err(E::custom)
        }

        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<u64, M::Error> {
            match map.next_key::<String>()? {
                Some(key) if key == TOML_DATETIME_KEY => {
                    let text: String = map.next_value()?;
                    parse(&text).map_err(de::Error::custom)
                }
                _ => Err(de::Error::custom("expected a date-time")),
            }
        }
    }

    /// Unix ms of an RFC 3339 date-time. A date-time without an offset is refused: a flash
    /// sale's start in "local time" of whichever machine reads the config is a bug waiting.
    pub fn parse(text: &str) -> Result<u64, String> {
        let datetime = toml_datetime::Datetime::from_str(text).map_err(|e| format!("{text:?}: {e}"))?;
        let (Some(date), Some(time), Some(offset)) = (datetime.date, datetime.time, datetime.offset) else {
            return Err(format!("{text:?} needs a date, a time and an offset, like 2026-11-22T10:00:00+08:00"));
        };
        let offset_minutes: i64 = match offset {
            toml_datetime::Offset::Z => 0,
            toml_datetime::Offset::Custom { minutes } => i64::from(minutes),
        };
        let days = days_from_civil(i64::from(date.year), u32::from(date.month), u32::from(date.day));
        let seconds = days * 86_400
            + i64::from(time.hour) * 3600
            + i64::from(time.minute) * 60
            + i64::from(time.second.unwrap_or(0))
            - offset_minutes * 60;
        u64::try_from(seconds * 1000 + i64::from(time.nanosecond.unwrap_or(0) / 1_000_000))
            .map_err(|_| format!("{text:?} is before 1970"))
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
        let year = if month <= 2 { year - 1 } else { year };
        let era = year.div_euclid(400);
        let year_of_era = year - era * 400;
        let month = i64::from(month);
        let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
        let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
        era * 146_097 + day_of_era - 719_468
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_sets_how_much_the_live_nodes_hold_beyond_remaining() {
        let mut terms = SkuTerms::new(100);
        assert_eq!(terms.target_local(200, 4), 220, "10% of remaining");
        terms.buffer = Buffer::Units(5);
        assert_eq!(terms.target_local(200, 4), 220, "5 per live node");
        assert_eq!(terms.target_local(0, 4), 0, "nothing to hold once sold out");
        terms.closed = true;
        assert_eq!(terms.target_local(200, 4), 0, "nothing to hold once closed");
    }

    #[test]
    fn validate_names_the_field_that_breaks_a_rule() {
        let field = |terms: SkuTerms| terms.validate().unwrap_err().field;
        assert!(SkuTerms::new(5).validate().is_ok());
        assert_eq!(field(SkuTerms::new(0)), "total");
        assert_eq!(field(SkuTerms::new(TOTAL_MAX + 1)), "total");
        assert_eq!(field(SkuTerms { qty_max: 0, ..SkuTerms::new(5) }), "qty_max");
        assert_eq!(field(SkuTerms { qty_max: 3, per_user_limit: 2, ..SkuTerms::new(5) }), "qty_max");
        assert_eq!(field(SkuTerms { starts_at_ms: Some(2), ends_at_ms: Some(1), ..SkuTerms::new(5) }), "ends_at");
        assert_eq!(field(SkuTerms { token_ttl_s: 0, ..SkuTerms::new(5) }), "token_ttl_s");
        assert_eq!(field(SkuTerms { token_ttl_s: 86_401, ..SkuTerms::new(5) }), "token_ttl_s");
        assert_eq!(field(SkuTerms { buffer: Buffer::Percent(1001), ..SkuTerms::new(5) }), "buffer");
    }

    #[test]
    fn json_takes_rfc3339_or_ms_and_writes_the_logged_field_names() {
        let terms: SkuTerms =
            serde_json::from_str(r#"{"total":5,"starts_at":"2026-11-22T10:00:00+08:00","ends_at_ms":1795320000000}"#)
                .unwrap();
        assert_eq!(terms.starts_at_ms, Some(1_795_312_800_000), "10:00 at +08:00 is 02:00 UTC");
        assert_eq!(terms.ends_at_ms, Some(1_795_320_000_000));
        let written = serde_json::to_value(&terms).unwrap();
        assert_eq!(written["starts_at_ms"], 1_795_312_800_000u64, "logs and older nodes read the _ms names");
        assert!(serde_json::from_str::<SkuTerms>(r#"{"total":5,"colour":1}"#).is_err(), "unknown fields");
        assert!(serde_json::from_str::<SkuTerms>(r#"{"total":5,"starts_at":"2026-11-22T10:00:00"}"#).is_err());
    }

    #[test]
    fn terms_logged_before_tokens_existed_still_read() {
        let old = r#"{"total":100,"per_user_limit":1,"qty_max":1,"starts_at_ms":null,"ends_at_ms":null,"buffer":"10%","closed":false}"#;
        let terms: SkuTerms = serde_json::from_str(old).unwrap();
        assert_eq!(terms, SkuTerms { per_user_limit: 1, ..SkuTerms::new(100) });
    }
}
