//! The systemd units in `deploy/systemd/`, checked as systemd reads them and against what their
//! README promises: `systemd-analyze verify` finds no unknown key, bad value or unresolvable
//! specifier in any of them, `systemd-analyze security` rates each one at most 2.0 (they are
//! 1.1, "OK", today), and each unit forbids new privileges, sees the system read-only but for a
//! state directory, runs as a user `seckill.conf` creates, and hands over every secret as a
//! `*_FILE` variable naming a credential the unit loads from the root-only folder (none loaded
//! for nothing). A typo in a unit is otherwise found on a production host, where systemd logs
//! "Unknown key … ignoring" and runs the service without that protection.
//!
//! systemd-analyze needs no running systemd, but `verify` insists the binary a unit starts
//! exists: the units' `/usr/local/bin/seckill` is swapped for the one cargo built. Needs
//! Debian's `systemd` package; about a second.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where the units expect the server binary (deploy/systemd/README.md installs it there).
const INSTALLED_BINARY: &str = "/usr/local/bin/seckill";

fn units_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd")
}

/// Every `*.service` of deploy/systemd: its file name and text.
fn units() -> Vec<(String, String)> {
    let mut units: Vec<(String, String)> = std::fs::read_dir(units_dir())
        .expect("deploy/systemd")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "service"))
        .map(|path| (path.file_name().unwrap().to_string_lossy().into_owned(), read(&path)))
        .collect();
    units.sort();
    assert!(units.len() >= 4, "deploy/systemd holds {} units, not one per role", units.len());
    units
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Goal: systemd accepts every unit as written, with no warning, and rates each one's exposure
/// at most 2.0. Method: each unit copied to a temporary folder with its `ExecStart` binary the
/// one cargo built; `systemd-analyze verify` on all of them must exit 0 and print nothing, and
/// `systemd-analyze security --offline=yes --threshold=20` on each must exit 0.
#[test]
fn systemd_accepts_every_unit_and_rates_it_ok() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut paths = Vec::new();
    for (name, text) in units() {
        let installed = format!("ExecStart={INSTALLED_BINARY} ");
        assert!(text.contains(&installed), "{name}: ExecStart does not run {INSTALLED_BINARY}");
        let path = dir.path().join(&name);
        let built = format!("ExecStart={} ", env!("CARGO_BIN_EXE_seckill"));
        std::fs::write(&path, text.replace(&installed, &built)).expect("writing a unit");
        paths.push(path);
    }

    let verify = systemd_analyze(&["verify", "--man=no", "--generators=no"], &paths);
    let said = format!("{}{}", String::from_utf8_lossy(&verify.stdout), String::from_utf8_lossy(&verify.stderr));
    assert!(verify.status.success() && said.trim().is_empty(), "systemd-analyze verify ({}):\n{said}", verify.status);

    for path in &paths {
        let security = systemd_analyze(&["security", "--offline=yes", "--threshold=20", "--no-pager"], [path]);
        let report = String::from_utf8_lossy(&security.stdout);
        let weak: Vec<&str> = report.lines().filter(|line| line.starts_with('✗') || line.starts_with('→')).collect();
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(security.status.success(), "{name}: exposure above 2.0:\n{}", weak.join("\n"));
    }
}

/// Goal: every unit keeps the hardening and the secret handling the README describes, which
/// `verify` accepts just as well without. Method: the units' `Key=value` lines read as text:
/// `NoNewPrivileges=yes`, `ProtectSystem=strict`, a `StateDirectory`; `User` and `Group` made by
/// seckill.conf; each `*_FILE` variable is `%d/NAME` for a `LoadCredential=NAME:` from
/// /etc/seckill/credentials, and each loaded credential is named by one.
#[test]
fn every_unit_is_hardened_and_takes_its_secrets_as_credentials() {
    let sysusers = read(&units_dir().join("seckill.conf"));
    let declared: BTreeSet<&str> = sysusers
        .lines()
        .filter_map(|line| line.strip_prefix("u ").or_else(|| line.strip_prefix("g ")))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    let mut faults = Vec::new();
    for (name, text) in units() {
        let mut fault = |what: String| faults.push(format!("{name}: {what}"));
        for (key, wanted) in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict")] {
            if values(&text, key) != [wanted] {
                fault(format!("wants {key}={wanted}, has {:?}", values(&text, key)));
            }
        }
        if values(&text, "StateDirectory").iter().all(|dir| dir.is_empty()) {
            fault("has no StateDirectory".into());
        }
        for account in values(&text, "User").into_iter().chain(values(&text, "Group")) {
            if !declared.contains(account) {
                fault(format!("runs as {account}, which seckill.conf does not create"));
            }
        }

        let mut loaded = BTreeSet::new();
        for credential in values(&text, "LoadCredential") {
            let (id, path) = credential.split_once(':').unwrap_or((credential, ""));
            if path != format!("/etc/seckill/credentials/{id}") {
                fault(format!("LoadCredential={credential} is not /etc/seckill/credentials/{id}"));
            }
            loaded.insert(id);
        }
        let mut named = BTreeSet::new();
        let assignments = values(&text, "Environment").into_iter().flat_map(str::split_whitespace);
        for (variable, value) in assignments.filter_map(|a| a.trim_matches('"').split_once('=')) {
            if !variable.ends_with("_FILE") {
                continue;
            }
            match value.strip_prefix("%d/") {
                Some(id) if loaded.contains(id) => {
                    named.insert(id);
                }
                _ => fault(format!("{variable}={value} is not %d/<a credential this unit loads>")),
            }
        }
        for unused in loaded.difference(&named) {
            fault(format!("loads credential {unused}, which no *_FILE variable names"));
        }
    }
    assert!(faults.is_empty(), "units off their promises:\n{}", faults.join("\n"));
}

/// The values of `key` in a unit, in file order (comments and section headers are no settings).
fn values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with(['#', ';', '[']))
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, value)| value.trim())
        .collect()
}

/// Runs `systemd-analyze` with `args` then `paths`; a missing one fails the test, never skips it.
fn systemd_analyze<P: AsRef<Path>>(args: &[&str], paths: impl IntoIterator<Item = P>) -> Output {
    let mut command = Command::new("systemd-analyze");
    command.args(args).args(paths.into_iter().map(|p| p.as_ref().to_path_buf()));
    command.output().unwrap_or_else(|e| {
        panic!("cannot run systemd-analyze ({e}): install Debian's systemd package (apt-get install systemd)")
    })
}
