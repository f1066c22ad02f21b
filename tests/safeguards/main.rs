//! The safeguards crate against real dependencies: the lock suite on a private `redis-server`
//! (free loopback port, temp dir, killed on drop) and on an in-process coordinator group (raft
//! over loopback HTTP, log in a temp dir), plus the faults each backend has of its own. The
//! order-id generator needs neither and is tested in its crate.
//!
//! `redis-server` must be installed; `scripts/test` installs it. A missing server fails these
//! tests loudly rather than skipping them.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

mod coordinator_lock;
mod local_lock;
mod lock_suite;
mod redis_lock;
