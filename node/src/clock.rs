//! Wall-clock time, injected so that tests can stand before or after a sale window. The node
//! reads the one wall clock every process shares ([`protocol::clock`]); only sale windows read
//! it, durations and deadlines use the monotonic clock.

pub use protocol::clock::{Clock, SystemClock};
