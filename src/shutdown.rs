//! When a long-running command stops: Ctrl-C, or SIGTERM (what `docker stop`, systemd and
//! `fleet down` send).

/// Resolves when the process is asked to stop.
pub async fn stop_requested() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
