//! Which `cluster.toml` a command reads, by one rule for every command that takes `--config`
//! (`up`, `node`, `coordinator`, `fleet up`, `lb-config`, `admin`): the file `--config` names;
//! without it, `cluster.toml` in the working directory if there is one; without that, the
//! built-in copy of this repository's `cluster.toml` (three nodes, the embedded ledger), so
//! `seckill up` runs anywhere with no setup.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::{Cluster, DEFAULT_CLUSTER_TOML};

/// The file looked for in the working directory when `--config` is not given.
pub const DEFAULT_PATH: &str = "cluster.toml";

/// Where the config comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    File(PathBuf),
    BuiltIn,
}

impl ConfigSource {
    /// Applies the rule: `--config`, else `./cluster.toml` if it exists, else the built-in copy.
    pub fn resolve(config: Option<PathBuf>) -> ConfigSource {
        Self::resolve_in(config, Path::new("."))
    }

    /// [`Self::resolve`] with `dir` as the working directory.
    pub fn resolve_in(config: Option<PathBuf>, dir: &Path) -> ConfigSource {
        match config {
            Some(path) => ConfigSource::File(path),
            None if dir.join(DEFAULT_PATH).is_file() => ConfigSource::File(dir.join(DEFAULT_PATH)),
            None => ConfigSource::BuiltIn,
        }
    }

    /// Reads and validates the config; an error names the file.
    pub fn load(&self) -> anyhow::Result<Cluster> {
        match self {
            ConfigSource::File(path) => Cluster::load(path).with_context(|| format!("config {}", path.display())),
            ConfigSource::BuiltIn => Cluster::parse(DEFAULT_CLUSTER_TOML).context("the built-in cluster.toml"),
        }
    }

    /// The config's text.
    pub fn text(&self) -> anyhow::Result<String> {
        match self {
            ConfigSource::File(path) => {
                std::fs::read_to_string(path).with_context(|| format!("config {}: cannot read it", path.display()))
            }
            ConfigSource::BuiltIn => Ok(DEFAULT_CLUSTER_TOML.to_string()),
        }
    }

    /// The copy of this config the processes of a `fleet up` read, written to
    /// `dir/cluster.toml` (readable by its owner alone: a config may hold a token): the same
    /// settings, except that, unless the config names them, `[load_balancer] addresses` are
    /// loopback's, where that fleet's own nginx runs, so the nodes believe its
    /// `X-Forwarded-For`. Relative paths in it still resolve from the working directory.
    pub fn fleet_copy(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let mut table: toml::Table = toml::from_str(&self.text()?).with_context(|| format!("config {self}"))?;
        let balancer = table.entry("load_balancer").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(balancer) = balancer.as_table_mut() {
            balancer.entry("addresses").or_insert_with(|| toml::Value::Array(vec!["127.0.0.1".into(), "::1".into()]));
        }
        // Top-level values first, then the tables: a value written after a table header would
        // land in that table.
        let (tables, values): (toml::Table, toml::Table) =
            table.into_iter().partition(|(_, value)| value.is_table() || is_array_of_tables(value));
        let path = dir.join(DEFAULT_PATH);
        let header = format!("# Written by `seckill fleet up` from {self}; edits here are lost on the next up.\n");
        write_private(&path, &(header + &toml::to_string(&values)? + "\n" + &toml::to_string(&tables)?))?;
        Ok(path)
    }
}

fn is_array_of_tables(value: &toml::Value) -> bool {
    value.as_array().is_some_and(|items| !items.is_empty() && items.iter().all(toml::Value::is_table))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::File(path) => write!(f, "{}", path.display()),
            ConfigSource::BuiltIn => f.write_str("the built-in cluster.toml"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: one rule decides the config: `--config` wins, then `./cluster.toml`, then the
    /// built-in copy. Method: resolve in an empty temp dir, then after writing a cluster.toml.
    #[test]
    fn config_flag_then_working_directory_then_built_in() {
        let dir = tempfile::tempdir().expect("temp dir");
        let named = PathBuf::from("/etc/seckill/fleet.toml");
        assert_eq!(ConfigSource::resolve_in(Some(named.clone()), dir.path()), ConfigSource::File(named.clone()));
        assert_eq!(ConfigSource::resolve_in(None, dir.path()), ConfigSource::BuiltIn);
        assert!(ConfigSource::BuiltIn.load().is_ok(), "the built-in config is valid");

        std::fs::write(dir.path().join(DEFAULT_PATH), "nodes = 3").expect("write");
        let here = ConfigSource::resolve_in(None, dir.path());
        assert_eq!(here, ConfigSource::File(dir.path().join(DEFAULT_PATH)));
        assert_eq!(ConfigSource::resolve_in(Some(named.clone()), dir.path()), ConfigSource::File(named));
        let error = format!("{:#}", here.load().expect_err("not a cluster config"));
        assert!(error.contains("cluster.toml"), "the error names the file: {error}");

        let copy = ConfigSource::BuiltIn.fleet_copy(dir.path()).expect("written");
        let fleet = Cluster::load(&copy).expect("the copy loads");
        assert_eq!(fleet.load_balancer.addresses, ["127.0.0.1", "::1"], "a fleet's own nginx is believed");
        assert_eq!(Cluster::parse(DEFAULT_CLUSTER_TOML).unwrap().load_balancer.addresses, Vec::<String>::new());
        assert_eq!(fleet.skus.len(), Cluster::parse(DEFAULT_CLUSTER_TOML).unwrap().skus.len(), "the same settings");
        let named = DEFAULT_CLUSTER_TOML.to_string() + "\n[load_balancer]\naddresses = [\"10.0.0.9\"]\n";
        std::fs::write(dir.path().join("named.toml"), named).expect("write");
        let copy = ConfigSource::File(dir.path().join("named.toml")).fleet_copy(dir.path()).expect("written");
        assert_eq!(Cluster::load(&copy).unwrap().load_balancer.addresses, ["10.0.0.9"], "the config's own stand");
    }
}
