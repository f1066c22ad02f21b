//! The processes of a `fleet up` and how they are told apart from strangers. Each is recorded
//! twice under the run directory: its line in `pids` (`kind name pid start`, the start being
//! the kernel's start time of that pid, so a pid the kernel handed to another process since is
//! never signalled), and its launch in `procs/<name>.json` (program, arguments, the environment
//! `up` gave it: secrets only as `NAME_FILE` paths), so `fleet restart NAME` starts it again as
//! `up` did.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use std::os::unix::process::CommandExt;

/// How one process of the fleet is started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Launch {
    pub kind: String,
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// What `up` set on top of its own environment.
    pub env: Vec<(String, String)>,
    /// A node's address, whose `/ready` says when a restarted one sells again.
    pub ready_at: Option<String>,
}

impl Launch {
    pub fn new(kind: &str, name: &str, program: impl Into<PathBuf>) -> Self {
        Launch {
            kind: kind.into(),
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            ready_at: None,
        }
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(|arg| arg.as_ref().to_string_lossy().into_owned()));
        self
    }

    /// Adds variables to the child's environment; `None`s are skipped.
    pub fn envs<I: IntoIterator<Item = Option<(String, std::ffi::OsString)>>>(mut self, vars: I) -> Self {
        self.env.extend(vars.into_iter().flatten().map(|(name, value)| (name, value.to_string_lossy().into_owned())));
        self
    }

    pub fn ready_at(mut self, addr: String) -> Self {
        self.ready_at = Some(addr);
        self
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).envs(self.env.iter().map(|(name, value)| (name, value)));
        command
    }
}

/// A line of the pid file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: String,
    pub name: String,
    pub pid: u32,
    /// The pid's start time when it was recorded; absent in lines of older versions.
    pub started: Option<u64>,
}

impl Entry {
    pub fn line(&self) -> String {
        match self.started {
            Some(started) => format!("{} {} {} {started}\n", self.kind, self.name, self.pid),
            None => format!("{} {} {}\n", self.kind, self.name, self.pid),
        }
    }

    /// Whether the pid still names the process `up` started: alive, and (when recorded) started
    /// when it was. A reused pid is somebody else's; a zombie is no longer running.
    pub fn is_running(&self) -> bool {
        matches!(stat_of(self.pid), Some(stat) if !stat.zombie && self.started.is_none_or(|started| started == stat.started))
    }

    /// Whether the process has not yet left the process table: running, or a zombie its parent
    /// has not reaped, unless that parent is this very process (a failed `up` stopping what it
    /// started reaps nothing until it exits). What `down` waits for, so a later `up` finds the
    /// ports free.
    pub fn is_present(&self) -> bool {
        match stat_of(self.pid) {
            Some(stat) if self.started.is_some_and(|started| started != stat.started) => false,
            Some(stat) => !(stat.zombie && stat.parent == std::process::id()),
            None => false,
        }
    }
}

pub fn parse_pids(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some(Entry {
                kind: fields.next()?.to_string(),
                name: fields.next()?.to_string(),
                pid: fields.next()?.parse().ok()?,
                started: fields.next().and_then(|started| started.parse().ok()),
            })
        })
        .collect()
}

/// The entry of a process started now with `pid`.
pub fn entry(kind: &str, name: &str, pid: u32) -> Entry {
    Entry { kind: kind.into(), name: name.into(), pid, started: start_time(pid) }
}

/// The kernel's start time of `pid` (clock ticks since boot); `None` if no such process runs (a
/// zombie counts as gone).
pub fn start_time(pid: u32) -> Option<u64> {
    stat_of(pid).filter(|stat| !stat.zombie).map(|stat| stat.started)
}

struct Stat {
    zombie: bool,
    parent: u32,
    started: u64,
}

/// Fields 3, 4 and 22 of `/proc/PID/stat`. The command name (field 2) may hold spaces and
/// parentheses: fields are counted from the last ')'.
fn stat_of(pid: u32) -> Option<Stat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    let started = fields.nth(17)?.parse().ok()?;
    Some(Stat { zombie: matches!(state, "Z" | "X"), parent, started })
}

/// Starts `launch` in its own process group (a Ctrl-C in the shell that ran `up` does not reach
/// it), logging to `logs/<name>.log` (appended to on a restart), and records its launch.
pub fn spawn(launch: &Launch, run_dir: &Path, restart: bool) -> anyhow::Result<Entry> {
    let procs = run_dir.join("procs");
    fs::create_dir_all(&procs)?;
    fs::write(procs.join(format!("{}.json", launch.name)), serde_json::to_vec_pretty(launch)?)?;
    let mut command = launch.command();
    spawn_command(&mut command, run_dir, &launch.kind, &launch.name, restart)
}

/// Starts `command` as [`spawn`] does, without recording a launch (`fleet restart` cannot
/// start it again).
pub fn spawn_command(
    command: &mut Command,
    run_dir: &Path,
    kind: &str,
    name: &str,
    append: bool,
) -> anyhow::Result<Entry> {
    let log_path = run_dir.join("logs").join(format!("{name}.log"));
    let log = fs::OpenOptions::new().create(true).append(append).write(true).truncate(!append).open(&log_path)?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {kind} {name}"))?;
    Ok(entry(kind, name, child.id()))
}

/// The launch `up` recorded for `name`.
pub fn launch_of(run_dir: &Path, name: &str) -> anyhow::Result<Launch> {
    let path = run_dir.join("procs").join(format!("{name}.json"));
    let text = fs::read(&path).with_context(|| {
        format!(
            "no launch recorded for {name} ({}): `fleet restart` restarts what `fleet up` started itself (not PostgreSQL, \
             not a Sentinel group's processes)",
            path.display()
        )
    })?;
    Ok(serde_json::from_slice(&text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: an entry names its process only while that very process runs: a pid recorded with
    /// another start time (the kernel reused it) is not running, and an exited one is not.
    #[test]
    fn an_entry_tells_its_process_from_a_stranger_with_the_same_pid() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let ours = entry("node", "n1", child.id());
        assert!(ours.started.is_some() && ours.is_running());
        let stranger = Entry { started: ours.started.map(|started| started + 1), ..ours.clone() };
        assert!(!stranger.is_running(), "another start time is another process");
        assert_eq!(
            parse_pids(&(ours.line() + "node n2 12\n")),
            [ours.clone(), Entry { kind: "node".into(), name: "n2".into(), pid: 12, started: None }]
        );
        child.kill().expect("kill");
        child.wait().expect("reaped");
        assert!(!ours.is_running(), "an exited process is gone");
    }
}
