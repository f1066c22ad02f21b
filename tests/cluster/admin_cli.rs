//! `seckill admin` against a three-member coordinator group in this process: the client is given
//! a follower, follows its 421 to the leader, and the change takes effect in the ledger and on
//! the nodes. The client logic runs as a library call; one test runs the real binary.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledger::SkuId;
use seckill::admin::{self as admin_cli, AdminClient, Call, Reply};
use seckill::cluster::{Options, RunningCluster};
use seckill::config::{Buffer, Cluster};

use crate::admin::{CHANGE_VISIBLE, TOKEN};
use crate::harness::{eventually, get, purchase, start_cluster};

/// Longest a three-member group may take to agree on a leader.
const ELECTION_MAX: Duration = Duration::from_secs(10);

/// A running group and its members' addresses, in config order (member `i` has raft id `i + 1`).
struct Group {
    running: RunningCluster,
    members: Vec<SocketAddr>,
    _data: tempfile::TempDir,
}

impl Group {
    /// Three coordinator members and two nodes in this process, on the embedded ledger,
    /// selling `phone` (30 units), with the admin token [`TOKEN`].
    async fn start() -> Group {
        let data = tempfile::tempdir().expect("temp dir");
        let members: Vec<SocketAddr> = (0..3)
            .map(|_| format!("127.0.0.1:{}", testkit::redis::free_port().expect("free port")))
            .map(|addr| addr.parse().expect("addr"))
            .collect();
        let listed: Vec<String> = members
            .iter()
            .enumerate()
            .map(|(at, addr)| format!("{{ name = \"c{}\", listen = \"{addr}\" }}", at + 1))
            .collect();
        let mut text = format!(
            "[ledger]\nurl = \"embedded\"\n\n[[skus]]\nid = \"phone\"\ntotal = 30\nbuffer = 0\n\n\
             [coordinator]\nmembers = [{}]\ndata_dir = {:?}\n\
             heartbeat_ms = 100\nlease_ms = 1000\ngrace_ms = 200\nfence_margin_ms = 150\n\
             election_timeout_min_ms = 100\nelection_timeout_max_ms = 200\nadmin_token = \"{TOKEN}\"\n",
            listed.join(", "),
            data.path().display().to_string()
        );
        for n in 1..=2 {
            text.push_str(&format!("\n[[nodes]]\nid = \"n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
        }
        let cluster = Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"));
        let running = start_cluster(&cluster, Options::default()).await;
        Group { running, members, _data: data }
    }

    /// The leader's and a follower's addresses, once every member names the same leader.
    async fn leader_and_follower(&self) -> (SocketAddr, SocketAddr) {
        let deadline = Instant::now() + ELECTION_MAX;
        loop {
            let leaders: Vec<Option<u64>> = self.running.members.iter().map(|m| m.status().leader).collect();
            if let Some(Some(leader)) = leaders.first().filter(|first| leaders.iter().all(|l| l == *first)) {
                let at = *leader as usize - 1;
                let follower = (at + 1) % self.members.len();
                return (self.members[at], self.members[follower]);
            }
            assert!(Instant::now() < deadline, "the members did not agree on a leader: {leaders:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn call(client: &AdminClient, call: &Call) -> Reply {
    client.call(call).await.unwrap_or_else(|e| panic!("{call:?}: {e:#}"))
}

/// Goal: every admin write sent to a follower is carried to the leader by the client and takes
/// effect: a created SKU sells on every node, a restock raises the ledger's total, a buffer
/// change is in the terms, a close ends sales, blacklist changes show in the list.
/// Method: a client that knows only a follower; check the ledger, the nodes and the replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_writes_sent_to_a_follower_reach_the_leader_and_take_effect() {
    let group = Group::start().await;
    let (leader, follower) = group.leader_and_follower().await;
    let client = AdminClient::new(vec![follower.to_string()], TOKEN).expect("client");
    let nodes = group.running.addrs();
    let ledger = group.running.ledger.clone();

    let create = Call::Create {
        sku: "drop".into(),
        terms: protocol::SkuTerms { buffer: Buffer::Units(0), ..protocol::SkuTerms::new(60) },
    };
    let created = call(&client, &create).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!((created.member.as_str(), created.hops), (leader.to_string().as_str(), 1), "answered by the leader");
    let drop_sku = SkuId::new("drop").unwrap();
    assert_eq!(ledger.status(&drop_sku).await.unwrap().total, 60);
    for &node in &nodes {
        eventually("every node sells the created SKU", CHANGE_VISIBLE, || async move {
            get(node, "/v1/skus/drop").await.status == 200
        })
        .await;
    }
    assert!(
        admin_cli::render(&create, &created).starts_with("drop created: total 60"),
        "{}",
        admin_cli::render(&create, &created)
    );
    let again = call(&client, &create).await;
    assert_eq!(again.status, 200, "the same create again is a no-op: {again:?}");

    let restocked = call(&client, &Call::Restock { sku: "drop".into(), total: 90, pricing: Default::default() })
        .await
        .success()
        .expect("restock");
    assert_eq!(restocked.body["ledger"]["total"], 90);
    assert_eq!(ledger.status(&drop_sku).await.unwrap().total, 90);
    let lower = call(&client, &Call::Restock { sku: "drop".into(), total: 10, pricing: Default::default() }).await;
    let refused = format!("{:#}", lower.success().expect_err("a lower total is refused"));
    assert!(refused.contains("409 total_below_current"), "{refused}");

    let buffered = call(&client, &Call::SetBuffer { sku: "drop".into(), buffer: Buffer::Percent(50) }).await;
    assert_eq!((buffered.status.as_u16(), buffered.body["terms"]["buffer"].as_str()), (200, Some("50%")));

    let closed = call(&client, &Call::Close { sku: "phone".into() }).await.success().expect("close");
    assert_eq!(closed.body["ledger"]["closed"], true);
    let phone = SkuId::new("phone").unwrap();
    assert!(ledger.status(&phone).await.unwrap().closed);
    for (at, &node) in nodes.iter().enumerate() {
        let answer = purchase(node, &format!("after-close-{at}"), "phone", &format!("late{at}"), 1).await;
        assert_eq!((answer.status.as_u16(), answer.error()), (403, "ended"), "node {at}: {answer:?}");
    }

    let ban = Call::BlacklistAdd { entry: "user:mallory".into(), ttl_s: Some(600) };
    call(&client, &ban).await.success().expect("blacklist add");
    let listed = call(&client, &Call::BlacklistList).await.success().expect("blacklist list");
    let entries = listed.body["entries"].as_array().cloned().unwrap_or_default();
    assert!(entries.iter().any(|e| e["entry"] == "user:mallory"), "{listed:?}");
    let text = admin_cli::render(&Call::BlacklistList, &listed);
    assert!(text.contains("user:mallory") && text.contains("s left"), "{text}");
    let removed = call(&client, &Call::BlacklistRemove { entry: "user:mallory".into() }).await;
    assert_eq!(removed.body["removed"], true, "{removed:?}");

    // Reads are answered by the member asked, follower or not.
    let view = call(&client, &Call::Cluster).await.success().expect("cluster");
    assert_eq!((view.member.as_str(), view.hops), (follower.to_string().as_str(), 0));
    let text = admin_cli::render(&Call::Cluster, &view);
    assert!(text.contains("drop") && text.contains("phone") && text.contains("closed"), "{text}");
    group.running.stop().await;
}

/// Goal: the client gets past members it cannot reach, and a refused token is an error that
/// names what to set. Method: a dead address listed first; then a wrong token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_client_skips_unreachable_members_and_names_a_bad_token() {
    let group = Group::start().await;
    let (_, follower) = group.leader_and_follower().await;
    let dead = format!("127.0.0.1:{}", testkit::redis::free_port().expect("free port"));
    let client = AdminClient::new(vec![dead.clone(), follower.to_string()], TOKEN).expect("client");
    let restocked = call(&client, &Call::Restock { sku: "phone".into(), total: 40, pricing: Default::default() })
        .await
        .success()
        .expect("restock");
    assert_eq!(restocked.body["ledger"]["total"], 40);

    let nobody = AdminClient::new(vec![dead.clone()], TOKEN).expect("client");
    let error = format!("{:#}", nobody.call(&Call::Cluster).await.expect_err("nobody answers"));
    assert!(error.contains(&dead) && error.contains("--coordinator"), "{error}");

    let wrong = AdminClient::new(vec![follower.to_string()], "not-the-admin-token").expect("client");
    let reply = call(&wrong, &Call::Restock { sku: "phone".into(), total: 50, pricing: Default::default() }).await;
    assert_eq!(reply.status, 401);
    let error = format!("{:#}", reply.success().expect_err("refused"));
    assert!(error.contains("SECKILL_ADMIN_TOKEN") && error.contains("--token-file"), "{error}");
    assert_eq!(group.running.ledger.status(&SkuId::new("phone").unwrap()).await.unwrap().total, 40);
    group.running.stop().await;
}

/// Goal: when a follower names a leader by an address this host cannot reach (a Compose
/// fleet's members advertise `c2:7000`, which resolves only on the fleet's network), the error
/// names that leader and says to pass every member. Method: a stand-in follower that answers
/// every call 421 naming `leader.invalid:7000`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_leader_out_of_reach_is_named_with_the_fix() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let follower = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            let body = r#"{"error":"not_leader","message":"ask the leader","leader":"leader.invalid:7000"}"#;
            let answer = format!(
                "HTTP/1.1 421 Misdirected Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    let client = AdminClient::new(vec![follower.to_string()], TOKEN).expect("client");
    let change = Call::Restock { sku: "phone".into(), total: 40, pricing: Default::default() };
    let error = format!("{:#}", client.call(&change).await.expect_err("the leader is out of reach"));
    assert!(
        error.contains("leader.invalid:7000") && error.contains("every member") && error.contains("--coordinator"),
        "{error}"
    );
}

/// Goal: the `seckill admin` binary follows a follower's 421 to the leader and prints the JSON
/// answer, and without a token says how to give one. Method: run the built binary against a
/// follower, with `SECKILL_ADMIN_TOKEN` set and then unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_command_follows_the_leader_and_asks_for_a_token() {
    let group = Group::start().await;
    let (_, follower) = group.leader_and_follower().await;
    let follower = follower.to_string();
    let admin = |args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill"));
        command.arg("admin").args(args).args(["--coordinator", &follower]).env_remove("RUST_LOG");
        command
    };
    let output = admin(&["restock", "phone", "--total", "45", "--json"])
        .env(admin_cli::TOKEN_ENV, TOKEN)
        .output()
        .await
        .expect("run seckill admin");
    assert!(output.status.success(), "seckill admin failed: {}", String::from_utf8_lossy(&output.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object on stdout");
    assert_eq!(answer["ledger"]["total"], 45, "{answer}");
    assert!(output.stderr.is_empty(), "nothing on stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(group.running.ledger.status(&SkuId::new("phone").unwrap()).await.unwrap().total, 45);

    let output = admin(&["cluster"]).env_remove(admin_cli::TOKEN_ENV).output().await.expect("run seckill admin");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("SECKILL_ADMIN_TOKEN") && stderr.contains("--token-file"), "{stderr}");
    group.running.stop().await;
}
