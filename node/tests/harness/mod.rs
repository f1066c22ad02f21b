//! What the scripted tests plug a node into: the embedded ledger behind a switch that can take
//! it down or hold its confirmations, an in-process coordinator, and a wall clock that moves only
//! when the script says so.

mod clock;
mod coordinator;
mod ledger;

pub use clock::ScriptClock;
pub use coordinator::ScriptCoordinator;
pub use ledger::ScriptLedger;
