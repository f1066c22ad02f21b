//! `seckill bench hot-sku` as a check, on a small sale: a SKU striped three ways over a private
//! three-master cluster sells every unit exactly once, each stripe on a master of its own, with
//! the JSON shape operators' scripts read. (Its speed is measured by the benchmark, never here.)

use seckill::dev::bench::hot_sku::{run, HotSkuPlan};

/// Goal: the benchmark's sale is right before it is fast: every unit sells (the run checks the
/// ledger's books: each stripe sold out, no unit twice, every unit moved out of one stripe
/// landed in another) and three stripes land on three masters. Method: 1 and 3 stripes, 20,000
/// units each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_hot_sku_sells_every_unit_over_three_masters() {
    let plan = HotSkuPlan { stripes: vec![1, 3], units: 20_000, callers: 2, batch: 64 };
    let bench = run(&plan).await.expect("the benchmark's sale");
    let json = serde_json::to_value(&bench).expect("json");
    for field in ["stripes", "redis_cpu_us_per_sale", "max_master_share", "sales_per_s", "transfers_per_s"] {
        assert!(json["runs"][0].get(field).is_some(), "runs[] lacks {field}: {json}");
    }
    assert!(json.get("capacity_ratio").is_some());
    for run in &bench.runs {
        assert_eq!(run.sold, 20_000, "{} stripes", run.stripes);
    }
    let striped = &bench.runs[1];
    let masters_used = striped.masters.iter().filter(|m| !m.stripes.is_empty()).count();
    assert_eq!(masters_used, 3, "three stripes on three masters: {:?}", striped.masters);
}
