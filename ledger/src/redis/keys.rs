//! Key layout, for SKU `s` under prefix `p` (the `{s}` hash tag keeps a SKU in one cluster slot):
//! - `p:{s}:meta`     hash: total, sold, remaining, per_user_limit, order_seq, closed (once
//!   closed)
//! - `p:{s}:by_user`  hash: user → units bought (at most one field per buyer, so ≤ total fields)
//! - `p:{s}:by_epoch` hash: `node#epoch` → units sold by that node in that epoch (per-node
//!   totals are its sums: one write per confirmed batch instead of two)
//! - `p:{s}:meta` also holds `transferred_out` and `transferred_in` once the SKU is a stripe
//!   that moved units (absent = 0): units moved out of and into it, ever
//! - `p:{s}:transfers` hash: `out:<id>` / `in:<id>` → units moved by transfer `id` out of or
//!   into this stripe (`transfer_out.lua`, `transfer_in.lua`), never expiring: what makes a
//!   repeated transfer change nothing. A stripe i ≥ 1 of SKU `s` is the SKU `s/i`, so its keys
//!   are `p:{s/i}:…`, another slot (`protocol::stripes`)
//! - `p:{s}:meta` also holds `idem_window_ms` and `idem_ttl_max_ms` once a decision was
//!   recorded: the SKU's idempotency window length and the longest TTL any caller asked for
//! - `p:{s}:orders`   stream of order events, one entry per confirmed batch; entry ids are
//!   `0-<seq of the entry's last order>`, so a reader resumes from the last sequence number it
//!   saw (skipping the orders at or before it of the entry it falls inside)
//! - `p:{s}:releases` stream of releases; entry ids are `0-<seq>` (`release.lua`)
//! - `p:{s}:sales:<w>` hash, written by scripts before 2026-11 only (a sale's record is now its
//!   idempotency record, below, which `release.lua` reads first): order id → buyer and qty of
//!   that sale (marked once released), for
//!   the sales of window w ([`crate::SALE_WINDOW`]): what a release is checked against; each
//!   sale pushes the hash's expiry to its time plus the sale record TTL
//! - `p:{s}:ids:<W>:<n>` hash: idempotency key → stored decision, for the decisions recorded in
//!   window n of W ms by Redis's clock; expires one longest TTL after the window's end, or the
//!   sale record TTL after its last sale if later (a sale's record is what a release checks);
//!   also `GS <order id>` → a sale's record its key's fresh decision displaced, and
//!   `RS <order id>` once that order was released (`confirm.lua` names these keys from the
//!   SKU's meta and Redis's clock)
//! - `p:{s}:key:<k>`  the stored decision for idempotency key k, with a TTL, as the script
//!   before window records wrote it: still read during a rolling upgrade, no longer written
//! - `p:{s}:token:<t>` the user submit token t was issued to, with the token's TTL; deleted by
//!   the purchase of that user that presents it (`confirm.lua`)
//! - `p:{s}:token_holder:<u>` the token user u holds, with the token's TTL: asked again,
//!   `token.lua` returns it; deleted with the token it names
//! - `p:{s}:tokens:<w>` tokens issued in window w (one token TTL long), expiring after two
//!   windows: the count `token.lua` caps, so tokens take bounded memory
//! - `p:{s}:room`, `p:{s}:room:{pre,line,seen,live,ticket,log}`: the SKU's waiting room
//!   (`room.lua` lists what each holds), expiring a week after its last call
//! - `p:{s}:fence`    a counter written before each `WAIT` under `durability = "replica"`, so
//!   the wait covers what a read or a replay saw (see [`RedisLedger::fenced`])

use super::RedisLedger;
use crate::*;

pub(super) struct SkuKeys {
    pub(super) meta: String,
    pub(super) by_user: String,
    pub(super) by_epoch: String,
    pub(super) orders: String,
    /// Followed by an idempotency key: a record of the script before windows, which the older
    /// scripts take as key names (`older_scripts`); confirm.lua names them itself.
    #[cfg(feature = "suite")]
    pub(super) record_prefix: String,
    pub(super) releases: String,
    /// Transfer records of a stripe (`transfer_out.lua`, `transfer_in.lua`).
    pub(super) transfers: String,
    /// Followed by a window number: the hash of that window's sale records (confirm.lua).
    pub(super) sales_prefix: String,
    /// Followed by a token to name its key. Bare, it names the key a purchase without a token
    /// passes: tokens are never empty, so it never exists, and it keeps the batch in the slot.
    pub(super) token_prefix: String,
    /// Followed by a user id to name the key of the token that user holds.
    pub(super) holder_prefix: String,
    /// Written before every `WAIT` under [`Durability::Replica`] (see [`RedisLedger::fenced`]):
    /// a counter with no other meaning.
    pub(super) fence: String,
}

impl SkuKeys {
    /// The sales hash of the window holding `at_ms` (see [`crate::SALE_WINDOW`]), which the
    /// older scripts take as a key name.
    #[cfg(feature = "suite")]
    pub(super) fn sales_window(&self, at_ms: u64) -> String {
        self.sales_window_numbered(at_ms / sale_window_ms())
    }

    fn sales_window_numbered(&self, window: u64) -> String {
        format!("{}{window}", self.sales_prefix)
    }

    /// The sales hashes a release of a sale made at `at_ms` looks in: its window and both
    /// neighbours, so a seller's clock off by less than a window still finds the record.
    pub(super) fn sales_windows_around(&self, at_ms: u64) -> [String; 3] {
        let window = at_ms / sale_window_ms();
        [window.saturating_sub(1), window, window.saturating_add(1)].map(|w| self.sales_window_numbered(w))
    }
}

fn sale_window_ms() -> u64 {
    u64::try_from(crate::SALE_WINDOW.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisLedger {
    pub(super) fn keys(&self, sku: &SkuId) -> SkuKeys {
        let base = format!("{}:{{{sku}}}", self.config.key_prefix);
        SkuKeys {
            meta: format!("{base}:meta"),
            by_user: format!("{base}:by_user"),
            by_epoch: format!("{base}:by_epoch"),
            orders: format!("{base}:orders"),
            #[cfg(feature = "suite")]
            record_prefix: format!("{base}:key:"),
            releases: format!("{base}:releases"),
            transfers: format!("{base}:transfers"),
            sales_prefix: format!("{base}:sales:"),
            token_prefix: format!("{base}:token:"),
            holder_prefix: format!("{base}:token_holder:"),
            fence: format!("{base}:fence"),
        }
    }
}
