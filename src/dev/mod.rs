//! Developer tooling that users run as `seckill` subcommands: benchmarks (`bench`), in-process
//! sales (`demo`), the named scenarios both use, and the buyers `load` and the demos send.
//!
//! **Architecture invariant.** The product wiring never imports this module: what a flash sale
//! needs in production must not depend on a benchmark or a demo.
//!
//! ```text
//! bench → demo → scenario, order_lag, payers, buyer_auth → (product wiring)
//! ```

pub mod bench;
pub mod buyer_auth;
pub mod demo;
pub mod order_lag;
pub mod payers;
pub mod scenario;
