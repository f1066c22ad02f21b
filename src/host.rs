//! This host's own name: the default id of a node that joins at run time, and the name it is
//! reached by. Containers and pods get one from their orchestrator, resolvable by their peers.

use anyhow::Context;

/// The kernel's host name (`/proc/sys/kernel/hostname`, what `hostname` prints).
pub fn own_name() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").context("reading /proc/sys/kernel/hostname")?;
    let name = name.trim();
    anyhow::ensure!(!name.is_empty(), "this host has no name");
    Ok(name.to_string())
}
