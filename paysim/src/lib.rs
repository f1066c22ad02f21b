//! The sandbox payment provider, `seckill paysim`: a small Stripe-like JSON API over HTTP that
//! takes no real money, for the demo, the tests and the nemesis (docs/payments.md).
//!
//! **Role.** The order service talks to it through `orders::provider::SandboxProvider`, the
//! same `PaymentProvider` a real provider's adapter implements, over the bodies of
//! `protocol::sandbox`: create a payment for an order, query it, refund it. A buyer (or a test) settles a payment at its
//! `pay_url`; a success is then notified to the payment's `callback_url`, signed as the order
//! service checks it (`orders::signature`) and retried until answered 2xx. Fault knobs
//! ([`Faults`]) delay, duplicate, drop, reorder or decline on purpose, or make the API
//! unavailable, each drawn from one generator seeded at start; `GET /v1/stats` counts what
//! happened, so a harness can tell a payment the provider took from one it never saw.
//!
//! **Guarantees.** One payment per order id, settled once; one refund per refund id, and never
//! more refunded than a payment took; a 503 from a fault has done nothing. Every refusal is a
//! 4xx with a JSON body; nothing a client sends panics it. It listens on loopback only (or, when
//! told it is on one, a private network such as a container's): it checks no caller, so
//! anyone who reaches it can settle payments.
//!
//! **Non-goals.** It forgets everything when it stops (a sandbox keeps no disk); it speaks no
//! TLS; it is not a model of any one provider's corner cases.
//!
//! **Layout.**
//!
//! ```text
//! http      → book, callbacks, faults   (the API: routes and answers, on safeguards' accept loop)
//! book      → callbacks                 (payments and refunds; a success queues its notification)
//! callbacks, faults → nothing of the crate (signed notifications retried; the seeded fault draws)
//! ```

mod book;
mod callbacks;
mod faults;
mod http;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use book::{Counts, ID_BYTES_MAX, PAYMENTS_MAX};
pub use callbacks::{CallbackCounts, ATTEMPTS_MAX as CALLBACK_ATTEMPTS_MAX};
pub use faults::{Faults, FaultsPatch, CALLBACK_DELAY_MS_MAX, REORDER_WINDOW_MS_MAX};

/// Shortest callback secret accepted: the order service's own bound on `SECKILL_PAYMENT_SECRET`.
pub const SECRET_BYTES_MIN: usize = 16;

/// How a sandbox starts.
#[derive(Clone)]
pub struct Config {
    /// The secret callbacks are signed with: the order service's payment secret.
    pub secret: Arc<[u8]>,
    /// The faults it starts with; `PUT /v1/faults` changes them while it runs.
    pub faults: Faults,
    /// Seeds every fault's draws.
    pub seed: u64,
    /// Listen on an address other than loopback: the caller vouches that it is on a private
    /// network (a container's, whose only other members are the fleet it serves), which then
    /// is the fence loopback otherwise is.
    pub private_network: bool,
}

/// What `GET /v1/stats` answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    #[serde(flatten)]
    pub book: Counts,
    #[serde(flatten)]
    pub callbacks: CallbackCounts,
    /// Merchant API calls answered 503 by `unavailable_p`.
    pub unavailable_answers: u64,
    /// Merchant API calls done but answered 503 by `answer_lost_p`.
    #[serde(default)]
    pub lost_answers: u64,
}

/// Why a sandbox did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the sandbox listens on loopback only (it checks no caller), not {0}")]
    NotLoopback(SocketAddr),
    #[error("the callback secret must be at least {SECRET_BYTES_MIN} bytes")]
    WeakSecret,
    #[error("{0}")]
    BadFaults(String),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// What the routes share.
pub(crate) struct Sandbox {
    /// `http://<address>`: where pay URLs point.
    base_url: String,
    book: Mutex<book::Book>,
    faults: Mutex<Faults>,
    dice: faults::Dice,
    callbacks: callbacks::Callbacks,
    unavailable_answers: AtomicU64,
    lost_answers: AtomicU64,
}

impl Sandbox {
    fn faults(&self) -> Faults {
        self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn stats(&self) -> Stats {
        Stats {
            book: self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner).counts(),
            callbacks: self.callbacks.counts(),
            unavailable_answers: self.unavailable_answers.load(std::sync::atomic::Ordering::Relaxed),
            lost_answers: self.lost_answers.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// A running sandbox.
pub struct Paysim {
    /// Where it listens (the port the kernel picked, for `:0`).
    pub addr: SocketAddr,
    sandbox: Arc<Sandbox>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
}

impl Paysim {
    /// Listens on `listen` (loopback only) and serves until [`Paysim::stop`].
    pub async fn start(listen: SocketAddr, config: Config) -> Result<Paysim, StartError> {
        if !listen.ip().is_loopback() && !config.private_network {
            return Err(StartError::NotLoopback(listen));
        }
        if config.secret.len() < SECRET_BYTES_MIN {
            return Err(StartError::WeakSecret);
        }
        config.faults.validate().map_err(StartError::BadFaults)?;
        let listener = TcpListener::bind(listen).await.map_err(|e| StartError::Listen(listen, e))?;
        let addr = listener.local_addr().map_err(|e| StartError::Listen(listen, e))?;
        let (stop, stopped) = watch::channel(false);
        // Ids carry the start time and a random tag, so a restarted sandbox (or a second one)
        // never hands out an id an order service recorded for another order. The tag comes
        // from the process's own generator, not the seeded dice: ids are no fault draw.
        let run = format!("{:x}{:04x}", protocol::unix_ms(), fastrand::u16(..));
        let sandbox = Arc::new(Sandbox {
            base_url: format!("http://{addr}"),
            book: Mutex::new(book::Book::new(run)),
            faults: Mutex::new(config.faults),
            dice: faults::Dice::new(config.seed),
            callbacks: callbacks::Callbacks::new(config.secret, stopped.clone()),
            unavailable_answers: AtomicU64::new(0),
            lost_answers: AtomicU64::new(0),
        });
        let server = tokio::spawn(http::serve(sandbox.clone(), listener, stopped));
        Ok(Paysim { addr, sandbox, stop, server })
    }

    /// What `GET /v1/stats` would answer now.
    pub fn stats(&self) -> Stats {
        self.sandbox.stats()
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.sandbox.faults()
    }

    /// Stops accepting, drains open requests and abandons deliveries still under way.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
    }
}

/// Returns once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _ = stop.wait_for(|stop| *stop).await;
}
