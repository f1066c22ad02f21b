//! The named scenarios of design.md, so figures compare across runs.

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
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "small",
        stock: 1_000,
        nodes: 3,
        requests: 20_000,
        users: 2_000,
        concurrency: 64,
        kill_at_sold: None,
    },
    Scenario {
        name: "failover",
        stock: 1_000,
        nodes: 3,
        requests: 20_000,
        users: 2_000,
        concurrency: 64,
        kill_at_sold: Some(0.3),
    },
    Scenario {
        name: "standard",
        stock: 10_000,
        nodes: 3,
        requests: 1_000_000,
        users: 100_000,
        concurrency: 256,
        kill_at_sold: None,
    },
    Scenario {
        name: "standard-failover",
        stock: 10_000,
        nodes: 3,
        requests: 1_000_000,
        users: 100_000,
        concurrency: 256,
        kill_at_sold: Some(0.3),
    },
];

pub fn find(name: &str) -> Option<Scenario> {
    SCENARIOS.iter().copied().find(|s| s.name == name)
}

pub fn names() -> Vec<&'static str> {
    SCENARIOS.iter().map(|s| s.name).collect()
}

impl Scenario {
    /// A `cluster.toml` for this scenario: `nodes` nodes on free ports, one SKU, one unit per
    /// user and per order, the default 10% buffer.
    pub fn cluster_toml(&self, sku: &str, ledger_url: &str) -> String {
        let mut text = format!("[ledger]\nurl = \"{ledger_url}\"\n\n[[skus]]\nid = \"{sku}\"\ntotal = {}\nper_user_limit = 1\nqty_max = 1\n", self.stock);
        for n in 1..=self.nodes {
            text.push_str(&format!("\n[[nodes]]\nid = \"n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
        }
        text
    }
}
