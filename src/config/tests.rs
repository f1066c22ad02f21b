use std::time::Duration;

use super::*;

const MINIMAL: &str = r#"
    [[nodes]]
    id = "n1"
    listen = "127.0.0.1:0"
    [[nodes]]
    id = "n2"
    listen = "127.0.0.1:0"
    [[skus]]
    id = "s"
    total = 101
"#;

fn error_of(text: &str) -> String {
    Cluster::parse(text).expect_err("config must be refused").to_string()
}

#[test]
fn the_shipped_cluster_toml_is_valid() {
    let cluster = Cluster::parse(DEFAULT_CLUSTER_TOML).unwrap();
    assert!(!cluster.nodes.is_empty() && !cluster.skus.is_empty());
}

#[test]
fn durability_is_a_known_mode_and_replica_settings_need_replica() {
    let redis = |ledger: &str| format!("[ledger]\nurl = \"redis://127.0.0.1:1\"\n{ledger}\n{MINIMAL}");
    let parsed = Cluster::parse(&redis("durability = \"replica\"\nreplicas = 2")).unwrap();
    assert_eq!(
        parsed.ledger.durability().unwrap(),
        ::ledger::Durability::Replica { replicas: 2, timeout: Duration::from_millis(REPLICA_TIMEOUT_MS_DEFAULT) }
    );
    assert_eq!(Cluster::parse(&redis("")).unwrap().ledger.durability().unwrap(), ::ledger::Durability::None);
    assert!(error_of(&redis("durability = \"sync\"")).starts_with("ledger.durability"));
    assert!(error_of(&redis("replicas = 1")).starts_with("ledger.replicas"));
    assert!(error_of(&redis("durability = \"replica\"\nreplicas = 0")).starts_with("ledger.replicas"));
    let slow = "durability = \"replica\"\nreplica_timeout_ms = 500\ncall_timeout_ms = 500";
    assert!(error_of(&redis(slow)).starts_with("ledger.replica_timeout_ms"));
    assert!(error_of(&format!("[ledger]\ndurability = \"fsync\"\n{MINIMAL}")).starts_with("ledger.durability"));
}

/// Goal: a config whose sale records would expire before an unpaid order's release is
/// refused, naming the setting, at the limit too; the pay timeout alone no longer depends on
/// the idempotency TTL.
#[test]
fn sale_records_outlive_every_pay_timeout_by_an_outage() {
    let config = |ledger: &str, pay_timeout_s: u64| {
        format!(
            "[ledger]\n{ledger}\n{}",
            MINIMAL.replace("total = 101", &format!("total = 5\npay_timeout_s = {pay_timeout_s}"))
        )
    };
    let at_limit = config("sale_record_ttl_s = 4500", 900);
    assert_eq!(Cluster::parse(&at_limit).unwrap().ledger.sale_record_ttl_s, 4500);
    let short = error_of(&config("sale_record_ttl_s = 4499", 900));
    assert!(short.starts_with("ledger.sale_record_ttl_s") && short.contains("skus[0].pay_timeout_s"), "{short}");
    let short_idempotency = config("idempotency_ttl_s = 60", 900);
    assert!(Cluster::parse(&short_idempotency).is_ok(), "releases no longer need the idempotency record");
    assert_eq!(Cluster::parse(MINIMAL).unwrap().ledger.sale_record_ttl_s, 172_800);
    // A started payment stretches an order's life by the grace and the queries.
    let payments = "\n[payments]\nprovider = \"sandbox\"\nurl = \"http://127.0.0.1:8095\"\n\
                    callback_url = \"http://127.0.0.1:8090/v1/payments/callback\"\npay_grace_s = 60\nquery_limit_s = 40";
    let stretched = config("sale_record_ttl_s = 4600", 900) + payments;
    assert_eq!(Cluster::parse(&stretched).unwrap().payments.deadline_stretch_s(), 100);
    let short = error_of(&(config("sale_record_ttl_s = 4599", 900) + payments));
    assert!(short.starts_with("ledger.sale_record_ttl_s") && short.contains("query_limit_s"), "{short}");
}

/// Goal: `[payments]` names its provider and where it notifies, within bounds, each mistake
/// refused naming its key.
#[test]
fn payments_name_a_known_provider_its_url_and_where_it_notifies() {
    let with = |payments: &str| format!("{MINIMAL}\n[payments]\n{payments}");
    assert!(!Cluster::parse(MINIMAL).unwrap().payments.enabled(), "off unless configured");
    assert!(error_of(&with("provider = \"stripe\"")).starts_with("payments.provider"));
    assert!(error_of(&with("provider = \"sandbox\"")).starts_with("payments.url"));
    assert!(error_of(&with("provider = \"sandbox\"\nurl = \"https://127.0.0.1:1\"")).starts_with("payments.url"));
    let sandbox = "provider = \"sandbox\"\nurl = \"http://127.0.0.1:8095\"";
    assert!(error_of(&with(sandbox)).starts_with("payments.callback_url"), "no [orders] listen, no callback URL");
    let listening = format!("[orders]\nlisten = \"0.0.0.0:8090\"\n{MINIMAL}\n[payments]\n{sandbox}");
    let cluster = Cluster::parse(&listening).unwrap();
    let payments = cluster.payments.payments(cluster.orders.reached_at().as_deref()).unwrap().expect("a provider");
    assert_eq!(
        payments.callback_url, "http://127.0.0.1:8090/v1/payments/callback",
        "a wildcard is reached on loopback"
    );
    let notified = format!("{sandbox}\ncallback_url = \"http://shop.example/v1/payments/callback\"");
    assert!(Cluster::parse(&with(&notified)).is_ok());
    assert!(error_of(&with(&format!("{notified}\npay_grace_s = 3601"))).starts_with("payments.pay_grace_s"));
    assert!(error_of(&with(&format!("{notified}\nquery_limit_s = 0"))).starts_with("payments.query_limit_s"));
}

#[test]
fn shares_add_up_to_the_total_before_buffers() {
    let mut cluster = Cluster::parse(MINIMAL).unwrap();
    cluster.skus[0].terms.buffer = Buffer::Units(0);
    let split = allotments(&cluster.skus[0], &cluster.node_ids());
    assert_eq!(split.values().sum::<u64>(), 101);
    assert_eq!(split.values().copied().collect::<Vec<_>>(), [51, 50]);
}

#[test]
fn buffers_and_weights_shape_the_allotment() {
    let text = MINIMAL
        .replace("total = 101", "total = 300\nbuffer = \"10%\"\nweights = { n1 = 2 }\nnode_buffers = { n2 = 7 }");
    let cluster = Cluster::parse(&text).unwrap();
    let split = allotments(&cluster.skus[0], &cluster.node_ids());
    let n1 = NodeId::new("n1").unwrap();
    let n2 = NodeId::new("n2").unwrap();
    assert_eq!(split[&n1], 200 + 20, "weight 2 of 3, plus 10% of its share");
    assert_eq!(split[&n2], 100 + 7, "weight 1 of 3, plus its own buffer");
}

#[test]
fn errors_name_the_key_and_the_reason() {
    assert!(error_of(&MINIMAL.replace("total = 101", "total = 0")).starts_with("skus[0].total"));
    assert!(error_of(&MINIMAL.replace("\"n2\"", "\"n1\"")).starts_with("nodes[1].id"));
    assert!(error_of(&MINIMAL.replace("total = 101", "total = 5\nbuffer = \"ten\"")).contains("neither a unit count"));
    assert!(error_of(&MINIMAL.replace("total = 101", "total = 5\nweights = { n9 = 1 }")).contains("n9"));
    assert!(error_of(&format!("mode = \"fast\"\n{MINIMAL}")).starts_with("mode"));
    assert!(error_of(&format!("mode = \"redis-only\"\n{MINIMAL}")).contains("redis://"));
    assert!(
        error_of(&MINIMAL.replace("total = 101", "total = 5\ncolour = 1")).contains("colour"),
        "unknown keys are refused"
    );
    let ledger = |url: &str| format!("[ledger]\nurl = \"{url}\"\n{MINIMAL}");
    assert!(error_of(&ledger("memcached://x:1")).starts_with("ledger.url"));
    for bad in [
        "redis+cluster://",
        "redis+cluster://a:1,,b:2",
        "redis+cluster://a:1,b",
        "redis+cluster://a:1/0",
        "redis+sentinel://a:1,b:2",
        "redis+sentinel://a:1,b/m",
    ] {
        assert!(error_of(&ledger(bad)).starts_with("ledger.url"), "{bad} must be refused");
    }
    let window =
        MINIMAL.replace("total = 101", "total = 5\nstarts_at = 2030-01-01T00:00:00Z\nends_at = 2029-01-01T00:00:00Z");
    assert!(error_of(&window).starts_with("skus[0].ends_at"));
}

#[test]
fn ledger_errors_and_dumps_never_show_a_password() {
    let ledger = |url: &str| format!("[ledger]\nurl = \"{url}\"\n{MINIMAL}");
    for bad in [
        "memcached://u:hunter2-pw@x:1",
        "redis://:hunter2-pw@h:nope",
        "redis+cluster://:hunter2-pw@a:1,b",
        "redis+sentinel://:hunter2-pw@a:1,b/m",
    ] {
        let error = error_of(&ledger(bad));
        assert!(error.starts_with("ledger.url") && !error.contains("hunter2"), "{error}");
    }
    let cluster = Cluster::parse(&ledger("redis://seckill:hunter2-pw@127.0.0.1:6379")).unwrap();
    let dump = format!("{cluster:?}");
    assert!(!dump.contains("hunter2") && dump.contains("seckill:***@127.0.0.1"), "{dump}");
}

#[test]
fn a_redis_cluster_is_named_by_its_seed_nodes() {
    let text = format!("[ledger]\nurl = \"redis+cluster://127.0.0.1:7000, 127.0.0.1:7001\"\n{MINIMAL}");
    let cluster = Cluster::parse(&text).unwrap();
    let Ok(::ledger::RedisTarget::Cluster(seeds)) = ::ledger::RedisTarget::parse(&cluster.ledger.url) else {
        panic!("a cluster URL must parse as a cluster");
    };
    assert_eq!(seeds.urls(), ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
    let Ok(::ledger::RedisTarget::Cluster(seeds)) = ::ledger::RedisTarget::parse("redis+cluster://:pw@h:1,[::1]:2")
    else {
        panic!("credentials and IPv6 seeds are accepted");
    };
    assert_eq!(seeds.urls(), ["redis://:pw@h:1", "redis://:pw@[::1]:2"]);
}

#[test]
fn a_sentinel_url_names_sentinels_and_a_master() {
    let text = format!("[ledger]\nurl = \"redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/ledger\"\n{MINIMAL}");
    let cluster = Cluster::parse(&text).unwrap();
    let Ok(::ledger::RedisTarget::Sentinel(seeds)) = ::ledger::RedisTarget::parse(&cluster.ledger.url) else {
        panic!("a sentinel URL must parse as sentinels");
    };
    assert_eq!(seeds.sentinel_urls(), ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"]);
    assert_eq!(seeds.master_name, "ledger");
    assert!(!format!("{cluster:?}").contains(":pw@"));
}

#[test]
fn coordinator_timings_are_checked() {
    let with = |section: &str| {
        format!("{MINIMAL}\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:0\" }}]\n{section}")
    };
    assert!(Cluster::parse(&with("")).unwrap().coordinator.is_some());
    assert!(error_of(&with("lease_ms = 1000\nelection_timeout_max_ms = 300")).starts_with("coordinator.lease_ms"));
    assert!(error_of(&with("heartbeat_ms = 1000")).starts_with("coordinator.heartbeat_ms"));
    let two = MINIMAL.to_string() + "\n[coordinator]\nmembers = [{ name = \"a\", listen = \"127.0.0.1:0\" }, { name = \"b\", listen = \"127.0.0.1:0\" }]";
    assert!(error_of(&two).starts_with("coordinator.members"));
}

#[test]
fn members_read_the_order_service_where_it_listens_or_where_they_are_told() {
    let with = |orders: &str, section: &str| {
        format!(
            "{MINIMAL}\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:0\" }}]\n{section}\n{orders}"
        )
    };
    let api = |text: String| Cluster::parse(&text).unwrap().coordinator.unwrap().orders_api;
    assert_eq!(api(with("", "")), None, "no order service: no orders by state");
    assert_eq!(api(with("[orders]\nlisten = \"0.0.0.0:8090\"", "")).as_deref(), Some("127.0.0.1:8090"));
    assert_eq!(api(with("[orders]\nlisten = \"[::]:8090\"", "")).as_deref(), Some("[::1]:8090"));
    let told = with("[orders]\nlisten = \"0.0.0.0:8090\"", "orders_api = \"orders.internal:8090\"");
    assert_eq!(api(told).as_deref(), Some("orders.internal:8090"), "the configured address wins");
    for bad in ["orders.internal", "orders.internal:0", ":8090"] {
        let refused = error_of(&with("", &format!("orders_api = \"{bad}\"")));
        assert!(refused.starts_with("coordinator.orders_api"), "{bad}: {refused}");
    }
}

#[test]
fn the_cluster_token_is_configured_or_drawn_and_never_echoed() {
    let with = |section: &str| {
        format!("{MINIMAL}\n[coordinator]\nmembers = [{{ name = \"c1\", listen = \"127.0.0.1:0\" }}]\n{section}")
    };
    let drawn = Cluster::parse(&with("")).unwrap().coordinator.unwrap().cluster;
    assert!(drawn.is_generated(), "no token configured: one is drawn, good only in this process");
    let token = "a-cluster-token-of-some-length";
    let configured = Cluster::parse(&with(&format!("cluster_token = \"{token}\""))).unwrap();
    let credential = configured.coordinator.unwrap().cluster;
    assert!(!credential.is_generated());
    assert!(credential.admits(Some(format!("Bearer {token}").as_bytes())));
    assert!(!format!("{:?}", Cluster::parse(&with(&format!("cluster_token = \"{token}\""))).unwrap()).contains(token));
    let weak = error_of(&with("cluster_token = \"short-secret\""));
    assert!(weak.starts_with("coordinator.cluster_token") && !weak.contains("short-secret"), "{weak}");
    let spaced = error_of(&with("admin_token = \"has spaces in the token\""));
    assert!(spaced.starts_with("coordinator.admin_token") && !spaced.contains("spaces in"), "{spaced}");
    let lone = error_of(&with(&format!("cluster_token_accept = \"{token}\"")));
    assert!(lone.starts_with("coordinator.cluster_token_accept"), "{lone}");
    let rotating = Cluster::parse(&with(&format!(
        "cluster_token = \"{token}\"\ncluster_token_accept = \"the-next-cluster-token-00\""
    )))
    .unwrap()
    .coordinator
    .unwrap()
    .cluster;
    assert!(rotating.admits(Some(b"Bearer the-next-cluster-token-00")));
    assert_eq!(rotating.token().expose(), token, "the accepted one is never presented");
}

#[test]
fn a_waiting_room_takes_the_fleet_rules_or_its_own_and_every_bound_names_its_key() {
    let n1 = NodeId::new("n1").unwrap();
    assert!(Cluster::parse(MINIMAL).unwrap().sku_configs_for(&n1)[0].terms.waiting_room.is_none());
    let fleet = MINIMAL.replace("total = 101", "total = 101\nwaiting_room = true")
        + "\n[waiting_room]\nadmit_per_s = 50\nadmit_factor = 2.0\n";
    let cluster = Cluster::parse(&fleet).unwrap();
    let room = cluster.sku_configs_for(&n1)[0].terms.waiting_room.clone().expect("a room");
    assert_eq!((room.admit_per_s, room.admit_factor), (50, 2.0), "the [waiting_room] rules");
    assert_eq!(cluster.sku_plans()[0].terms.waiting_room, Some(room), "the coordinator carries them too");
    let own = MINIMAL.replace("total = 101", "total = 101\nwaiting_room = { admit_per_s = 7 }");
    let room = Cluster::parse(&own).unwrap().sku_configs_for(&n1)[0].terms.waiting_room.clone();
    assert_eq!(room.map(|room| room.admit_per_s), Some(7), "a SKU's own table");
    assert!(error_of(&(fleet.clone() + "abandon_s = 0\n")).starts_with("waiting_room.abandon_s"));
    let own_bad = MINIMAL.replace("total = 101", "total = 101\nwaiting_room = { admit_factor = 0.5 }");
    assert!(error_of(&own_bad).starts_with("skus[0].waiting_room.admit_factor"), "{}", error_of(&own_bad));
    let striped = MINIMAL.replace("total = 101", "total = 101\nstripes = 2\nwaiting_room = true");
    assert!(error_of(&striped).starts_with("skus[0].waiting_room"), "{}", error_of(&striped));
    let (a, b) = (&cluster.nodes[0].0, &cluster.nodes[1].0);
    let ticket = a.ticket_key.as_ref().expect("a key").ticket("s", "ann", "00ff", u64::MAX);
    assert!(b.ticket_key.as_ref().expect("a key").token_of("s", "ann", &ticket, 1).is_some(), "one key per fleet");
}

#[test]
fn submit_token_settings_reach_the_terms_of_the_nodes_and_the_coordinator() {
    let plain = Cluster::parse(MINIMAL).unwrap();
    let n1 = NodeId::new("n1").unwrap();
    let sku = &plain.sku_configs_for(&n1)[0];
    assert!(!sku.terms.require_token, "tokens are off unless asked for");
    assert_eq!(sku.terms.token_ttl(), ::ledger::TOKEN_TTL_DEFAULT);
    let text = MINIMAL.replace("total = 101", "total = 5\nrequire_token = true\ntoken_ttl_s = 30");
    let cluster = Cluster::parse(&text).unwrap();
    let sku = &cluster.sku_configs_for(&n1)[0];
    assert!(sku.terms.require_token);
    assert_eq!(sku.terms.token_ttl(), Duration::from_secs(30));
    let terms = &cluster.sku_plans()[0].terms;
    assert!(terms.require_token && terms.token_ttl_s == 30, "the coordinator carries them too: {terms:?}");
    for bad in ["0", "86401"] {
        let text = MINIMAL.replace("total = 101", &format!("total = 5\ntoken_ttl_s = {bad}"));
        assert!(error_of(&text).starts_with("skus[0].token_ttl_s"), "token_ttl_s = {bad}");
    }
}

/// Goal: a striped `[[skus]]` SKU reaches the coordinator as one plan per stripe, each with
/// its stripe's total, split over the nodes as any SKU's.
#[test]
fn a_striped_sku_is_planned_stripe_by_stripe() {
    let cluster = Cluster::parse(&MINIMAL.replace("total = 101", "total = 101\nstripes = 3\nbuffer = 0")).unwrap();
    let plans = cluster.sku_plans();
    let names: Vec<String> = plans.iter().map(|plan| plan.sku.to_string()).collect();
    assert_eq!(names, ["s", "s/1", "s/2"]);
    let totals: Vec<(u64, u32, u64)> =
        plans.iter().map(|plan| (plan.terms.total, plan.terms.stripes, plan.starting.values().sum())).collect();
    assert_eq!(totals, [(34, 3, 34), (34, 3, 34), (33, 3, 33)]);
    assert_eq!(Cluster::parse(MINIMAL).unwrap().sku_plans().len(), 1, "an unstriped SKU is one plan");
}

#[test]
fn token_issuance_is_limited_per_address_by_default_and_can_be_turned_off() {
    let rate = |text: &str| Cluster::parse(text).unwrap().safeguards.token_rate_per_address;
    let default = ::safeguards::ratelimit::Rate { per_s: 5.0, burst: 20 };
    assert_eq!(rate(MINIMAL), Some(default), "on without a [safeguards] section");
    let with = |lines: &str| format!("[safeguards]\n{lines}\n{MINIMAL}");
    assert_eq!(rate(&with("token_rate_per_address = 0")), None, "0 turns it off");
    let custom = rate(&with("token_rate_per_address = 0.5\ntoken_burst_per_address = 2"));
    assert_eq!(custom, Some(::safeguards::ratelimit::Rate { per_s: 0.5, burst: 2 }));
    for bad in ["-1", "nan", "inf"] {
        let error = error_of(&with(&format!("token_rate_per_address = {bad}")));
        assert!(error.starts_with("safeguards.token_rate_per_address"), "{bad}: {error}");
    }
    let error = error_of(&with("token_burst_per_address = 0"));
    assert!(error.starts_with("safeguards.token_burst_per_address"), "{error}");
    assert_eq!(rate(&with("token_rate_per_address = 0\ntoken_burst_per_address = 0")), None, "off needs no burst");
}

#[test]
fn connections_per_address_are_bounded_by_default_with_loopback_exempt() {
    let cluster = Cluster::parse(MINIMAL).unwrap();
    let bound = &cluster.nodes[0].0.http.connections_per_address;
    assert_eq!((bound.max, bound.ipv6_prefix), (::node::CONNECTIONS_PER_ADDRESS_DEFAULT, 64));
    assert!(bound.exempt.contains("127.0.0.1".parse().unwrap()) && !bound.exempt.contains("10.0.0.1".parse().unwrap()));
    assert_eq!(cluster.orders.connections_per_address, ::orders::http::CONNECTIONS_PER_ADDRESS_DEFAULT);
    let service = cluster.orders.service_config().unwrap();
    assert_eq!(service.http.connections_per_address.max, ::orders::http::CONNECTIONS_PER_ADDRESS_DEFAULT);

    let text = format!(
        "[node_settings]\nconnections_per_address = 0\n[safeguards]\nipv6_prefix = 48\n[orders]\nconnections_per_address = 7\n{MINIMAL}"
    );
    let cluster = Cluster::parse(&text).unwrap();
    let bound = &cluster.nodes[0].0.http.connections_per_address;
    assert_eq!((bound.max, bound.ipv6_prefix), (0, 48), "0 turns the bound off; the prefix is the cluster's");
    assert_eq!(cluster.orders.service_config().unwrap().http.connections_per_address.max, 7);
}

/// Goal: a quiet SKU's refreshes may grow to 2 s by default, `status_refresh_quiet_max_ms`
/// sets it, and a value below `status_refresh_ms` (every period) is taken, not refused.
#[test]
fn a_quiet_skus_refresh_pace_is_bounded_by_its_setting() {
    let node = |text: &str| Cluster::parse(text).unwrap().nodes[0].0.clone();
    let default = node(MINIMAL);
    assert_eq!((default.status_refresh, default.status_refresh_quiet_max), (ms(250), ms(2000)));
    let set = node(&format!("[node_settings]\nstatus_refresh_quiet_max_ms = 5000\n{MINIMAL}"));
    assert_eq!(set.status_refresh_quiet_max, ms(5000));
    let below = node(&format!("[node_settings]\nstatus_refresh_ms = 60000\n{MINIMAL}"));
    assert!(below.status_refresh_quiet_max < below.status_refresh, "reads every period");
}

/// Goal: a node reads a sold-out SKU's order stream at most once per 2 ms by default,
/// `sold_out_read_gap_ms` sets it (0: back to back), and a gap past the bound is refused with
/// the setting's name, since every sold-out answer would wait it out.
#[test]
fn the_sold_out_read_gap_is_bounded_and_named_when_refused() {
    let node = |text: &str| Cluster::parse(text).unwrap().nodes[0].0.clone();
    assert_eq!(node(MINIMAL).sold_out_read_gap, ms(2));
    assert_eq!(node(&format!("[node_settings]\nsold_out_read_gap_ms = 0\n{MINIMAL}")).sold_out_read_gap, ms(0));
    assert_eq!(node(&format!("[node_settings]\nsold_out_read_gap_ms = 100\n{MINIMAL}")).sold_out_read_gap, ms(100));
    let error = Cluster::parse(&format!("[node_settings]\nsold_out_read_gap_ms = 101\n{MINIMAL}")).unwrap_err();
    assert!(error.to_string().contains("node_settings.sold_out_read_gap_ms"), "{error}");
}

fn ms(ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ms)
}

#[test]
fn sale_window_times_are_unix_ms() {
    let text = MINIMAL.replace("total = 101", "total = 5\nstarts_at = 2026-11-22T10:00:00+08:00");
    let cluster = Cluster::parse(&text).unwrap();
    let sku = &cluster.sku_configs_for(&NodeId::new("n1").unwrap())[0];
    assert_eq!(sku.terms.starts_at_ms, Some(1_795_312_800_000), "10:00 at +08:00 is 02:00 UTC");
}

/// Goal: a process is reached by name where it says (`advertise`), at its `listen` where it
/// does not; a bad `host:port` is refused naming its key; a parse error names its key.
#[test]
fn every_process_binds_listen_and_is_reached_at_advertise() {
    let text = MINIMAL.replace(
        "listen = \"127.0.0.1:0\"\n    [[nodes]]",
        "listen = \"0.0.0.0:8080\"\n        advertise = \"node-1.shop.internal:8080\"\n    [[nodes]]",
    ) + "\n[orders]\nlisten = \"0.0.0.0:8090\"\nadvertise = \"orders:8090\"\n[coordinator]\nmembers = [\
         { name = \"c1\", listen = \"0.0.0.0:7000\", advertise = \"c1:7000\" }]\n";
    let cluster = Cluster::parse(&text).unwrap();
    let (_, first) = &cluster.nodes[0];
    assert_eq!(first.advertised("0.0.0.0:8080".parse().unwrap()), "node-1.shop.internal:8080");
    let (_, second) = &cluster.nodes[1];
    assert_eq!(second.advertised("127.0.0.1:4242".parse().unwrap()), "127.0.0.1:4242", "the port it bound");
    assert_eq!(cluster.orders.reached_at().as_deref(), Some("orders:8090"));
    let group = cluster.coordinator.as_ref().unwrap();
    assert_eq!((group.members[0].addr.as_str(), group.members[0].listen.port()), ("c1:7000", 7000));
    assert_eq!(group.orders_api.as_deref(), Some("orders:8090"), "members read the order service by name");
    let bad = error_of(&text.replace("advertise = \"c1:7000\"", "advertise = \"c1\""));
    assert!(bad.starts_with("coordinator.members[0].advertise"), "{bad}");
    let bad = error_of(&text.replace("node-1.shop.internal:8080", "http://node-1:8080"));
    assert!(bad.starts_with("nodes[0].advertise"), "{bad}");
    let typo = error_of(&format!("{MINIMAL}\n[orders]\nlisten = 8090\n"));
    assert!(typo.starts_with("orders.listen (line"), "{typo}");
}

/// Goal: a node may be missing from `[[nodes]]` only where a coordinator can lease it; it
/// takes the shared settings and the joining defaults, and the command line's place wins.
#[test]
fn a_node_joins_at_run_time_only_under_a_coordinator() {
    let joiner = NodeId::new("node-7f3a").unwrap();
    let without = Cluster::parse(MINIMAL).unwrap().node_config(&joiner, None, None).unwrap_err().to_string();
    assert!(without.starts_with("nodes") && without.contains("[coordinator]"), "{without}");
    let group = "\n[coordinator]\nmembers = [{ name = \"c1\", listen = \"127.0.0.1:0\" }]\nmax_nodes = 8\n";
    let cluster = Cluster::parse(&(MINIMAL.to_string() + group)).unwrap();
    let (config, place) = cluster.node_config(&joiner, None, None).unwrap();
    assert_eq!((config.id.as_str(), place.listen), ("node-7f3a", JOINING_NODE_LISTEN));
    assert_eq!(config.confirm_timeout, cluster.nodes[0].0.confirm_timeout, "the shared settings");
    let (_, place) = cluster.node_config(&joiner, Some("0.0.0.0:9000".parse().unwrap()), Some("n7:9000")).unwrap();
    assert_eq!(place.advertised("0.0.0.0:9000".parse().unwrap()), "n7:9000");
    assert!(cluster.node_config(&joiner, None, Some("n7")).unwrap_err().to_string().starts_with("--advertise"));
    assert_eq!(cluster.coordinator.as_ref().unwrap().max_nodes, 8);
    let listless = format!("[[skus]]\nid = \"s\"\ntotal = 5\n{group}");
    assert!(Cluster::parse(&listless).unwrap().nodes.is_empty(), "every node may join at run time");
    assert!(error_of("[[skus]]\nid = \"s\"\ntotal = 5\n").starts_with("nodes"), "but not without a coordinator");
    for bad in ["0", "1025"] {
        let refused = error_of(&(MINIMAL.to_string() + &group.replace("max_nodes = 8", &format!("max_nodes = {bad}"))));
        assert!(refused.starts_with("coordinator.max_nodes"), "{bad}: {refused}");
    }
}
