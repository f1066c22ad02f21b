//! The coordinator's doors, tried as an attacker on the same network would: every `/raft/*` and
//! `/api/*` route without the cluster token, forged raft RPCs, malformed, oversized, slow and
//! misdirected calls. Each must be refused with a 4xx and change nothing (raft state, ledger,
//! nodes), the member must keep serving and the fleet keep selling.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use ledger::SkuId;
use protocol::locks::{LockAcquireRequest, LockAnswer, LockReleaseRequest};
use protocol::{CoordinatorClient, Secret};
use seckill::cluster::{Options, RunningCluster};
use seckill::config::Cluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{eventually, purchase, request, start_cluster, RedisServer};

pub const CLUSTER_TOKEN: &str = "test-cluster-token-0123456789";
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// Two nodes under a one-member coordinator (`sec1`: other tests' coordinator gauges are
/// labelled `c1`, and the metrics recorder is shared by the process) with a cluster token,
/// selling `vault` (100 units).
async fn guarded_cluster(redis: &RedisServer, data: &tempfile::TempDir) -> (RunningCluster, SocketAddr) {
    guarded_cluster_with(redis, data, "").await
}

/// [`guarded_cluster`] with `coordinator_extra` at the end of `[coordinator]` (it may open a
/// sub-table such as `[coordinator.tls]`).
async fn guarded_cluster_with(
    redis: &RedisServer,
    data: &tempfile::TempDir,
    coordinator_extra: &str,
) -> (RunningCluster, SocketAddr) {
    let port = testkit::redis::free_port().expect("free port");
    let member: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut text = format!(
        "[ledger]\nurl = \"{}\"\n\n[[skus]]\nid = \"vault\"\ntotal = 100\nbuffer = 0\n\n\
         [coordinator]\nmembers = [{{ name = \"sec1\", listen = \"{member}\" }}]\ndata_dir = {:?}\n\
         heartbeat_ms = 100\nlease_ms = 1000\ngrace_ms = 200\nfence_margin_ms = 150\n\
         election_timeout_min_ms = 100\nelection_timeout_max_ms = 200\n\
         admin_token = \"{ADMIN_TOKEN}\"\ncluster_token = \"{CLUSTER_TOKEN}\"\n{coordinator_extra}\n",
        redis.url(),
        data.path().display().to_string()
    );
    for n in 1..=2 {
        text.push_str(&format!("\n[[nodes]]\nid = \"n{n}\"\nlisten = \"127.0.0.1:0\"\n"));
    }
    let cluster = Cluster::parse(&text).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"));
    (start_cluster(&cluster, Options::default()).await, member)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `/api/state` with the right token.
async fn state(member: SocketAddr) -> serde_json::Value {
    let authorization = bearer(CLUSTER_TOKEN);
    let answer = request(member, "GET", "/api/state", &[("authorization", &authorization)], Bytes::new()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

/// What a forged call could have changed: the term (a vote), the SKU's close flag (an append),
/// the nodes and their epochs (register, heartbeat, leave), the locks.
#[derive(Debug, PartialEq)]
struct Fingerprint {
    term: u64,
    closed: bool,
    nodes: Vec<(String, u64, bool)>,
    locks: usize,
}

async fn fingerprint(member: SocketAddr) -> Fingerprint {
    let state = state(member).await;
    let applied = &state["applied"]["state"];
    let nodes = applied["fleet"]["nodes"]
        .as_object()
        .map(|nodes| {
            nodes
                .iter()
                .map(|(id, node)| {
                    (id.clone(), node["epoch"].as_u64().unwrap_or(0), node["live"].as_bool().unwrap_or(false))
                })
                .collect()
        })
        .unwrap_or_default();
    Fingerprint {
        term: state["term"].as_u64().unwrap_or(0),
        closed: applied["catalogue"]["skus"]["vault"]["terms"]["closed"].as_bool().unwrap_or(true),
        nodes,
        locks: applied["lock_table"]["held"].as_object().map_or(0, |held| held.len()),
    }
}

/// A forged append from a "leader" one term ahead, committing a `Close` of `vault` right after
/// the member's last entry: what an attacker who read `/api/state` would send.
fn forged_append(state: &serde_json::Value) -> String {
    let term = state["term"].as_u64().unwrap_or(1) + 1;
    let last = state["last_log_index"].as_u64().unwrap_or(0);
    let leader = serde_json::json!({ "term": term, "node_id": 2 });
    let prev = state["applied"]["last_applied"].clone();
    serde_json::json!({
        "vote": { "leader_id": leader, "committed": true },
        "prev_log_id": prev,
        "entries": [{
            "log_id": { "leader_id": leader, "index": last + 1 },
            "payload": { "Normal": { "Close": { "sku": "vault" } } }
        }],
        "leader_commit": { "leader_id": leader, "index": last + 1 }
    })
    .to_string()
}

/// Every internal route with a body an attacker would send.
fn forged_calls(state: &serde_json::Value) -> Vec<(&'static str, &'static str, String)> {
    let term = state["term"].as_u64().unwrap_or(1);
    let n1_epoch = state["applied"]["state"]["fleet"]["nodes"]["n1"]["epoch"].as_u64().unwrap_or(1);
    vec![
        ("POST", "/raft/append", forged_append(state)),
        (
            "POST",
            "/raft/vote",
            serde_json::json!({
                "vote": { "leader_id": { "term": term + 100, "node_id": 9 }, "committed": false },
                "last_log_id": { "leader_id": { "term": term + 100, "node_id": 9 }, "index": 1_000_000 }
            })
            .to_string(),
        ),
        ("POST", "/raft/snapshot", r#"{"vote":{},"meta":{},"offset":0,"data":[],"done":true}"#.to_string()),
        (
            "POST",
            "/api/register",
            r#"{"version":2,"node":"n9","addr":"127.0.0.1:9","instance":7}"#.replace("\"version\":2", &version()),
        ),
        (
            "POST",
            "/api/heartbeat",
            format!(
                r#"{{{},"node":"n1","epoch":{n1_epoch},"reports":{{"vault":{{"local_remaining":1000000,"sold":0}}}}}}"#,
                version()
            ),
        ),
        ("POST", "/api/leave", format!(r#"{{{},"node":"n1","epoch":{n1_epoch}}}"#, version())),
        (
            "POST",
            "/api/lock/acquire",
            r#"{"name":"sweep","owner":"attacker-owner","hold":1,"ttl_ms":10000}"#.to_string(),
        ),
        ("POST", "/api/lock/release", r#"{"name":"sweep","owner":"x","fence":1,"hold":1}"#.to_string()),
        ("POST", "/api/lock/extend", r#"{"name":"sweep","owner":"x","fence":1,"ttl_ms":10000}"#.to_string()),
        ("GET", "/api/state", String::new()),
    ]
}

fn version() -> String {
    format!("\"version\":{}", protocol::PROTOCOL_VERSION)
}

/// Goal: every internal route refuses a missing or wrong cluster token with 401 and changes
/// nothing: not the term (a forged vote), not the catalogue (a forged append carrying a `Close`),
/// not the nodes (forged register, heartbeat, leave), not the locks; the fleet still sells.
/// Method: send each forged call with no credential, a wrong token, a prefix of the token, the
/// token without the Bearer scheme and the admin token; compare the member's state and the ledger
/// before and after, then buy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_routes_refuse_a_missing_or_wrong_cluster_token_and_change_nothing() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = guarded_cluster(&redis, &data).await;
    let vault = SkuId::new("vault").unwrap();
    let ledger_before = running.ledger.status(&vault).await.unwrap();
    let before = fingerprint(member).await;
    assert!(!before.closed && before.nodes.len() == 2 && before.nodes.iter().all(|(_, _, live)| *live), "{before:?}");
    let snapshot = state(member).await;

    let prefix = bearer(&CLUSTER_TOKEN[..CLUSTER_TOKEN.len() - 1]);
    let wrong = bearer("wrong-token-wrong-token-000");
    let admin = bearer(ADMIN_TOKEN);
    let credentials: [Option<&str>; 5] = [None, Some(&wrong), Some(&prefix), Some(CLUSTER_TOKEN), Some(&admin)];
    for credential in credentials {
        for (method, path, body) in forged_calls(&snapshot) {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(value) = credential {
                headers.push(("authorization", value));
            }
            let answer = request(member, method, path, &headers, Bytes::from(body)).await;
            assert_eq!(answer.status, 401, "{method} {path} with {credential:?}: {answer:?}");
            assert_eq!(answer.error(), "unauthorized");
            assert!(!answer.raw.windows(CLUSTER_TOKEN.len()).any(|w| w == CLUSTER_TOKEN.as_bytes()));
        }
    }

    let after = fingerprint(member).await;
    assert_eq!(after, before, "nothing a forged call could change changed");
    assert_eq!(running.ledger.status(&vault).await.unwrap(), ledger_before, "the ledger is untouched");
    for (at, addr) in running.addrs().into_iter().enumerate() {
        let answer = purchase(addr, &format!("after-{at}"), "vault", &format!("buyer-{at}"), 1).await;
        assert_eq!(answer.status, 200, "node {at} still sells: {answer:?}");
    }
    let metrics = request(member, "GET", "/metrics", &[], Bytes::new()).await;
    assert!(String::from_utf8_lossy(&metrics.raw).contains("seckill_coordinator_unauthorized_total"));

    running.stop().await;
}

/// Goal: `/api/state` never shows a lock owner's token, and releasing a lock takes both the
/// cluster token and the owner token. Method: take a lock through the client (which presents the
/// cluster token), read the state, then try to release it with the right credential and a wrong
/// owner, and with the right owner and no credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_owner_tokens_never_leave_the_holder() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = guarded_cluster(&redis, &data).await;
    let client = CoordinatorClient::new(vec![member.to_string()], Secret::new(CLUSTER_TOKEN).unwrap());
    let owner = "0123456789abcdef0123456789abcdef";
    let acquire = LockAcquireRequest { name: "sweep".into(), owner: owner.into(), hold: 1, ttl_ms: 10_000 };
    let LockAnswer::LockAcquired { fence, .. } = client.acquire_lock(&acquire).await.unwrap() else {
        panic!("the lock is free");
    };
    let state = state(member).await;
    assert!(state["applied"]["state"]["lock_table"]["held"]["sweep"].is_object(), "the lock is shown: {state}");
    assert!(!state.to_string().contains(owner), "but not its owner token: {state}");

    let wrong_owner = LockReleaseRequest { name: "sweep".into(), owner: "f".repeat(32), fence, hold: 1 };
    let answer = client.release_lock(&wrong_owner).await.unwrap();
    assert!(!matches!(answer, LockAnswer::LockReleased { .. }), "a wrong owner releases nothing: {answer:?}");
    let body = serde_json::to_string(&LockReleaseRequest { name: "sweep".into(), owner: owner.into(), fence, hold: 1 })
        .unwrap();
    let forged = request(member, "POST", "/api/lock/release", &[("content-type", "application/json")], body).await;
    assert_eq!(forged.status, 401, "the owner token alone is not enough: {forged:?}");
    assert_eq!(fingerprint(member).await.locks, 1, "the lock is still held");
    running.stop().await;
}

/// Goal: with the right token, bad calls are 4xx and change nothing; slow, oversized and
/// never-finished bodies are cut off; the member keeps serving and the fleet keeps selling.
/// Method: malformed JSON, wrong shapes, wrong methods, unknown paths, an oversized declared
/// length, an oversized streamed body, 100 connections that send headers and then stall their
/// body, and 400 strangers' connections from one address that never send anything; meanwhile
/// buy on both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_calls_to_the_coordinator_are_refused_and_the_fleet_sells_on() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = guarded_cluster(&redis, &data).await;
    let before = fingerprint(member).await;
    let authorization = bearer(CLUSTER_TOKEN);
    let auth = [("authorization", authorization.as_str()), ("content-type", "application/json")];

    // Slow bodies from a credential holder, and strangers holding connections open.
    // Each from its own loopback address: until its headers are read a connection counts as a
    // stranger's, and one address may hold only a few of those at once.
    let mut stalled = Vec::new();
    for n in 0..100u8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(std::net::SocketAddr::from(([127, 0, 1, n + 1], 0))).unwrap();
        let mut stream = socket.connect(member).await.unwrap();
        let head = format!(
            "POST /api/heartbeat HTTP/1.1\r\nhost: x\r\nauthorization: {authorization}\r\ncontent-length: 1000\r\n\r\n{{"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stalled.push(stream);
    }
    // Strangers from another loopback address: one host gets a bounded share of the slots.
    let mut strangers = Vec::new();
    for _ in 0..400 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        if let Ok(stream) = socket.connect(member).await {
            strangers.push(stream);
        }
    }

    let garbage: [(&str, &str, &[u8]); 12] = [
        ("POST", "/api/heartbeat", b"{\"node\":"),
        ("POST", "/api/heartbeat", b"\x00\x01\x02\xff"),
        ("POST", "/api/register", b"[]"),
        ("POST", "/api/register", b"{\"version\":999,\"node\":\"n9\",\"addr\":\"x\",\"instance\":1}"),
        ("POST", "/api/leave", b"{\"version\":2,\"node\":\"../../etc\",\"epoch\":1}"),
        ("POST", "/api/lock/acquire", b"{\"name\":\"\",\"owner\":\"o\",\"hold\":1,\"ttl_ms\":1}"),
        ("POST", "/raft/append", b"{\"entries\":\"many\"}"),
        ("POST", "/raft/vote", b"null"),
        ("GET", "/raft/append", b""),
        ("PUT", "/api/heartbeat", b"{}"),
        ("DELETE", "/api/state", b""),
        ("POST", "/api/nothing-here", b"{}"),
    ];
    let mut statuses = Vec::new();
    for round in 0..10 {
        for (method, path, body) in garbage {
            let answer = request(member, method, path, &auth, Bytes::from_static(body)).await;
            statuses.push((method, path, answer.status.as_u16()));
        }
        let node = running.addrs()[round % 2];
        let bought = purchase(node, &format!("hostile-{round}"), "vault", &format!("buyer-{round}"), 1).await;
        assert_eq!(bought.status, 200, "the fleet sells during the abuse: {bought:?}");
    }
    for (method, path, status) in &statuses {
        assert!((400..500).contains(status), "{method} {path} got {status}");
    }

    // Over the route's limit: by declared length, and streamed (chunked, no length declared).
    let declared = format!(
        "POST /api/heartbeat HTTP/1.1\r\nhost: x\r\nauthorization: {authorization}\r\ncontent-length: 2000000\r\n\r\n{{"
    );
    assert!(raw(member, declared.as_bytes()).await.starts_with("HTTP/1.1 413"));
    let mut streamed = format!(
        "POST /raft/vote HTTP/1.1\r\nhost: x\r\nauthorization: {authorization}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..8 {
        streamed.extend_from_slice(format!("{:x}\r\n{}\r\n", 4096, " ".repeat(4096)).as_bytes());
    }
    assert!(raw(member, &streamed).await.starts_with("HTTP/1.1 413"), "a vote is small");

    // The stalled bodies are answered 408 and closed within the body timeout.
    // Past the per-address share the strangers' connections were closed at once.
    let mut shed = 0;
    for stream in &mut strangers {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(1), stream.read(&mut byte)).await {
            shed += 1;
        }
    }
    assert!(shed >= 300, "one address cannot hold more than its share of connections ({shed} of 400 shed)");
    let mut timed_out = 0;
    for mut stream in stalled {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        if read.is_ok() && String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408") {
            timed_out += 1;
        }
    }
    assert_eq!(timed_out, 100, "every stalled body was cut off with 408");
    drop(strangers);

    eventually("the member still answers", Duration::from_secs(5), || async {
        request(member, "GET", "/health", &[], Bytes::new()).await.status == 200
    })
    .await;
    let after = fingerprint(member).await;
    assert_eq!((after.term, after.closed, after.locks), (before.term, before.closed, before.locks));
    assert!(after.nodes.iter().all(|(_, _, live)| *live), "no node was expired while the member was busy: {after:?}");
    let vault = SkuId::new("vault").unwrap();
    assert_eq!(running.ledger.status(&vault).await.unwrap().sold, 10, "exactly the ten purchases sold");
    running.stop().await;
}

/// Writes `bytes` on a fresh connection (the server may close it before all are written) and
/// returns what came back before the server closed it.
async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Goal: a coordinator member or node started as its own process refuses to start without a
/// cluster token, naming the key, instead of drawing one nobody else knows.
#[test]
fn a_process_without_a_cluster_token_refuses_to_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "[[skus]]\nid = \"s\"\ntotal = 5\n[[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n\
         [coordinator]\nmembers = [{ name = \"sec1\", listen = \"127.0.0.1:0\" }]\n",
    )
    .unwrap();
    for (role, id) in [("coordinator", "sec1"), ("node", "n1")] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
            .args([role, "--id", id, "--config"])
            .arg(&config)
            .env_remove("SECKILL_CLUSTER_TOKEN")
            .output()
            .expect("run seckill");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{role} must refuse to start");
        assert!(stderr.contains("SECKILL_CLUSTER_TOKEN") && stderr.contains("cluster_token"), "{role}: {stderr}");
    }
}

/// Goal: a ledger behind `requirepass`, or reached as an ACL user, sells (ledger, fleet-wide
/// limit and blacklist store all authenticate with the URL's credentials), and a wrong password
/// fails without the password showing in any error. Method: a real redis-server started with
/// `--requirepass`, one sale through the default user's password and one through an ACL user,
/// then calls with a wrong password and a malformed URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_behind_requirepass_or_an_acl_user_sells_and_no_error_shows_the_password() {
    let redis = testkit::redis::RedisServer::start_with_password("requirepass-0123456789").expect("redis-server");
    let acl_url = redis.add_user("seckill", "acl-password-0123456789").expect("ACL user");
    let limits = "[safeguards.limits]\nfleet_per_user = { per_s = 10, burst = 10 }";
    for (url, prefix) in [(redis.url(), "by-password"), (acl_url.clone(), "by-acl-user")] {
        let cluster = crate::harness::cluster_config(
            &url,
            2,
            "[[skus]]\nid = \"vault\"\ntotal = 10",
            &format!("key_prefix = \"{prefix}\"\n{limits}"),
        );
        let running = start_cluster(&cluster, Options::default()).await;
        for (at, addr) in running.addrs().into_iter().enumerate() {
            let answer = purchase(addr, &format!("{prefix}-{at}"), "vault", &format!("u{at}"), 1).await;
            assert_eq!(answer.status, 200, "{url}: {answer:?}");
        }
        assert_eq!(running.ledger.status(&SkuId::new("vault").unwrap()).await.unwrap().sold, 2);
        running.stop().await;
    }

    let wrong = acl_url.replace("acl-password-0123456789", "wrong-password-0123456789");
    let ledger = ledger::RedisLedger::connect(ledger::RedisLedgerConfig::new(wrong.clone()));
    let error = match ledger {
        Err(e) => e.to_string(),
        Ok(ledger) => {
            use ledger::LedgerReads;
            ledger.status(&SkuId::new("vault").unwrap()).await.expect_err("a wrong password is refused").to_string()
        }
    };
    assert!(!error.contains("wrong-password") && !error.contains("acl-password"), "{error}");

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("cluster.toml");
    let malformed = "redis://seckill:acl-password-0123456789@127.0.0.1:notaport";
    std::fs::write(
        &config,
        format!("[ledger]\nurl = \"{malformed}\"\n[[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["node", "--id", "n1", "--config"])
        .arg(&config)
        .output()
        .expect("run seckill");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("ledger.url"), "{stderr}");
    assert!(!stderr.contains("acl-password"), "the config error hides the password: {stderr}");
}

/// A CA of its own, and a certificate for `127.0.0.1` signed by it for each name, written as
/// `{name}.pem` / `{name}.key` (and `ca.pem`) under `dir`.
fn make_certificates(dir: &std::path::Path, names: &[&str]) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "seckill test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    for name in names {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, *name);
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

/// `GET /health` over TLS with `client`; what came back, or the error.
async fn tls_health(member: SocketAddr, client: std::sync::Arc<rustls::ClientConfig>) -> String {
    let stream = TcpStream::connect(member).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let exchange = async {
        let mut stream = tokio_rustls::TlsConnector::from(client).connect(name, stream).await?;
        stream.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "error: timed out".into(),
    }
}

/// A TLS 1.3 client trusting the CA in `ca_dir`, presenting `identity` (the directory and name of
/// a certificate and key), or no certificate.
fn tls_client(
    ca_dir: &std::path::Path,
    identity: Option<(&std::path::Path, &str)>,
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_dir.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    std::sync::Arc::new(match identity {
        None => builder.with_no_client_auth(),
        Some((dir, name)) => {
            let chain = CertificateDer::pem_file_iter(dir.join(format!("{name}.pem")))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    })
}

/// Goal: with `[coordinator.tls]`, members and nodes talk over mutual TLS and the fleet sells,
/// while a caller without a certificate from the fleet's CA cannot get a single HTTP answer.
/// Method: a CA and certificates made here (rcgen); a one-member group and two nodes selling;
/// then `/health` on the member over plain HTTP, over TLS without a client certificate, and with
/// a certificate of another CA (all refused), and with a fleet certificate (200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mutual_tls_the_fleet_sells_and_strangers_get_no_answer() {
    let certs = tempfile::tempdir().expect("temp dir");
    make_certificates(certs.path(), &["sec1", "n1", "n2", "operator"]);
    let elsewhere = tempfile::tempdir().expect("temp dir");
    make_certificates(elsewhere.path(), &["intruder"]);
    let dir = certs.path().display().to_string();
    let tls = format!(
        "[coordinator.tls]\ncert = \"{dir}/{{name}}.pem\"\nkey = \"{dir}/{{name}}.key\"\nca = \"{dir}/ca.pem\""
    );
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("temp dir");
    let (running, member) = guarded_cluster_with(&redis, &data, &tls).await;
    for (at, addr) in running.addrs().into_iter().enumerate() {
        let answer = purchase(addr, &format!("tls-{at}"), "vault", &format!("u{at}"), 1).await;
        assert_eq!(answer.status, 200, "nodes registered over TLS and sell: {answer:?}");
    }

    let plain = raw(member, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(!plain.starts_with("HTTP/"), "plain HTTP gets no answer: {plain}");
    let anonymous = tls_health(member, tls_client(certs.path(), None)).await;
    assert!(!anonymous.contains("200 OK"), "TLS without a client certificate: {anonymous}");
    // The intruder trusts our CA (it saw our certificate) but holds a certificate of its own CA.
    let intruder = tls_health(member, tls_client(certs.path(), Some((elsewhere.path(), "intruder")))).await;
    assert!(!intruder.contains("200 OK"), "a certificate of another CA: {intruder}");
    let operator = tls_health(member, tls_client(certs.path(), Some((certs.path(), "operator")))).await;
    assert!(operator.starts_with("HTTP/1.1 200"), "a fleet certificate is served: {operator}");
    running.stop().await;
}
