//! `seckill admin …`: the client of the coordinator's admin API (README, "Admin API"). It shows
//! the cluster, creates, restocks, closes and re-buffers SKUs, and lists, adds and removes
//! blacklist entries.
//!
//! **Finding the leader is the client's job.** A SKU change sent to a follower comes back 421
//! `not_leader` with the leader's address in `leader`; the client sends it there, at most
//! [`HOPS_MAX`] times per call. Members never forward admin calls to each other: a follower's
//! answer stays cheap, and the one retry loop lives where a person can see it fail. A member that
//! cannot be reached, or that knows no leader yet (an election), makes the client try the next
//! one, within [`ATTEMPTS_MAX`] attempts in all. Reads (the cluster view, the blacklist) and
//! blacklist changes are answered by whichever member is asked first.
//!
//! **The token never goes on the command line**, where every user of the machine sees it in
//! `ps`: it comes from `--token-file PATH` (first) or `SECKILL_ADMIN_TOKEN`.
//!
//! Every admin change is idempotent on the coordinator, so sending one again after a timeout or
//! a 503 is safe; the client does not do it by itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use protocol::{Buffer, SkuTerms};

/// The environment variable the token is read from; the coordinator reads the same one.
pub const TOKEN_ENV: &str = "SECKILL_ADMIN_TOKEN";
/// 421 answers followed per call. One is enough in a stable group (a follower names the
/// leader); a few more cover a leader change during the call, and the bound stops two members
/// that disagree from sending the call back and forth.
pub const HOPS_MAX: usize = 3;
/// Requests per call, hops and retries included: every member of a 5-member group, the hops,
/// and a couple of waits for an election.
pub const ATTEMPTS_MAX: usize = 10;
/// Pause before asking again when a member knows no leader: elections take a few hundred ms.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(250);
/// Longest a connection attempt may take; members are on the operator's network.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest one call may take once connected: a change waits for the ledger and a raft write.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest answer read: the cluster view of a large fleet is well under this.
const ANSWER_BYTES_MAX: usize = 16 * 1024 * 1024;

/// One admin API call.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `GET /admin/cluster`.
    Cluster,
    /// `PUT /admin/skus/{sku}` `{"op":"create", ...terms}`: the same terms as a `[[skus]]` table.
    Create {
        sku: String,
        terms: SkuTerms,
    },
    Restock {
        sku: String,
        total: u64,
        pricing: PricingChange,
    },
    Close {
        sku: String,
    },
    SetBuffer {
        sku: String,
        buffer: Buffer,
    },
    BlacklistList,
    /// `entry` is `user:<id>` or `ip:<address>`; no `ttl_s`: until removed.
    BlacklistAdd {
        entry: String,
        ttl_s: Option<u64>,
    },
    BlacklistRemove {
        entry: String,
    },
    /// `PUT /admin/members/{member}`: one step of replacing a coordinator member.
    Member {
        member: String,
        op: MemberOp,
    },
}

/// The steps of replacing a coordinator member that lost its disk, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MemberOp {
    /// Take it out of the group (before restarting it on an empty directory).
    Remove,
    /// Add it back as a learner; answers once it has caught up.
    AddLearner,
    /// Make the caught-up learner a voter again.
    Promote,
}

impl MemberOp {
    fn wire(self) -> &'static str {
        match self {
            MemberOp::Remove => "remove",
            MemberOp::AddLearner => "add_learner",
            MemberOp::Promote => "promote",
        }
    }
}

/// What a restock changes of the terms later sales are priced on; nothing when all are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PricingChange {
    pub price: Option<u64>,
    pub currency: Option<String>,
    pub pay_timeout_s: Option<u64>,
}

impl Call {
    /// Method, path and JSON body.
    fn request(&self) -> (Method, String, Option<Value>) {
        let sku_path = |sku: &str| format!("/admin/skus/{sku}");
        match self {
            Call::Cluster => (Method::GET, "/admin/cluster".into(), None),
            Call::Create { sku, terms } => {
                let mut body = serde_json::to_value(terms).unwrap_or_default();
                body["op"] = json!("create");
                (Method::PUT, sku_path(sku), Some(body))
            }
            Call::Restock { sku, total, pricing } => {
                let mut body = json!({ "op": "restock", "total": total });
                if let Some(price) = pricing.price {
                    body["price"] = json!(price);
                }
                if let Some(currency) = &pricing.currency {
                    body["currency"] = json!(currency);
                }
                if let Some(pay_timeout_s) = pricing.pay_timeout_s {
                    body["pay_timeout_s"] = json!(pay_timeout_s);
                }
                (Method::PUT, sku_path(sku), Some(body))
            }
            Call::Close { sku } => (Method::PUT, sku_path(sku), Some(json!({ "op": "close" }))),
            Call::SetBuffer { sku, buffer } => {
                (Method::PUT, sku_path(sku), Some(json!({ "op": "set_buffer", "buffer": buffer })))
            }
            Call::BlacklistList => (Method::GET, "/admin/blacklist".into(), None),
            Call::BlacklistAdd { entry, ttl_s } => {
                let mut body = json!({ "entry": entry });
                if let Some(ttl_s) = ttl_s {
                    body["ttl_s"] = json!(ttl_s);
                }
                (Method::PUT, "/admin/blacklist".into(), Some(body))
            }
            Call::BlacklistRemove { entry } => {
                (Method::DELETE, "/admin/blacklist".into(), Some(json!({ "entry": entry })))
            }
            Call::Member { member, op } => {
                (Method::PUT, format!("/admin/members/{member}"), Some(json!({ "op": op.wire() })))
            }
        }
    }
}

/// What a member answered (any status but a followed 421).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    /// The member that answered (`host:port`): the leader, for a SKU change.
    pub member: String,
    /// 421 answers followed to get here.
    pub hops: usize,
    /// The JSON body (`null` if it was not JSON).
    pub body: Value,
}

impl Reply {
    /// The reply if it is a success; otherwise an error that says what to fix.
    pub fn success(self) -> anyhow::Result<Reply> {
        if self.status.is_success() {
            return Ok(self);
        }
        let code = self.body["error"].as_str().unwrap_or("");
        let message = self.body["message"].as_str().unwrap_or("");
        let member = &self.member;
        let status = self.status.as_u16();
        anyhow::bail!(match (status, code) {
            (401, _) => format!(
                "{member} refused the token (401): {TOKEN_ENV} or --token-file must hold the coordinator's admin \
                 token (its [coordinator] admin_token or {TOKEN_ENV})"
            ),
            (403, "admin_disabled") => format!(
                "the admin API is off at {member} (403): start the coordinator with {TOKEN_ENV} set, or set \
                 [coordinator] admin_token"
            ),
            (503, _) => format!(
                "{member} could not finish it (503 {code}): {message}; every admin change is safe to send again"
            ),
            _ => format!("{member} refused it ({status} {code}): {message}"),
        })
    }
}

/// A client for one coordinator group.
#[derive(Clone)]
pub struct AdminClient {
    members: Vec<String>,
    token: HeaderValue,
}

impl AdminClient {
    /// `members` are `host:port` addresses of the group's members, tried in order.
    pub fn new(members: Vec<String>, token: &str) -> anyhow::Result<AdminClient> {
        anyhow::ensure!(!members.is_empty(), "no coordinator member to ask: pass --coordinator host:port");
        let mut token = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("the admin token holds characters a header cannot carry"))?;
        token.set_sensitive(true);
        Ok(AdminClient { members, token })
    }

    /// Sends `call` to the members until one answers it: following 421s to the leader, moving on
    /// from members that cannot be reached or know no leader. Any answer but a followed 421 is a
    /// [`Reply`], refusals included ([`Reply::success`] turns those into errors); `Err` only when
    /// no member took the call.
    pub async fn call(&self, call: &Call) -> anyhow::Result<Reply> {
        let (method, path, body) = call.request();
        let body = Bytes::from(body.map(|b| b.to_string()).unwrap_or_default());
        let mut queue: std::collections::VecDeque<String> = self.members.iter().cloned().collect();
        // The last failure seen at each member, for the error when none took the call.
        let mut failures: BTreeMap<String, String> = BTreeMap::new();
        // Leaders a follower named that this host could not reach: a follower names the leader
        // by its advertised address, which may resolve only on the fleet's own network.
        let mut leaders_out_of_reach: Vec<String> = Vec::new();
        let mut named_leaders: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut hops = 0;
        for _ in 0..ATTEMPTS_MAX {
            let Some(member) = queue.pop_front() else { break };
            let answer = match self.send(&member, &method, &path, body.clone()).await {
                Ok(answer) => answer,
                Err(e) => {
                    if named_leaders.contains(&member) && !leaders_out_of_reach.contains(&member) {
                        leaders_out_of_reach.push(member.clone());
                    }
                    failures.insert(member, format!("{e:#}"));
                    continue;
                }
            };
            if answer.0 != StatusCode::MISDIRECTED_REQUEST {
                return Ok(Reply { status: answer.0, member, hops, body: answer.1 });
            }
            match answer.1["leader"].as_str() {
                Some(leader) if hops < HOPS_MAX => {
                    tracing::debug!(%member, %leader, "not the leader; sending the call to the leader");
                    hops += 1;
                    named_leaders.insert(leader.to_string());
                    queue.push_front(leader.to_string());
                }
                Some(leader) => {
                    failures.insert(member, format!("named {leader} as leader after {HOPS_MAX} hops already"));
                }
                None => {
                    tracing::debug!(%member, "no leader known yet; asking again");
                    failures.insert(member.clone(), "knows no leader (an election may be running)".into());
                    queue.push_back(member);
                    tokio::time::sleep(NO_LEADER_PAUSE).await;
                }
            }
        }
        let failures: Vec<String> = failures.into_iter().map(|(member, why)| format!("{member}: {why}")).collect();
        if !leaders_out_of_reach.is_empty() {
            anyhow::bail!(
                "the leader is {}, as a follower named it, and this host cannot reach that address \
                 (members name the leader by its advertised address, which may resolve only on the \
                 fleet's network); pass every member's address as reached from here to --coordinator, \
                 comma-separated (deploy/up prints them under \"admin\"), so the client can ask the \
                 leader directly ({})",
                leaders_out_of_reach.join(", "),
                failures.join("; ")
            );
        }
        anyhow::bail!(
            "no coordinator member took the call ({}); check that the coordinator runs and that \
             --coordinator (or [coordinator] members in the config) names its members",
            failures.join("; ")
        )
    }

    /// One request on a fresh connection (admin calls are rare; no pool to keep).
    async fn send(
        &self,
        member: &str,
        method: &Method,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(member))
            .await
            .map_err(|_| anyhow::anyhow!("no connection within {CONNECT_TIMEOUT:?}"))?
            .context("cannot connect")?;
        let exchange = async {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            let mut request = Request::builder().method(method.clone()).uri(path).body(Full::new(body))?;
            let headers = request.headers_mut();
            headers.insert(HOST, HeaderValue::from_str(member)?);
            headers.insert(AUTHORIZATION, self.token.clone());
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            let response = sender.send_request(request).await?;
            let status = response.status();
            let raw = Limited::new(response.into_body(), ANSWER_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
                .to_bytes();
            anyhow::Ok((status, serde_json::from_slice(&raw).unwrap_or(Value::Null)))
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {CALL_TIMEOUT:?}"))?
    }
}

/// The admin token: the file's content (trimmed) if `token_file` is given, else
/// `SECKILL_ADMIN_TOKEN`.
pub fn token(token_file: Option<&Path>) -> anyhow::Result<String> {
    let token = match token_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("--token-file {}: cannot read it", path.display()))?
            .trim()
            .to_string(),
        None => protocol::env_secret::from_env(TOKEN_ENV)?.ok_or_else(|| {
            anyhow::anyhow!(
                "no admin token (the one the coordinator was started with): {}, or pass --token-file PATH",
                protocol::env_secret::where_to_find(TOKEN_ENV)
            )
        })?,
    };
    anyhow::ensure!(
        !token.is_empty(),
        "the admin token is empty: {}",
        token_file.map_or(format!("{TOKEN_ENV} is set but empty"), |p| format!("{} is empty", p.display()))
    );
    Ok(token)
}

/// `host:port`, for `--coordinator`; a host name is resolved when connecting.
pub fn parse_member(text: &str) -> Result<String, String> {
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(text.to_string()),
        _ => Err(format!("{text:?} is not host:port")),
    }
}

/// A SKU id as the coordinator accepts it, checked before anything is sent.
pub fn parse_sku(text: &str) -> Result<String, String> {
    ledger::SkuId::new(text).map(|_| text.to_string()).map_err(|e| e.to_string())
}

/// A blacklist entry, `user:<id>` or `ip:<address>`, checked before anything is sent.
pub fn parse_entry(text: &str) -> Result<String, String> {
    let entry: safeguards::blacklist::Entry = text.parse()?;
    Ok(entry.to_string())
}

/// The human-readable form of a successful reply.
pub fn render(call: &Call, reply: &Reply) -> String {
    let body = &reply.body;
    let ledger = &body["ledger"];
    let terms = &body["terms"];
    let figures = |ledger: &Value| {
        format!("total {}, sold {}, remaining {}", ledger["total"], ledger["sold"], ledger["remaining"])
    };
    match call {
        Call::Cluster => render_cluster(body),
        Call::Create { sku, .. } => {
            let done =
                if reply.status == StatusCode::CREATED { "created:" } else { "already exists with these terms:" };
            format!(
                "{sku} {done} {}; per user limit {}, buffer {}; live nodes start selling it with their next heartbeat",
                figures(ledger),
                terms["per_user_limit"],
                plain(&terms["buffer"])
            )
        }
        Call::Restock { sku, .. } => {
            format!("{sku}: {}; the leader grants the new units to the nodes", figures(ledger))
        }
        Call::Close { sku } => format!("{sku} closed ({}); every node answers `ended` from now on", figures(ledger)),
        Call::SetBuffer { sku, .. } => format!(
            "{sku}: buffer {}; the leader keeps live allotments at remaining + buffer ({})",
            plain(&terms["buffer"]),
            figures(ledger)
        ),
        Call::BlacklistList => {
            let entries = body["entries"].as_array().cloned().unwrap_or_default();
            if entries.is_empty() {
                return format!("the blacklist is empty (version {})", body["version"]);
            }
            let width = entries.iter().map(|e| plain(&e["entry"]).len()).max().unwrap_or(0);
            let mut out = format!("{} entries (version {})\n", entries.len(), body["version"]);
            for entry in entries {
                let expiry = match entry["remaining_s"].as_u64() {
                    Some(s) => format!("{s} s left"),
                    None => "until removed".into(),
                };
                out += &format!("  {:<width$}  {expiry}\n", plain(&entry["entry"]));
            }
            out.trim_end().to_string()
        }
        Call::BlacklistAdd { entry, ttl_s } => match ttl_s {
            Some(s) => format!("blacklisted {entry} for {s} s; nodes refuse it within one blacklist sync"),
            None => format!("blacklisted {entry} until removed; nodes refuse it within one blacklist sync"),
        },
        Call::BlacklistRemove { entry } => match body["removed"].as_bool() {
            Some(true) => format!("removed {entry} from the blacklist"),
            _ => format!("{entry} was not on the blacklist"),
        },
        Call::Member { member, op } => format!(
            "{member}: {} done; voters {}, learners {}",
            op.wire(),
            plain(&body["membership"]["voters"]),
            plain(&body["membership"]["learners"])
        ),
    }
}

/// A JSON value without the quotes a string gets from `Display`.
fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The `/admin/cluster` view as two tables: nodes, then SKUs.
fn render_cluster(body: &Value) -> String {
    let leader = body["leader"].as_u64().map_or("none known".to_string(), |id| format!("member {id}"));
    let mut out = format!(
        "member {} answered; leader: {leader}; term {}; last log index {}\n",
        plain(&body["member"]),
        body["term"],
        plain(&body["last_log_index"])
    );
    let empty = serde_json::Map::new();
    let nodes = body["nodes"].as_object().unwrap_or(&empty);
    let mut rows = vec![["node", "state", "epoch", "worker", "address", "granted"].map(String::from).to_vec()];
    for (id, node) in nodes {
        let granted: Vec<String> =
            node["granted"].as_object().unwrap_or(&empty).iter().map(|(sku, units)| format!("{sku}={units}")).collect();
        rows.push(vec![
            id.clone(),
            if node["live"] == true { "live" } else { "down" }.into(),
            plain(&node["epoch"]),
            plain(&node["worker_id"]),
            plain(&node["addr"]),
            granted.join(" "),
        ]);
    }
    out += &table(&rows);
    let skus = body["skus"].as_object().unwrap_or(&empty);
    let mut rows =
        vec![["sku", "total", "sold", "remaining", "buffer", "granted to live", "state"].map(String::from).to_vec()];
    for (sku, view) in skus {
        let ledger = &view["ledger"];
        let state = match (&ledger["error"], view["terms"]["closed"] == true) {
            (Value::String(error), _) => format!("ledger unreadable: {error}"),
            (_, true) => "closed".into(),
            _ => "open".into(),
        };
        rows.push(vec![
            sku.clone(),
            plain(&ledger["total"]),
            plain(&ledger["sold"]),
            plain(&ledger["remaining"]),
            plain(&view["terms"]["buffer"]),
            plain(&view["granted_to_live_nodes"]),
            state,
        ]);
    }
    out += "\n";
    out += &table(&rows);
    out.trim_end().to_string()
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out += cells.join("  ").trim_end();
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: each call becomes the request README's "Admin API" documents, and a create sends
    /// only the terms given (the server fills in its defaults). Method: build every call.
    #[test]
    fn calls_become_the_documented_requests() {
        let terms = SkuTerms { buffer: Buffer::Percent(20), ..SkuTerms::new(500) };
        let create = Call::Create { sku: "tv-55".into(), terms };
        let (method, path, body) = create.request();
        assert_eq!((method, path.as_str()), (Method::PUT, "/admin/skus/tv-55"));
        let body = body.expect("a create has a body");
        assert_eq!((&body["op"], &body["total"], &body["buffer"]), (&json!("create"), &json!(500), &json!("20%")));
        assert!(body.get("stripes").is_none(), "one stripe is the server's default: {body}");
        let striped = Call::Create { sku: "tv-55".into(), terms: SkuTerms { stripes: 4, ..SkuTerms::new(500) } };
        assert_eq!(striped.request().2.expect("a body")["stripes"], json!(4));
        let member = Call::Member { member: "c2".into(), op: MemberOp::AddLearner };
        assert_eq!(member.request().2, Some(json!({"op": "add_learner"})));
        let restock = Call::Restock { sku: "tv-55".into(), total: 800, pricing: PricingChange::default() };
        assert_eq!(restock.request().2, Some(json!({"op": "restock", "total": 800})));
        let repriced = PricingChange { price: Some(1999), currency: Some("EUR".into()), pay_timeout_s: Some(120) };
        let restock = Call::Restock { sku: "tv-55".into(), total: 800, pricing: repriced };
        assert_eq!(
            restock.request().2,
            Some(json!({"op": "restock", "total": 800, "price": 1999, "currency": "EUR", "pay_timeout_s": 120}))
        );
        let buffer = Call::SetBuffer { sku: "tv-55".into(), buffer: Buffer::Units(5) };
        assert_eq!(buffer.request().2, Some(json!({"op": "set_buffer", "buffer": 5})));
        assert_eq!(Call::Close { sku: "tv-55".into() }.request().2, Some(json!({"op": "close"})));
        let remove = Call::BlacklistRemove { entry: "user:bob".into() };
        assert_eq!(remove.request(), (Method::DELETE, "/admin/blacklist".into(), Some(json!({"entry": "user:bob"}))));
        let add = Call::BlacklistAdd { entry: "ip:10.0.0.1".into(), ttl_s: None };
        assert_eq!(add.request().2, Some(json!({"entry": "ip:10.0.0.1"})));
        assert_eq!(Call::Cluster.request(), (Method::GET, "/admin/cluster".into(), None));
    }

    /// Goal: `--coordinator` takes host:port (names too) and refuses anything else by name.
    #[test]
    fn members_are_host_and_port() {
        assert_eq!(parse_member("127.0.0.1:7001"), Ok("127.0.0.1:7001".into()));
        assert_eq!(parse_member("coord-1.internal:7001"), Ok("coord-1.internal:7001".into()));
        for bad in ["7001", ":7001", "host:", "host:99999", "host"] {
            assert!(parse_member(bad).is_err(), "{bad}");
        }
    }

    /// Goal: refusals become errors that say what to fix. Method: the documented answers.
    #[test]
    fn refusals_name_the_fix() {
        let reply = |status: u16, body: Value| Reply {
            status: StatusCode::from_u16(status).expect("status"),
            member: "127.0.0.1:7001".into(),
            hops: 0,
            body,
        };
        let error = |r: Reply| format!("{:#}", r.success().expect_err("a refusal"));
        assert!(error(reply(401, json!({"error": "unauthorized"}))).contains(TOKEN_ENV));
        assert!(error(reply(403, json!({"error": "admin_disabled"}))).contains("admin_token"));
        let conflict = error(reply(409, json!({"error": "sku_exists", "message": "use restock"})));
        assert!(conflict.contains("409 sku_exists") && conflict.contains("use restock"), "{conflict}");
        assert!(error(reply(503, json!({"error": "unavailable"}))).contains("safe to send again"));
        assert!(reply(201, json!({})).success().is_ok());
    }

    /// Goal: a token file wins over the environment, is trimmed, and an empty one is refused.
    #[test]
    fn the_token_comes_from_a_file_trimmed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret-token-0123456789\n").expect("write");
        assert_eq!(token(Some(&path)).expect("token"), "s3cret-token-0123456789");
        std::fs::write(&path, "\n").expect("write");
        assert!(format!("{:#}", token(Some(&path)).expect_err("empty")).contains("empty"));
        let missing = format!("{:#}", token(Some(&dir.path().join("nope"))).expect_err("missing"));
        assert!(missing.contains("--token-file"), "{missing}");
    }
}
