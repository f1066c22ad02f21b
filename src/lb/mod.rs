//! Load-balancer configuration for a fleet: an nginx config that spreads purchases over the
//! nodes, micro-caches the stock page, sends the order API to the order service, and, when
//! `[load_balancer] rate_per_address` is set, limits each client address first (`limit_req`,
//! 429 past the burst) so a flood from one host never reaches the nodes. `seckill lb-config
//! nginx` prints it for the nodes `cluster.toml` lists; `seckill lb-sync` (`sync`) keeps it
//! following the coordinator's live nodes and reloads nginx when they change.
//!
//! The config runs as its header says, `nginx -p DIR -c DIR/nginx.conf`, on an empty `DIR`:
//! every path in it is relative to the prefix and one component deep, because nginx creates a
//! missing directory only as the last component of a path. Started as root, nginx hands those
//! directories to its workers' user (`nobody` by default), which must be able to reach `DIR`;
//! the header says so, and `seckill fleet up` runs the workers as itself.

use std::fmt::Write;
use std::net::SocketAddr;

use crate::config::Cluster;

pub mod sync;

/// One server of the nodes' upstream: a node's id (a comment for the operator) and the address
/// nginx connects to. nginx resolves a name once, when it loads its config, and refuses the
/// whole config if one does not resolve: `sync` writes resolved addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Upstream {
    pub id: String,
    pub addr: String,
}

/// The nodes `cluster.toml` lists, where they are reached.
pub fn listed_upstreams(cluster: &Cluster) -> Vec<Upstream> {
    cluster
        .nodes
        .iter()
        .map(|(node, place)| Upstream { id: node.id.to_string(), addr: place.advertised(place.listen) })
        .collect()
}

/// Largest request body nginx forwards; a purchase is far smaller, and the node refuses more
/// than `node_settings.body_bytes_max` anyway. Bodies up to this size stay in memory
/// (`client_body_buffer_size`), so a purchase never touches nginx's disk.
const CLIENT_BODY_MAX: &str = "16k";

/// How long nginx keeps a stock page when the node says nothing (the node's own
/// `Cache-Control: max-age`, also 1 s, takes precedence): at most one refresh per second per
/// SKU reaches the nodes however many buyers press reload. nginx counts whole seconds of its
/// clock, so a page lives 1–2 s (measured: 2 refills in a 3 s storm of 14,000 refreshes).
const STOCK_PAGE_VALID: &str = "1s";

/// A complete nginx config listening on `listen` in front of `nodes` and the rest of `cluster`.
#[expect(
    clippy::too_many_lines,
    reason = "nginx's config as one template in the order nginx reads it; split, its sections lose their context"
)]
pub fn nginx_config(cluster: &Cluster, listen: SocketAddr, nodes: &[Upstream]) -> String {
    let mut servers = String::new();
    for Upstream { id, addr } in nodes {
        let _ = writeln!(servers, "        server {addr} max_fails=3 fail_timeout=5s;  # {id}");
    }
    if nodes.is_empty() {
        // An upstream needs a server; one marked down makes every request an nginx error, which
        // the error page below answers 503.
        servers.push_str("        server 127.0.0.1:1 down;  # no live node yet\n");
    }
    let (rate_zone, rate_limit) = match &cluster.load_balancer {
        lb if lb.rate_per_address > 0 => (
            format!(
                "\n    # Per client address, before anything reaches a node: {} requests/s with a burst of\n    \
                 # {}, then 429 (10 MB of state holds ~160,000 addresses).\n    \
                 limit_req_zone $binary_remote_addr zone=per_address:10m rate={}r/s;\n    \
                 limit_req_status 429;\n",
                lb.rate_per_address, lb.burst_per_address, lb.rate_per_address
            ),
            format!("\n        limit_req zone=per_address burst={} nodelay;", lb.burst_per_address),
        ),
        _ => (String::new(), String::new()),
    };
    let (orders_upstream, orders_locations) = match cluster.orders.reached_at() {
        Some(addr) => (
            format!(
                "\n    upstream seckill_orders {{\n        server {addr};  # [orders] advertise or listen\n        keepalive 32;\n    }}\n"
            ),
            r#"
        # The order service's API: the buyer's orders and the payment provider's callbacks.
        location /v1/orders/ {
            proxy_pass http://seckill_orders;
        }
        location = /v1/me/orders {
            proxy_pass http://seckill_orders;
        }
        location ~ ^/v1/users/[^/]+/orders$ {
            proxy_pass http://seckill_orders;
        }
        location = /v1/payments/callback {
            proxy_pass http://seckill_orders;
        }
"#
            .to_string(),
        ),
        None => (String::new(), String::new()),
    };
    let (paysim_upstream, paysim_location) = sandbox_pay_route(cluster);
    let orders_upstream = orders_upstream + &paysim_upstream;
    let orders_locations = orders_locations + &paysim_location;
    format!(
        r#"# nginx in front of a seckill fleet, generated by `seckill lb-config nginx`.
# Run:  nginx -p <dir> -c <dir>/nginx.conf
# Stop: nginx -p <dir> -c <dir>/nginx.conf -s quit
#
# <dir> may start empty: nginx creates everything it writes there (pid file, error log, temp
# and stock-page cache directories; every relative path below lives under <dir>). Started as
# root, nginx runs its workers as user nobody and gives them those directories, so nobody must
# be able to reach <dir>: a directory made by `mkdir` under /srv or /tmp is fine, one under
# /root or made by `mktemp -d` (mode 700) is not. There, open it up (chmod 755) or add
# `user <the owner of dir>;` at the top of this file.

worker_processes auto;
pid nginx.pid;
error_log error.log warn;

events {{
    worker_connections 8192;
}}

http {{
    access_log off;
    client_body_temp_path client_body_temp;
    proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp;
    uwsgi_temp_path uwsgi_temp;
    scgi_temp_path scgi_temp;

    # The stock-page micro-cache: 1 MB of keys holds ~8,000 pages (one per SKU), a page nobody
    # asked for in 10 s is dropped, and use_temp_path=off writes a page straight into the cache
    # directory instead of proxy_temp.
    proxy_cache_path stock_cache levels=1 keys_zone=stock_pages:1m max_size=16m inactive=10s use_temp_path=off;
    # The buyer's page and its files: the same bytes for every buyer, so the crowd's page loads
    # are answered here (nodes send them with max-age=60).
    proxy_cache_path page_cache levels=1 keys_zone=sale_pages:1m max_size=16m inactive=10m use_temp_path=off;
{rate_zone}
    upstream seckill_nodes {{
        # Passive health checks: a node that fails 3 times within 5 s is skipped for 5 s, so a
        # dead node stops costing a failed attempt per request.
{servers}
        # Keep-alive connections to the nodes: a new TCP connection per purchase would cost
        # more than the purchase.
        keepalive 128;
    }}
{orders_upstream}
    server {{
        listen {listen} backlog=4096;
        client_max_body_size {CLIENT_BODY_MAX};
        client_body_buffer_size {CLIENT_BODY_MAX};
        client_header_timeout 10s;
        client_body_timeout 10s;{rate_limit}

        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        # Nodes trust this header only from proxies listed as trusted in their config.
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;

        # Retry on the next node only when a node could not be reached. A purchase that may
        # have reached a node is never re-sent: without `non_idempotent`, nginx does not pass a
        # POST to another node once it was sent, so a node that dies mid-request answers the
        # client 502 and the client retries with the same Idempotency-Key, whose stored
        # decision in the ledger makes the retry safe. Re-sending here would be safe too (same
        # key), but would hide from the client that the outcome was unknown and double the load
        # exactly when a node is failing.
        proxy_next_upstream error timeout;
        proxy_next_upstream_tries 2;
        proxy_connect_timeout 250ms;
        proxy_send_timeout 5s;
        proxy_read_timeout 5s;

        # When nginx itself cannot get an answer (no node up, a node gone mid-request, none
        # answering in time), the buyer hears what a node says when it cannot decide: 503, try
        # again in a second with the same Idempotency-Key, which makes the retry safe whatever
        # became of the first attempt. A node's own answers pass through unchanged.
        error_page 502 504 =503 @unavailable;
        location @unavailable {{
            default_type application/json;
            add_header Retry-After 1 always;
            return 503 '{{"error":"unavailable","message":"no node answered; retry with the same Idempotency-Key"}}';
        }}

        # Purchases, tokens, health and metrics: never cached.
        location / {{
            proxy_pass http://seckill_nodes;
        }}

        # The stock page, micro-cached: a refresh storm is answered here, and one request per
        # SKU per second reaches a node. Its figures are already up to a refresh period old on
        # the node, and no purchase is decided from them, so a second more costs nothing.
        location /v1/skus/ {{
            proxy_pass http://seckill_nodes;
            proxy_cache stock_pages;
            # Only GET and HEAD are ever cached, so a POST here goes to a node every time.
            proxy_cache_methods GET HEAD;
            # The path without the query: the node ignores the query, and `?_=<time>` cache
            # busters must not turn a storm into one node request each.
            proxy_cache_key $uri;
            proxy_cache_valid 200 {STOCK_PAGE_VALID};
            # When a page expires, one request refreshes it; the others get the page being
            # replaced instead of queueing behind it or going to the nodes too.
            proxy_cache_lock on;
            proxy_cache_lock_timeout 2s;
            proxy_cache_lock_age 2s;
            proxy_cache_use_stale updating;
            add_header X-Cache-Status $upstream_cache_status always;
        }}

        # The buyer's page (/sale/{{sku}}, one page for every SKU) and its files, cached.
        location ~ ^/(sale|web)/ {{
            proxy_pass http://seckill_nodes;
            proxy_cache sale_pages;
            proxy_cache_methods GET HEAD;
            proxy_cache_key $uri;
            proxy_cache_lock on;
            proxy_cache_use_stale updating error timeout;
            add_header X-Cache-Status $upstream_cache_status always;
        }}

        # A waiter's event stream: held open, events passed on as they come (the node also says
        # X-Accel-Buffering: no), and kept alive by the node's comment every 15 s. If its node
        # dies the browser reconnects through here to another, keeping its place.
        location ~ ^/v1/room/[^/]+/events$ {{
            proxy_pass http://seckill_nodes;
            proxy_buffering off;
            proxy_read_timeout 60s;
        }}
{orders_locations}    }}
}}
"#
    )
}

/// With the sandbox provider (`[payments] provider = "sandbox"`), its "the buyer pays" route on
/// the page's origin, so the buyer's page can complete a sandbox payment (the sandbox sends no
/// CORS headers). Only the sandbox: a real provider's checkout is its own site.
fn sandbox_pay_route(cluster: &Cluster) -> (String, String) {
    let url = match (&cluster.payments.provider[..], &cluster.payments.url) {
        ("sandbox", Some(url)) => url,
        _ => return (String::new(), String::new()),
    };
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    (
        format!("\n    upstream seckill_paysim {{\n        server {host};  # [payments] url (the sandbox)\n    }}\n"),
        r#"
        # The sandbox provider's "the buyer pays" (test fleets only: whoever reaches it settles
        # sandbox payments).
        location ~ ^/v1/payments/[A-Za-z0-9_-]+/pay$ {
            limit_except POST { deny all; }
            proxy_pass http://seckill_paysim;
        }
"#
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated() -> (Cluster, String) {
        let cluster = Cluster::parse(crate::config::DEFAULT_CLUSTER_TOML).unwrap();
        let text = nginx_config(&cluster, "127.0.0.1:8080".parse().unwrap(), &listed_upstreams(&cluster));
        (cluster, text)
    }

    /// The text of the `location` block opening with `opening`.
    fn location<'a>(text: &'a str, opening: &str) -> &'a str {
        let start = text.find(opening).unwrap_or_else(|| panic!("no `{opening}` in\n{text}"));
        let block = &text[start..];
        &block[..block.find("\n        }").expect("block end")]
    }

    #[test]
    fn every_node_is_an_upstream_and_posts_are_not_resent() {
        let (cluster, text) = generated();
        for Upstream { addr, .. } in listed_upstreams(&cluster) {
            assert!(text.contains(&format!("server {addr} max_fails=3")), "{addr} missing");
        }
        assert!(text.contains("proxy_next_upstream error timeout;"));
        let resends_posts = text
            .lines()
            .any(|line| line.trim_start().starts_with("proxy_next_upstream ") && line.contains("non_idempotent"));
        assert!(!resends_posts, "a purchase that may have reached a node must not be re-sent");
    }

    #[test]
    fn only_the_stock_page_is_cached_and_never_a_post() {
        let (_, text) = generated();
        assert!(!location(&text, "location / {").contains("proxy_cache"), "purchases go through uncached");
        let stock = location(&text, "location /v1/skus/ {");
        for directive in ["proxy_cache stock_pages;", "proxy_cache_lock on;", "proxy_cache_use_stale updating;"] {
            assert!(stock.contains(directive), "{directive} missing from\n{stock}");
        }
        let methods = stock.lines().map(str::trim).find(|line| line.starts_with("proxy_cache_methods"));
        assert_eq!(methods, Some("proxy_cache_methods GET HEAD;"), "POST must never be cached");
    }

    #[test]
    fn the_sale_page_is_cached_and_a_waiters_stream_is_passed_on_unbuffered() {
        let (_, text) = generated();
        let page = location(&text, "location ~ ^/(sale|web)/ {");
        for directive in ["proxy_cache sale_pages;", "proxy_cache_methods GET HEAD;", "proxy_cache_lock on;"] {
            assert!(page.contains(directive), "{directive} missing from\n{page}");
        }
        let events = location(&text, "location ~ ^/v1/room/[^/]+/events$ {");
        assert!(events.contains("proxy_buffering off;") && !events.contains("proxy_cache"), "{events}");
        assert!(events.contains("proxy_read_timeout 60s;"), "longer than the node's 15 s keep-alive: {events}");
    }

    #[test]
    fn the_per_address_limit_is_off_unless_configured() {
        let (_, text) = generated();
        assert!(!text.contains("limit_req"), "off by default");
        let toml = format!(
            "{}\n[load_balancer]\nrate_per_address = 20\nburst_per_address = 40\n",
            crate::config::DEFAULT_CLUSTER_TOML
        );
        let cluster = Cluster::parse(&toml).unwrap();
        let text = nginx_config(&cluster, "127.0.0.1:8080".parse().unwrap(), &listed_upstreams(&cluster));
        assert!(text.contains("limit_req_zone $binary_remote_addr zone=per_address:10m rate=20r/s;"), "{text}");
        assert!(text.contains("limit_req zone=per_address burst=40 nodelay;"));
        assert!(text.contains("limit_req_status 429;"));
    }

    #[test]
    fn the_order_api_goes_to_the_order_service() {
        let (cluster, text) = generated();
        let orders = cluster.orders.listen.expect("the default config's order API");
        assert!(text.contains(&format!("server {orders};  # [orders] advertise or listen")), "{text}");
        for opening in [
            "location /v1/orders/ {",
            "location = /v1/me/orders {",
            "location ~ ^/v1/users/[^/]+/orders$ {",
            "location = /v1/payments/callback {",
        ] {
            assert!(location(&text, opening).contains("proxy_pass http://seckill_orders;"), "{opening}");
        }
        let toml = crate::config::DEFAULT_CLUSTER_TOML.replace("listen = \"127.0.0.1:8090\"", "");
        let cluster = Cluster::parse(&toml).unwrap();
        let text = nginx_config(&cluster, "127.0.0.1:8080".parse().unwrap(), &listed_upstreams(&cluster));
        assert!(!text.contains("seckill_orders"), "no order API, no route to it");
    }

    /// nginx creates a missing directory only as the last component of its path, so a path with
    /// a `/` would need a directory the operator must create first.
    #[test]
    fn every_path_nginx_writes_is_one_component_under_the_prefix() {
        let (_, text) = generated();
        let directives = ["pid", "error_log", "client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path"];
        let directives = [&directives[..], &["uwsgi_temp_path", "scgi_temp_path", "proxy_cache_path"]].concat();
        for directive in directives {
            let line = text
                .lines()
                .find(|line| line.trim_start().starts_with(&format!("{directive} ")))
                .unwrap_or_else(|| panic!("no {directive}"));
            let path = line.split_whitespace().nth(1).expect("a path");
            assert!(!path.contains('/'), "{directive} {path} is not one component under the prefix");
        }
    }

    /// Goal: what nginx itself cannot answer (no node up, a node gone mid-request) reaches the
    /// buyer as the nodes' own "try again" (503 with Retry-After), never as a bare 502 or 504;
    /// and a fleet with no live node yet still has a config nginx loads.
    #[test]
    fn nginx_made_errors_are_a_retryable_503_and_an_empty_fleet_still_loads() {
        let cluster = Cluster::parse(crate::config::DEFAULT_CLUSTER_TOML).unwrap();
        let text = nginx_config(&cluster, "127.0.0.1:8080".parse().unwrap(), &[]);
        assert!(text.contains("error_page 502 504 =503 @unavailable;"), "{text}");
        let unavailable = location(&text, "location @unavailable {");
        assert!(unavailable.contains("add_header Retry-After 1 always;") && unavailable.contains("return 503"));
        assert!(text.contains("server 127.0.0.1:1 down;  # no live node yet"), "an upstream needs a server");
    }
}
