//! The admission seam: rate limits and blacklists plug in here, between the sold-out check and
//! the stock counter, so that abuse is turned away before it can hold a unit.
//!
//! [`SafeguardGate`] is the production gate, built from `safeguards`: the blacklist and the
//! in-memory limits answer from memory on every request; the fleet-wide limit costs a Redis call
//! and runs last, only for a request about to take a unit.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use safeguards::blacklist::{AutoBan, Blacklist, BlacklistStore, Entry};
use safeguards::ratelimit::{ClusterVerdict, FleetLimit, KeyedGcra, Rate, RateLimiter, Refusal};

/// Who is asking, as far as the node can tell (validated ids, borrowed from the request).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub sku: &'a str,
    pub user: &'a str,
    pub ip: IpAddr,
}

/// Whether a caller may go on to the stock counter; refusals name their reason for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admit,
    /// Too many requests; the caller may try again after this long.
    RateLimited {
        retry_after: Duration,
        reason: Reason,
    },
    /// The user or address is on a blacklist.
    Blocked,
}

/// Why the gate refused, one label per check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    UserRate,
    IpRate,
    Lockout,
    FleetRate,
    Blacklist,
    /// Too many submit tokens asked from one address.
    TokenRate,
}

impl Reason {
    pub const ALL: [Reason; 6] =
        [Reason::UserRate, Reason::IpRate, Reason::Lockout, Reason::FleetRate, Reason::Blacklist, Reason::TokenRate];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UserRate => "user_rate",
            Reason::IpRate => "ip_rate",
            Reason::Lockout => "lockout",
            Reason::FleetRate => "fleet_rate",
            Reason::Blacklist => "blacklist",
            Reason::TokenRate => "token_rate",
        }
    }
}

/// A boxed admission future, for the one check that needs the network.
pub type AdmissionFuture<'a> = Pin<Box<dyn Future<Output = Admission> + Send + 'a>>;

/// Decides admission.
pub trait Gate: Send + Sync + 'static {
    /// Runs on every request that gets past the sold-out flag, so it must answer from memory.
    fn admit(&self, caller: Caller<'_>) -> Admission;

    /// A check that needs the network, run only for a request about to take a unit; `None`
    /// when there is none for this caller.
    fn admit_fleet_wide<'a>(&'a self, _caller: Caller<'a>) -> Option<AdmissionFuture<'a>> {
        None
    }

    /// Told of every refusal that looks like abuse (rate limited, bad or reused requests), so
    /// repeat offenders can be banned.
    fn observe_abuse(&self, _caller: Caller<'_>) {}

    /// A request for a submit token, after [`Gate::admit`]: answers from memory. Tokens have a
    /// limit of their own because the user a token request names proves nothing, so limits per
    /// user do not hold back a client that invents users.
    fn admit_token(&self, _caller: Caller<'_>) -> Admission {
        Admission::Admit
    }
}

/// Lets everyone through: the default until limits are configured.
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenGate;

impl Gate for OpenGate {
    fn admit(&self, _caller: Caller<'_>) -> Admission {
        Admission::Admit
    }
}

/// The gate `cluster.toml`'s `[safeguards]` describe.
pub struct SafeguardGate {
    limiter: RateLimiter,
    fleet: Option<Arc<dyn FleetLimit>>,
    blacklist: Arc<Blacklist>,
    store: Arc<dyn BlacklistStore>,
    auto_ban: Option<AutoBan>,
    /// The monotonic origin every limiter's clock counts from.
    origin: Instant,
    /// Bits of an IPv6 address that name one client (`safeguards::client_ip::subject`): limits,
    /// lock-outs and bans count a whole block as one address.
    v6_prefix: u8,
    /// Submit tokens per address over every SKU; `None`: off.
    token_limiter: Option<KeyedGcra<IpAddr>>,
}

/// How often idle limiter keys are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(5);

impl SafeguardGate {
    /// Starts the blacklist sync and the pruning of idle keys; both stop when the gate is dropped.
    pub fn start(
        limiter: RateLimiter,
        fleet: Option<Arc<dyn FleetLimit>>,
        store: Arc<dyn BlacklistStore>,
        sync_every: Duration,
        auto_ban: Option<AutoBan>,
        v6_prefix: u8,
        token_rate: Option<Rate>,
    ) -> Arc<SafeguardGate> {
        let blacklist = Arc::new(Blacklist::new(v6_prefix));
        safeguards::blacklist::spawn_sync(&blacklist, store.clone(), sync_every);
        let gate = Arc::new(SafeguardGate {
            limiter,
            fleet,
            blacklist,
            store,
            auto_ban,
            origin: Instant::now(),
            v6_prefix,
            token_limiter: token_rate.map(KeyedGcra::new),
        });
        let weak = Arc::downgrade(&gate);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PRUNE_EVERY).await;
                let Some(gate) = weak.upgrade() else { return };
                let now = gate.now_ns();
                let pruned = gate.limiter.prune(now)
                    + gate.auto_ban.as_ref().map_or(0, |ban| ban.prune(now))
                    + gate.token_limiter.as_ref().map_or(0, |tokens| tokens.prune(now));
                tracing::debug!(pruned, "pruned idle rate-limit keys");
            }
        });
        gate
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    pub fn blacklist(&self) -> &Arc<Blacklist> {
        &self.blacklist
    }

    /// Keys held by the in-memory limiters.
    pub fn limiter_keys(&self) -> usize {
        self.limiter.keys() + self.token_limiter.as_ref().map_or(0, KeyedGcra::keys)
    }

    /// Blocks `entry` for `ttl` here at once and, through the store, on every node within a
    /// sync period: a node's own tallies see only its share of a client's traffic, so what one
    /// node decides about a client must reach the others.
    fn block_fleet_wide(&self, entry: Entry, ttl: Duration, cause: &'static str) {
        tracing::warn!(%entry, ?ttl, cause, "blocking a client fleet-wide");
        metrics::counter!("seckill_fleet_blocks_total", "cause" => cause).increment(1);
        self.blacklist.block_locally(&entry, Some(ttl));
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.add(&entry, Some(ttl)).await {
                tracing::warn!(%entry, "block kept on this node only: {e}");
            }
        });
    }
}

impl SafeguardGate {
    /// The caller as limits and bans see it: its address cut to its block.
    fn keyed<'a>(&self, caller: Caller<'a>) -> Caller<'a> {
        Caller { ip: safeguards::client_ip::subject(caller.ip, self.v6_prefix), ..caller }
    }
}

impl Gate for SafeguardGate {
    fn admit(&self, caller: Caller<'_>) -> Admission {
        let caller = self.keyed(caller);
        if self.blacklist.is_blocked(caller.user, caller.ip) {
            return Admission::Blocked;
        }
        if self.limiter.is_off() {
            return Admission::Admit;
        }
        match self.limiter.check(caller.sku, caller.user, caller.ip, self.now_ns()) {
            Ok(()) => Admission::Admit,
            Err(refusal) => {
                let reason = match refusal {
                    Refusal::UserRate(_) => Reason::UserRate,
                    Refusal::IpRate(_) => Reason::IpRate,
                    Refusal::Lockout { wait, newly_user, newly_ip } => {
                        if newly_user {
                            self.block_fleet_wide(Entry::User(caller.user.to_string()), wait, "lockout");
                        }
                        if newly_ip {
                            self.block_fleet_wide(Entry::Ip(caller.ip), wait, "lockout");
                        }
                        Reason::Lockout
                    }
                };
                Admission::RateLimited { retry_after: refusal.retry_after(), reason }
            }
        }
    }

    fn admit_fleet_wide<'a>(&'a self, caller: Caller<'a>) -> Option<AdmissionFuture<'a>> {
        let caller = self.keyed(caller);
        let fleet = self.fleet.as_ref()?;
        let settings = self.limiter.settings(caller.sku);
        let (per_user, per_ip) = (settings.cluster_per_user, settings.cluster_per_ip);
        if per_user.is_none() && per_ip.is_none() {
            return None;
        }
        Some(Box::pin(async move {
            let checks = [(per_user, format!("user:{}", caller.user)), (per_ip, format!("ip:{}", caller.ip))];
            for (rate, subject) in checks {
                let Some(rate) = rate else { continue };
                if let ClusterVerdict::Limited(retry_after) = fleet.check(caller.sku, &subject, rate).await {
                    return Admission::RateLimited { retry_after, reason: Reason::FleetRate };
                }
            }
            Admission::Admit
        }))
    }

    fn admit_token(&self, caller: Caller<'_>) -> Admission {
        let Some(tokens) = &self.token_limiter else { return Admission::Admit };
        match tokens.check(&self.keyed(caller).ip, self.now_ns()) {
            Ok(()) => Admission::Admit,
            Err(retry_after) => Admission::RateLimited { retry_after, reason: Reason::TokenRate },
        }
    }

    fn observe_abuse(&self, caller: Caller<'_>) {
        let caller = self.keyed(caller);
        let Some(ban) = &self.auto_ban else { return };
        for entry in ban.rejected(caller.user, caller.ip, self.now_ns()) {
            self.block_fleet_wide(entry, ban.ban_for(), "auto_ban");
        }
    }
}
