//! The ledger failing under the nodes: Redis killed, paused, or restarted without its data.

use std::time::Duration;

use ledger::{LedgerError, SkuId};
use seckill::cluster::Options;

use crate::harness::{cluster_config, eventually, get, purchase, start_cluster, RedisServer};

fn local_remaining(page: &crate::harness::Answer) -> u64 {
    page.body["local_remaining"].as_u64().expect("stock page has local_remaining")
}

/// Goal: with Redis dead, buyers get 503 `unavailable` with Retry-After, local units are not
/// lost, nothing is oversold; when Redis returns, sales resume and the books reconcile.
/// Method: sell 5, SIGKILL Redis, try 5 more (503), restart Redis on its AOF, retry those same
/// 5 keys until they decide, then sell out and compare every count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_sale_answers_503_then_resumes_and_reconciles() {
    let mut redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 2, "[[skus]]\nid = \"tv\"\ntotal = 20\nbuffer = 0", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    let mut purchased = 0;
    for n in 0..5 {
        let answer = purchase(addrs[n % 2], &format!("before-{n}"), "tv", &format!("u{n}"), 1).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        purchased += 1;
    }
    let local_before = local_remaining(&get(addrs[0], "/v1/skus/tv").await);

    redis.kill();
    for n in 0..5 {
        let answer = purchase(addrs[0], &format!("during-{n}"), "tv", &format!("v{n}"), 1).await;
        assert_eq!((answer.status.as_u16(), answer.error()), (503, "unavailable"), "{answer:?}");
        assert!(answer.headers.contains_key("retry-after"), "503 must say when to retry");
    }
    assert_eq!(
        local_remaining(&get(addrs[0], "/v1/skus/tv").await),
        local_before,
        "units taken for failed confirmations came back"
    );

    redis.restart();
    for n in 0..5 {
        let key = format!("during-{n}");
        let mut answer = purchase(addrs[0], &key, "tv", &format!("v{n}"), 1).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while answer.status == 503 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer = purchase(addrs[0], &key, "tv", &format!("v{n}"), 1).await;
        }
        assert_eq!(answer.status, 200, "the retried key decides once Redis is back: {answer:?}");
        purchased += 1;
    }
    for n in 0..40 {
        // A node whose allotment is empty while the ledger has stock says 503: the buyer retries
        // with the same key on the other node.
        let (key, user) = (format!("after-{n}"), format!("w{n}"));
        let mut answer = purchase(addrs[n % 2], &key, "tv", &user, 1).await;
        if answer.status == 503 {
            answer = purchase(addrs[(n + 1) % 2], &key, "tv", &user, 1).await;
        }
        match answer.status.as_u16() {
            200 => purchased += 1,
            409 => assert_eq!(answer.error(), "sold_out"),
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    let status = running.ledger.status(&SkuId::new("tv").unwrap()).await.unwrap();
    running.stop().await;
    assert_eq!(purchased, 20, "every unit sold once: buyers were told 'purchased' 20 times");
    assert_eq!((status.sold, status.remaining), (20, 0));
    assert_eq!(status.sold_by_node.values().sum::<u64>(), 20);
}

/// Goal: a Redis that comes back empty is not taken as a fresh sale: nodes refuse to sell, and
/// nothing recreates the SKU behind the operator's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_makes_nodes_refuse_the_sku() {
    let mut redis = RedisServer::start();
    let cluster = cluster_config(
        &redis.url(),
        2,
        "[[skus]]\nid = \"lost\"\ntotal = 50",
        "[node_settings]\nstatus_refresh_ms = 50",
    );
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    assert_eq!(purchase(addr, "k0", "lost", "u0", 1).await.status, 200);

    redis.restart_empty();
    // The first calls may fail on the connection the restart broke; once the ledger answers
    // again, its answer must be "no record", never a sale.
    eventually("the ledger answers again", Duration::from_secs(5), || async {
        let answer = purchase(addr, "probe", "lost", "probe", 1).await;
        assert_eq!(answer.status, 503, "{answer:?}");
        answer.body["message"].as_str().unwrap_or("").contains("no record")
    })
    .await;
    for n in 1..10 {
        let answer = purchase(addr, &format!("k{n}"), "lost", &format!("u{n}"), 1).await;
        assert_eq!((answer.status.as_u16(), answer.error()), (503, "unavailable"), "{answer:?}");
        assert!(answer.body["message"].as_str().unwrap_or("").contains("no record"), "{answer:?}");
    }
    eventually("nodes report not ready", Duration::from_secs(5), || async { get(addr, "/ready").await.status == 503 })
        .await;
    let status = running.ledger.status(&SkuId::new("lost").unwrap()).await;
    running.stop().await;
    assert!(matches!(status, Err(LedgerError::Missing(_))), "the SKU must stay missing: {status:?}");
}

/// Goal: while a key's confirmation is pending on a node, the same key on that node is told
/// `in_progress` instead of queueing a second sale. Method: SIGSTOP Redis so the first
/// confirmation hangs, send the key again, then SIGCONT and let the first finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_while_its_confirmation_is_pending_is_in_progress() {
    let redis = RedisServer::start();
    // Ledger calls must outlast the pause, or the first request would get 503 instead.
    let settings = "call_timeout_ms = 5000\n[node_settings]\nconfirm_timeout_ms = 6000";
    let cluster = cluster_config(&redis.url(), 1, "[[skus]]\nid = \"slow\"\ntotal = 10\nbuffer = 0", settings);
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];

    redis.pause();
    let first = tokio::spawn(async move { purchase(addr, "dup", "slow", "u", 1).await });
    eventually("the first request holds its unit", Duration::from_secs(5), || async {
        local_remaining(&get(addr, "/v1/skus/slow").await) == 9
    })
    .await;
    let second = purchase(addr, "dup", "slow", "u", 1).await;
    redis.resume();
    let first = first.await.unwrap();

    assert_eq!((second.status.as_u16(), second.error()), (409, "in_progress"), "{second:?}");
    assert_eq!(first.status, 200, "{first:?}");
    let status = running.ledger.status(&SkuId::new("slow").unwrap()).await.unwrap();
    running.stop().await;
    assert_eq!(status.sold, 1);
}
