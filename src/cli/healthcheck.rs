//! `seckill healthcheck [URL]`: one GET, exit 0 on a 2xx. The container image runs it as its
//! `HEALTHCHECK` (it has no curl); a systemd unit or a script can too.

use std::time::Duration;

/// Where the probe goes when no URL is given: the image's health check reads it, so one image
/// serves every role (a node's `/ready`, a member's `/health`, the order service's `/health`).
pub const URL_ENV: &str = "SECKILL_HEALTHCHECK_URL";

/// A node's readiness on the image's default port: what the health check asks with neither a
/// URL nor the variable.
const URL_DEFAULT: &str = "http://127.0.0.1:8080/ready";

#[derive(clap::Args)]
pub struct HealthcheckArgs {
    /// What to GET, `http://host:port/path` [default: $SECKILL_HEALTHCHECK_URL, else
    /// http://127.0.0.1:8080/ready]
    url: Option<String>,
    /// Longest wait for the answer, connect included.
    #[arg(long, default_value_t = 2_000, value_name = "MS")]
    timeout_ms: u64,
}

pub async fn run(args: HealthcheckArgs) -> anyhow::Result<()> {
    let url = args
        .url
        .or_else(|| std::env::var(URL_ENV).ok().filter(|url| !url.is_empty()))
        .unwrap_or_else(|| URL_DEFAULT.to_string());
    let (authority, path) = crate::probe::split_url(&url)?;
    let status = crate::probe::get(authority, path, Duration::from_millis(args.timeout_ms)).await?;
    anyhow::ensure!(status.is_success(), "{url} answered {status}");
    Ok(())
}
