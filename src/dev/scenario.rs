//! The named scenarios (docs/scenarios.md), so figures compare across runs.

use std::net::SocketAddr;
use std::path::Path;

use crate::config::Buffer;

/// One standard flash sale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scenario {
    pub name: &'static str,
    pub stock: u64,
    pub nodes: usize,
    /// Purchase attempts (distinct idempotency keys); retries come on top.
    pub requests: u64,
    pub users: u64,
    pub concurrency: usize,
    /// Kill one node when this share of the stock is sold (needs reallocation by the
    /// coordinator to end without undersell).
    pub kill_at_sold: Option<f64>,
    /// Purchase attempts per second, when demand should last long enough to outlive the
    /// failure: `failover` spreads its 20,000 attempts over 5 s, so buyers are still there when
    /// the dead node's stock is reallocated (about one lease after the kill).
    pub rate_per_s: Option<u64>,
}

const fn scenario(name: &'static str, stock: u64, requests: u64, users: u64, concurrency: usize) -> Scenario {
    Scenario { name, stock, nodes: 3, requests, users, concurrency, kill_at_sold: None, rate_per_s: None }
}

pub const SCENARIOS: &[Scenario] = &[
    scenario("small", 1_000, 20_000, 2_000, 64),
    Scenario { kill_at_sold: Some(0.3), rate_per_s: Some(4_000), ..scenario("failover", 1_000, 20_000, 2_000, 64) },
    scenario("standard", 10_000, 1_000_000, 100_000, 256),
    Scenario { kill_at_sold: Some(0.3), ..scenario("standard-failover", 10_000, 1_000_000, 100_000, 256) },
    // The order lifecycle (`crate::dev::demo::orders`): 30% of the first wave never pay, their
    // units come back and a second wave buys them.
    scenario(ORDERS, 300, 3_000, 20_000, 32),
    // Payments through a faulty provider (`crate::dev::demo::payments`): early, dropped, declined,
    // abandoned and late payments, refunds, and resales of what expired.
    scenario(PAYMENTS, 200, 2_000, 20_000, 32),
];

/// The scenario that follows a sale through to paid and expired orders.
pub const ORDERS: &str = "orders";

/// The scenario that pays through the sandbox payment provider, with its faults on.
pub const PAYMENTS: &str = "payments";

pub fn find(name: &str) -> Option<Scenario> {
    SCENARIOS.iter().copied().find(|s| s.name == name)
}

/// `--scenario NAME` takes exactly the names of [`SCENARIOS`]; a wrong one is refused with the
/// list.
impl clap::ValueEnum for Scenario {
    fn value_variants<'a>() -> &'a [Self] {
        SCENARIOS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name))
    }
}

impl Scenario {
    /// A `cluster.toml` for this scenario: `nodes` nodes on free ports, one SKU, one unit per
    /// user and per order, the default 10% buffer, and a one-member coordinator on `coordinator`
    /// keeping its data under `data_dir`, with short leases so a failover shows within seconds.
    pub fn cluster_toml(&self, sku: &str, ledger_url: &str, coordinator: SocketAddr, data_dir: &Path) -> String {
        self.cluster_toml_with_buffer(sku, ledger_url, coordinator, data_dir, Buffer::default())
    }

    /// [`Self::cluster_toml`] with another buffer, for measuring what a buffer buys.
    pub fn cluster_toml_with_buffer(
        &self,
        sku: &str,
        ledger_url: &str,
        coordinator: SocketAddr,
        data_dir: &Path,
        buffer: Buffer,
    ) -> String {
        let buffer = match buffer {
            Buffer::Units(units) => format!("buffer = {units}\n"),
            Buffer::Percent(_) => format!("buffer = \"{buffer}\"\n"),
        };
        let mut text = self.redis_only_toml(sku, ledger_url).replacen("mode = \"redis-only\"\n", "", 1).replacen(
            "qty_max = 1\n",
            &format!("qty_max = 1\n{buffer}"),
            1,
        );
        text.push_str(&format!(
            "\n[node_settings]\norder_ids_dir = {:?}\n",
            data_dir.join("order-ids").display().to_string()
        ));
        text.push_str(&format!(
            "\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"{coordinator}\" }}]\ndata_dir = {:?}\n\
             heartbeat_ms = 100\nlease_ms = 1000\ngrace_ms = 200\nfence_margin_ms = 150\n\
             election_timeout_min_ms = 100\nelection_timeout_max_ms = 200\n",
            data_dir.display().to_string()
        ));
        text
    }

    /// The same sale in the baseline's mode: no allotments, no coordinator, every purchase one
    /// Lua call on Redis, on the same HTTP stack and the same number of nodes.
    pub fn redis_only_toml(&self, sku: &str, ledger_url: &str) -> String {
        let mut text = format!(
            "mode = \"redis-only\"\n[ledger]\nurl = \"{ledger_url}\"\n\n\
             [[skus]]\nid = \"{sku}\"\ntotal = {}\nper_user_limit = 1\nqty_max = 1\n",
            self.stock
        );
        for n in 1..=self.nodes {
            text.push_str(&format!("\n[[nodes]]\nid = \"n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
        }
        text
    }
}
