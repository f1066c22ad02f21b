//! Values of the ledger's contract: purchases, decisions, books and order events. The
//! identifiers they carry come from `protocol`, shared with every other process.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use protocol::{IdempotencyKey, NodeId, SubmitToken, UserId};
use serde::{Deserialize, Serialize};

/// The order id of one confirmed sale: the selling node's Snowflake id, or the ledger's
/// `<sku>-<seq>`; unique per ledger either way. Digits, letters, `-` and the other characters
/// a SKU id may hold (`_ . :`), so it fits the stored decision's separators.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrderId(pub String);

impl OrderId {
    /// Whether `text` has the characters an order id is made of (see the type); readers of the
    /// order stream and the order API check ids with it.
    /// The id the ledger gives an order its seller brought none for: `<sku>-<seq>`, and on
    /// stripe i of `s` `s-i.<seq>` (no `/`, which is no order id character; the `.` keeps a
    /// stripe's ids apart from any SKU's own). `confirm.lua` numbers alike.
    pub fn numbered(sku: &protocol::SkuId, seq: u64) -> OrderId {
        match sku.stripe_parent() {
            (parent, 0) => OrderId(format!("{parent}-{seq}")),
            (parent, stripe) => OrderId(format!("{parent}-{stripe}.{seq}")),
        }
    }

    pub fn is_valid(text: &str) -> bool {
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who sold: a node in one epoch of its membership. Epochs let the books tell apart what a node
/// sold before it was declared dead from what it sold after rejoining; 0 is "no coordinator".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seller {
    pub node: NodeId,
    pub epoch: u64,
}

impl Seller {
    pub fn new(node: NodeId, epoch: u64) -> Self {
        Self { node, epoch }
    }

    /// The key of this seller's count in the per-epoch books.
    pub fn epoch_key(&self) -> String {
        format!("{}#{}", self.node, self.epoch)
    }
}

/// A submit token handed to a buyer: a fresh one, or the one the buyer already holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: SubmitToken,
    /// What is left of its life: the whole TTL for a fresh token, less for one held since an
    /// earlier ask, so the buyer is never told it lives longer than it does.
    pub expires_in: Duration,
}

/// One local sale that a node asks the ledger to confirm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Purchase {
    pub key: IdempotencyKey,
    pub user: UserId,
    pub qty: u32,
    /// The submit token presented with it; only read for a SKU that requires tokens.
    pub token: Option<SubmitToken>,
    /// The id the seller gives the order if this purchase sells (a Snowflake id, unique across
    /// the fleet); `None`: the ledger numbers it `<sku>-<seq>`. Not part of the fingerprint: a
    /// retry brings a new id and gets the stored one back.
    pub order_id: Option<OrderId>,
}

impl Purchase {
    /// What must match for a retry to count as the same purchase (the SKU is implied: keys are
    /// scoped per SKU). The unit separator cannot occur in a user id.
    ///
    /// The submit token is deliberately not part of it: the first decision consumes the token,
    /// and a retry with the same key and payload must still replay that decision, whether it
    /// carries the spent token, another one or none.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.user, self.qty)
    }
}

/// The fingerprint of a purchase of `qty` by `user` (see [`Purchase::fingerprint`]); the
/// release check compares a stored decision against it.
pub(crate) fn fingerprint(user: &UserId, qty: u32) -> String {
    format!("{user}\u{1f}{qty}")
}

/// A confirmed sale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Receipt {
    pub order_id: OrderId,
    /// The node that sold it; replays report the original node, not the one replaying.
    pub node: NodeId,
    pub qty: u32,
}

/// How the ledger decided one purchase. Stored under the idempotency key, so a retry gets the
/// same answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Purchased(Receipt),
    SoldOut,
    UserLimit,
    /// The sale was closed before this purchase was decided.
    Ended,
    /// The SKU requires a submit token and this purchase had none that was live, unspent and
    /// issued to this user for this SKU.
    TokenInvalid,
}

/// The ledger's answer to one purchase of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Decided now, by this call.
    Fresh(Decision),
    /// Decided earlier for the same key and the same payload; this is the stored decision.
    Replayed(Decision),
    /// The key was used before for a different payload; nothing changed.
    KeyReused,
}

/// The ledger's answer to one batch: a verdict per purchase, in order, and the SKU's counts
/// after the batch (nodes cache them for the stock page).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchOutcome {
    pub verdicts: Vec<Verdict>,
    pub sold: u64,
    pub remaining: u64,
    /// Units given back by released orders, ever: with `sold` it orders two readings of the
    /// books (see [`SkuStatus::progress`]).
    pub released: u64,
}

/// A SKU's global counts as the ledger holds them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkuStatus {
    pub total: u64,
    /// Units sold and not given back: `sold + remaining == total` always.
    pub sold: u64,
    pub remaining: u64,
    /// Units given back by released (unpaid) orders, ever; they were sold once and are part of
    /// `remaining` again until they sell again.
    pub released: u64,
    /// Order events appended to the SKU's stream, ever: its last sequence number.
    pub orders: u64,
    pub per_user_limit: u32,
    pub sold_by_node: BTreeMap<NodeId, u64>,
    /// The sale was closed: the ledger sells nothing more.
    pub closed: bool,
    /// Purchases must present a submit token.
    pub require_token: bool,
    /// Units moved out of this ledger to another stripe of its SKU, ever
    /// ([`crate::CatalogueLedger::transfer_out`]); they left `total` and `remaining` together.
    pub transferred_out: u64,
    /// Units moved into this ledger from another stripe, ever
    /// ([`crate::CatalogueLedger::transfer_in`]). So `total` is the created total plus restocks
    /// less `transferred_out` plus `transferred_in`.
    pub transferred_in: u64,
}

impl SkuStatus {
    /// A count that grows with every sale and every release and never goes back, so a reader
    /// can tell the newer of two readings of the same books (`sold` alone drops on a release).
    pub fn progress(&self) -> u64 {
        progress(self.sold, self.released)
    }

    /// One SKU's books from its stripes' (stripe 0 first): counts summed, per-node sales
    /// merged, closed only when every stripe is, terms as stripe 0 has them. Units taken out of
    /// one stripe and not yet put into another are in neither's total: `in_flight` says how
    /// many, so `total + in_flight` is the SKU's total.
    pub fn combined(stripes: &[SkuStatus]) -> SkuStatus {
        let mut sum = stripes.first().cloned().unwrap_or_else(|| SkuStatus {
            total: 0,
            sold: 0,
            remaining: 0,
            released: 0,
            orders: 0,
            per_user_limit: 0,
            sold_by_node: BTreeMap::new(),
            closed: false,
            require_token: false,
            transferred_out: 0,
            transferred_in: 0,
        });
        for stripe in stripes.iter().skip(1) {
            sum.total += stripe.total;
            sum.sold += stripe.sold;
            sum.remaining += stripe.remaining;
            sum.released += stripe.released;
            sum.orders += stripe.orders;
            sum.closed &= stripe.closed;
            sum.transferred_out += stripe.transferred_out;
            sum.transferred_in += stripe.transferred_in;
            for (node, sold) in &stripe.sold_by_node {
                *sum.sold_by_node.entry(node.clone()).or_insert(0) += sold;
            }
        }
        sum
    }

    /// Units moved out of a stripe and not yet into another (see [`SkuStatus::combined`]).
    pub fn in_flight(&self) -> u64 {
        self.transferred_out.saturating_sub(self.transferred_in)
    }
}

impl BatchOutcome {
    /// See [`SkuStatus::progress`].
    pub fn progress(&self) -> u64 {
        progress(self.sold, self.released)
    }
}

/// Every sale adds to `sold`; every release moves units from `sold` to `released` and so adds
/// to `released` twice over `sold`'s drop.
fn progress(sold: u64, released: u64) -> u64 {
    sold.saturating_add(released.saturating_mul(2))
}

/// One unpaid (expired or cancelled) order whose units go back to the SKU. The ledger checks it
/// against its own record of the sale, kept by order id for the sale record TTL
/// ([`crate::SALE_RECORD_TTL_DEFAULT`]), however long the idempotency record lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub order_id: OrderId,
    /// The sale's idempotency key: the Redis ledger keeps the sale's record as that key's
    /// idempotency record, filed under it.
    pub key: IdempotencyKey,
    pub user: UserId,
    pub qty: u32,
    /// When the ledger sold it (the order event's `at_ms`): where a Redis ledger files the
    /// sale's record.
    pub sold_at_ms: u64,
}

/// What [`crate::OrderFeed::release`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The units are back in `remaining` now.
    Released { remaining: u64 },
    /// This order's units went back before; nothing changed.
    AlreadyReleased,
    /// The ledger has no sale matching the order (never sold, another user or qty, or sold
    /// longer ago than the sale record TTL); nothing changed.
    NeverSold,
}

/// One entry of a SKU's release log: an order whose units went back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReleaseEvent {
    /// 1 for the SKU's first release, then +1 per release.
    pub seq: u64,
    pub order_id: OrderId,
    pub user: UserId,
    pub qty: u32,
}

/// How far a consumer group is behind a SKU's order stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FeedLag {
    /// Entries appended and not yet delivered to the group.
    pub undelivered: u64,
    /// Entries delivered and not yet acknowledged.
    pub pending: u64,
}

/// One entry of a SKU's order stream as a consumer group delivers it: its raw fields (parsing
/// them is the consumer's job, so an unreadable entry can be dead-lettered whole) and how often
/// the group has delivered it. An entry holds one or more orders ([`FeedEntry::events`]): the
/// group delivers, acknowledges and dead-letters entries, not orders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedEntry {
    /// The entry's id: the seq of the last order it holds.
    pub seq: u64,
    pub fields: Vec<(String, String)>,
    pub deliveries: u64,
    /// Why the entry cannot be read whatever its fields say: a field or value is not UTF-8
    /// (`fields` then holds a lossy rendering, for the dead letter).
    pub unreadable: Option<String>,
}

impl FeedEntry {
    /// An entry from the bytes the stream holds. Bytes that are not UTF-8 make it unreadable
    /// rather than failing the read it came in: one corrupt entry must not stop the entries
    /// around it.
    pub fn from_raw(seq: u64, raw: Vec<(Vec<u8>, Vec<u8>)>, deliveries: u64) -> FeedEntry {
        let mut unreadable = None;
        let mut text = |bytes: Vec<u8>| match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
                unreadable.get_or_insert_with(|| format!("{lossy:?} is not UTF-8"));
                lossy
            }
        };
        let fields = raw.into_iter().map(|(field, value)| (text(field), text(value))).collect();
        FeedEntry { seq, fields, deliveries, unreadable }
    }

    /// The order events the entry holds, in seq order; `Err` names what is missing or
    /// malformed (one bad order spoils the entry: it is read, or dead-lettered, whole).
    ///
    /// Two shapes (see `confirm.lua`): a batch entry (the script since one entry per batch) has
    /// `node`, `at` and the pricing terms once and one field per order named by its seq, valued
    /// `order_id US key US user US qty`, its entry seq being its last order's; an entry with an
    /// `order_id` field is one order of the older script, whose fields are the event's, still
    /// read so a stream written before an upgrade reads on.
    /// The fields that describe order `seq` of this entry alone: the entry's shared fields and
    /// that order's own (every field of an older single-order entry). What a dead letter of
    /// that one order keeps.
    pub fn fields_of_order(&self, seq: u64) -> Vec<(String, String)> {
        let own = seq.to_string();
        let is_order = |field: &str| !field.is_empty() && field.bytes().all(|b| b.is_ascii_digit());
        self.fields.iter().filter(|(field, _)| !is_order(field) || *field == own).cloned().collect()
    }

    pub fn events(&self) -> Result<Vec<OrderEvent>, String> {
        if let Some(reason) = &self.unreadable {
            return Err(reason.clone());
        }
        if self.field("order_id").is_ok() {
            return self.single_event().map(|event| vec![event]);
        }
        let node = NodeId::new(self.field("node")?).map_err(|_| bad("node"))?;
        let at_ms = self.at_ms();
        let pricing = self.pricing()?;
        let mut events: Vec<OrderEvent> = Vec::new();
        for (field, value) in &self.fields {
            if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let seq: u64 = field.parse().map_err(|_| bad("order seq"))?;
            if events.last().is_some_and(|last| last.seq >= seq) {
                return Err(format!("order seq {seq} out of order"));
            }
            let mut parts = value.split('\u{1f}');
            let mut part = |what: &str| parts.next().ok_or_else(|| format!("order {seq} has no {what}"));
            let (order_id, key, user, qty) = (part("order_id")?, part("key")?, part("user")?, part("qty")?);
            if parts.next().is_some() {
                return Err(format!("order {seq} has more parts than an order"));
            }
            events.push(OrderEvent {
                seq,
                order_id: order_id_of(order_id)?,
                key: IdempotencyKey::new(key).map_err(|_| bad("key"))?,
                user: UserId::new(user).map_err(|_| bad("user"))?,
                qty: qty_of(qty)?,
                node: node.clone(),
                at_ms,
                pricing: pricing.clone(),
            });
        }
        match events.last() {
            None => Err("no field \"order_id\" and no orders".into()),
            // The entry id is its last order's seq: anything else would break resuming by seq.
            Some(last) if last.seq != self.seq => {
                Err(format!("entry {} holds orders up to seq {}, not up to its own", self.seq, last.seq))
            }
            Some(_) => Ok(events),
        }
    }

    fn field(&self, name: &str) -> Result<&str, String> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
            .ok_or_else(|| format!("no field {name:?}"))
    }

    /// Absent from entries written before sales carried their time.
    fn at_ms(&self) -> u64 {
        self.field("at").ok().and_then(|at| at.parse().ok()).unwrap_or(0)
    }

    fn pricing(&self) -> Result<Option<Pricing>, String> {
        Ok(match (self.field("price"), self.field("currency"), self.field("pay_timeout_s")) {
            (Ok(price), Ok(currency), Ok(pay_timeout_s)) => Some(Pricing {
                price: price.parse().map_err(|_| bad("price"))?,
                currency: currency.to_string(),
                pay_timeout_s: pay_timeout_s.parse().map_err(|_| bad("pay_timeout_s"))?,
            }),
            _ => None,
        })
    }

    /// An entry of one order (the script before batch entries; the embedded ledger's feed).
    fn single_event(&self) -> Result<OrderEvent, String> {
        Ok(OrderEvent {
            seq: self.seq,
            order_id: order_id_of(self.field("order_id")?)?,
            key: IdempotencyKey::new(self.field("key")?).map_err(|_| bad("key"))?,
            user: UserId::new(self.field("user")?).map_err(|_| bad("user"))?,
            qty: qty_of(self.field("qty")?)?,
            node: NodeId::new(self.field("node")?).map_err(|_| bad("node"))?,
            at_ms: self.at_ms(),
            pricing: self.pricing()?,
        })
    }
}

fn bad(what: &str) -> String {
    format!("a bad {what}")
}

fn order_id_of(text: &str) -> Result<OrderId, String> {
    if !OrderId::is_valid(text) {
        return Err(bad("order_id"));
    }
    Ok(OrderId(text.to_string()))
}

fn qty_of(text: &str) -> Result<u32, String> {
    text.parse().ok().filter(|qty| *qty > 0).ok_or_else(|| bad("qty"))
}

/// Whether `create_sku` made a new ledger or found one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    New(SkuStatus),
    /// The SKU already had a ledger; it was left exactly as it was.
    Existing(SkuStatus),
}

/// The terms an order is priced on: the SKU's at the moment of the sale, carried by its order
/// event, so a later change of the SKU's terms never reprices an order already sold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pricing {
    /// Price of one unit in the currency's minor unit.
    pub price: u64,
    pub currency: String,
    pub pay_timeout_s: u64,
}

impl Pricing {
    pub fn of(terms: &crate::SkuTerms) -> Pricing {
        Pricing { price: terms.price, currency: terms.currency.clone(), pay_timeout_s: terms.pay_timeout_s }
    }
}

/// One entry of a SKU's order stream, appended by the same atomic step that sold the units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OrderEvent {
    /// Position in the SKU's stream: 1 for the first sale, then +1 per sale. Readers resume
    /// from the last `seq` they saw.
    pub seq: u64,
    pub order_id: OrderId,
    pub key: IdempotencyKey,
    pub user: UserId,
    pub qty: u32,
    pub node: NodeId,
    /// When the ledger sold it, Unix ms by the ledger's clock (Redis' `TIME`); 0 if unknown.
    /// Pay deadlines run from it, so an order stored late does not give its buyer longer.
    pub at_ms: u64,
    /// The terms the order is priced on; absent from entries written before events carried
    /// them (the order service then prices by the SKU's current terms).
    pub pricing: Option<Pricing>,
}

/// Stored decisions are one string: fingerprint, then the decision, fields split by the record
/// separator (a control character, which ids cannot contain). Both ledgers use this encoding so
/// that the Lua script and the Rust code agree byte for byte.
pub(crate) mod stored {
    use super::*;

    pub const SEP: char = '\u{1e}';

    pub fn encode(decision: &Decision) -> String {
        match decision {
            Decision::Purchased(r) => format!("purchased{SEP}{}{SEP}{}{SEP}{}", r.order_id, r.node, r.qty),
            Decision::SoldOut => "sold_out".to_string(),
            Decision::UserLimit => "user_limit".to_string(),
            Decision::Ended => "ended".to_string(),
            Decision::TokenInvalid => "token_invalid".to_string(),
        }
    }

    pub fn decode(text: &str) -> Option<Decision> {
        let mut fields = text.split(SEP);
        match fields.next()? {
            "purchased" => {
                let order_id = OrderId(fields.next()?.to_string());
                let node = NodeId::new(fields.next()?).ok()?;
                let qty = fields.next()?.parse().ok()?;
                Some(Decision::Purchased(Receipt { order_id, node, qty }))
            }
            "sold_out" => Some(Decision::SoldOut),
            "user_limit" => Some(Decision::UserLimit),
            "ended" => Some(Decision::Ended),
            "token_invalid" => Some(Decision::TokenInvalid),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_decisions_round_trip() {
        let receipt = Receipt { order_id: OrderId("s-7".into()), node: NodeId::new("n2").unwrap(), qty: 3 };
        for decision in [
            Decision::Purchased(receipt),
            Decision::SoldOut,
            Decision::UserLimit,
            Decision::Ended,
            Decision::TokenInvalid,
        ] {
            assert_eq!(stored::decode(&stored::encode(&decision)), Some(decision));
        }
        assert_eq!(stored::decode("garbage"), None);
    }
}
