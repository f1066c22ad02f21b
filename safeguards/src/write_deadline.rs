//! A write timeout for a connection: hyper has none, so a client that sends requests and never
//! reads the answers would park the connection's task on a full socket buffer forever, holding
//! one of the server's connection slots. Wrapped in [`WriteDeadline`], a write (or flush) that
//! makes no progress for the timeout fails with `TimedOut`, and hyper closes the connection.
//!
//! Reads are not bounded here: the server's header timeout (hyper's) bounds the wait for a
//! request, idle keep-alive included, and its body timeout the wait for a body.
//!
//! It lives here, not in one server, because every HTTP server of the fleet that strangers reach
//! (the node's purchase API, the order service's API) needs the same bound.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// An I/O stream whose writes fail after `timeout` without progress.
pub struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    /// Armed when a write first finds the socket full; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self { inner, timeout, stalled: None }
    }

    /// Called when the inner write is pending: `Ready` with an error once the stall has lasted
    /// the timeout, else `Pending` (the timer wakes the task when it runs out).
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let timeout = self.timeout;
        let stall = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, format!("the client read nothing for {timeout:?}")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn bounded<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.poll_stall(cx).map(Err),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bounded(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bounded(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.bounded(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bounded(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A peer that never reads: the write fails after the timeout instead of waiting forever.
    #[tokio::test]
    async fn a_write_to_a_peer_that_never_reads_fails_after_the_timeout() {
        let (ours, _theirs) = tokio::io::duplex(1024);
        let mut stream = WriteDeadline::new(ours, Duration::from_millis(50));
        let started = tokio::time::Instant::now();
        let error = stream.write_all(&[0u8; 64 * 1024]).await.expect_err("the peer never reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Progress resets the clock: a slow but steady reader is not cut off.
    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_served() {
        use tokio::io::AsyncReadExt;
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut stream = WriteDeadline::new(ours, Duration::from_millis(200));
        let reader = tokio::spawn(async move {
            let mut buffer = [0u8; 512];
            let mut total = 0;
            while total < 16 * 1024 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                total += theirs.read(&mut buffer).await.unwrap();
            }
        });
        stream.write_all(&[0u8; 16 * 1024]).await.expect("a reader that keeps up is served");
        reader.await.unwrap();
    }
}
