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

    /// A file holding this config, for processes started with `--config`: the file itself, or
    /// the built-in text written to `dir/cluster.toml`.
    pub fn to_file(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        match self {
            ConfigSource::File(path) => {
                std::fs::canonicalize(path).with_context(|| format!("config {}", path.display()))
            }
            ConfigSource::BuiltIn => {
                let path = dir.join(DEFAULT_PATH);
                std::fs::write(&path, DEFAULT_CLUSTER_TOML).with_context(|| format!("writing {}", path.display()))?;
                Ok(path)
            }
        }
    }
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

        let written = ConfigSource::BuiltIn.to_file(dir.path()).expect("written");
        assert_eq!(std::fs::read_to_string(written).expect("read"), DEFAULT_CLUSTER_TOML);
    }
}
