//! The SKUs a schedule sells: [`MAIN`], in the fleet's config from the start, and in some
//! schedules [`RUNTIME`], created while the faults run through the coordinator's admin API
//! (`PUT /admin/skus/{sku}`, what `seckill admin create` sends). Nodes and order services learn
//! of it from the coordinator's catalogue, under whatever fault is in effect, and the checker
//! judges it by the same rules as the main one.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledger::{InvalidId, SkuId};

/// One SKU's terms; both sell `qty_max = 1`, with a 10% buffer.
#[derive(Clone, Copy, Debug)]
pub struct SaleSku {
    pub id: &'static str,
    pub total: u64,
    pub per_user_limit: u64,
    pub price: u64,
    pub pay_timeout_s: u64,
    /// Stripes its stock is split into (`seckill nemesis --stripes`); 1: unstriped.
    pub stripes: u32,
}

/// Units on sale per schedule: enough that a fault phase of drawn demand leaves stock at the
/// heal in most schedules, few enough that the rush after it sells out within seconds. Its pay
/// timeout is short, so orders sold during the faults expire and sell again before the heal.
/// Units one user may buy: users are as many as units, so demand can buy twice the stock and
/// many users hit the limit.
pub const MAIN: SaleSku =
    SaleSku { id: "nemesis", total: 300, per_user_limit: 2, price: 100, pay_timeout_s: 10, stripes: 1 };

/// Smaller than the main SKU: it opens later and shares the buyers with it, and must still
/// sell out in the rush.
pub const RUNTIME: SaleSku =
    SaleSku { id: "nemesis-runtime", total: 100, per_user_limit: 2, price: 250, pay_timeout_s: 10, stripes: 1 };

/// Sold only through a waiting room ([`crate::room`], `--waiting-room`): few units and a short
/// pay timeout, so unpaid orders expire and the room reopens during the run.
pub const ROOM: SaleSku =
    SaleSku { id: "nemesis-room", total: 40, per_user_limit: 1, price: 500, pay_timeout_s: 10, stripes: 1 };

/// Every SKU's currency: the terms' default.
pub const CURRENCY: &str = "USD";

/// The price of one unit of each of the nemesis's SKUs.
pub fn prices() -> std::collections::BTreeMap<String, u64> {
    [MAIN, RUNTIME, ROOM].into_iter().map(|sale| (sale.id.to_string(), sale.price)).collect()
}

/// Pause between tries of the create.
const CREATE_PAUSE: Duration = Duration::from_millis(300);

/// Longest one try may take.
const CREATE_CALL_MAX: Duration = Duration::from_secs(5);

impl SaleSku {
    /// The same SKU split into `stripes`.
    pub fn striped(self, stripes: u32) -> SaleSku {
        SaleSku { stripes, ..self }
    }

    /// The ledgers its stock is kept in: itself, or each of its stripes.
    pub fn ledgers(&self) -> Result<Vec<SkuId>, InvalidId> {
        Ok(crate::stripes::ledgers(&SkuId::new(self.id)?, self.total, self.stripes))
    }

    /// The `[[skus]]` table of the fleet's config. An unstriped SKU's names no stripes, so the
    /// config reads as it did before stripes.
    pub fn toml(&self) -> String {
        let stripes = if self.stripes > 1 { format!("stripes = {}\n", self.stripes) } else { String::new() };
        format!(
            "[[skus]]\nid = \"{}\"\ntotal = {}\nper_user_limit = {}\nqty_max = 1\nbuffer = \"10%\"\nprice = {}\n\
             pay_timeout_s = {}\n{stripes}",
            self.id, self.total, self.per_user_limit, self.price, self.pay_timeout_s
        )
    }

    /// The admin API's create, on the same terms as [`SaleSku::toml`]. `price` is required.
    fn create_body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "op": "create",
            "total": self.total,
            "per_user_limit": self.per_user_limit,
            "qty_max": 1,
            "buffer": "10%",
            "price": self.price,
            "pay_timeout_s": self.pay_timeout_s,
        });
        if self.stripes > 1 {
            body["stripes"] = self.stripes.into();
        }
        body
    }
}

/// Creates `sku` through the admin API with `token`, trying the members in turn (a follower
/// answers 421, a member being killed does not answer) until one creates it (201) or finds it
/// created on these terms by an earlier try whose answer was lost (200), or `within` passes.
pub async fn create(
    members: &[(String, SocketAddr)],
    token: &str,
    sku: &SaleSku,
    within: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + within;
    let path = format!("/admin/skus/{}", sku.id);
    let body = sku.create_body();
    for (name, addr) in members.iter().cycle() {
        let put = hyper::Method::PUT;
        let last = match testkit::http::send_json(put, *addr, &path, &body, Some(token), CREATE_CALL_MAX).await {
            Ok((200 | 201, _)) => return Ok(name.clone()),
            Ok((status, answer)) => format!("{name} answered {status}: {answer}"),
            Err(e) => format!("{name}: {e:#}"),
        };
        if Instant::now() >= deadline {
            return Err(format!("no member created {} within {within:?}; last: {last}", sku.id));
        }
        tokio::time::sleep(CREATE_PAUSE).await;
    }
    Err("no members to ask".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unstriped_sku_is_written_as_before_and_a_striped_one_names_its_stripes() {
        assert!(!MAIN.toml().contains("stripes"));
        assert!(MAIN.create_body().get("stripes").is_none());
        let striped = MAIN.striped(3);
        assert!(striped.toml().ends_with("pay_timeout_s = 10\nstripes = 3\n"), "{}", striped.toml());
        assert_eq!(striped.create_body()["stripes"], 3);
        let names: Vec<String> = striped.ledgers().unwrap().iter().map(ToString::to_string).collect();
        assert_eq!(names, ["nemesis", "nemesis/1", "nemesis/2"]);
    }
}
