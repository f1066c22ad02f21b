//! Clients that hold a server's connections on purpose, for the tests of its connection bounds.
//! Each can come from an address of its own: Linux answers for all of 127.0.0.0/8 on loopback,
//! so one test can play several hosts (`127.0.0.1` the abuser, `127.0.0.2` everybody else).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Longest a connect may take; a server's accept queue answers a connect even when the server
/// accepts nothing.
const CONNECT_MAX: Duration = Duration::from_secs(5);

/// A write that makes no progress for this long means the server stopped reading.
const STALL: Duration = Duration::from_millis(300);

/// Pipelined copies of the request per write: enough to fill socket buffers in a few writes.
const COPIES_PER_WRITE: usize = 2_000;

/// Most writes before giving up on backing the server up (tens of MB, far beyond any buffer).
const WRITES_MAX: usize = 1_000;

/// A TCP connection to `addr` from `local`, on a port the kernel picks.
pub async fn connect_from(local: IpAddr, addr: SocketAddr) -> io::Result<TcpStream> {
    connect_with(local, addr, None).await
}

/// An HTTP/1 client on a connection from `local`.
pub async fn http_from(local: IpAddr, addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = connect_from(local, addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

async fn connect_with(local: IpAddr, addr: SocketAddr, recv_buffer: Option<u32>) -> io::Result<TcpStream> {
    let socket = if local.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(bytes) = recv_buffer {
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.bind(SocketAddr::new(local, 0))?;
    match tokio::time::timeout(CONNECT_MAX, socket.connect(addr)).await {
        Ok(connected) => connected,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connect to {addr} took over {CONNECT_MAX:?}"))),
    }
}

/// A client that sends requests and never reads an answer.
pub struct NeverReads {
    pub stream: TcpStream,
    /// Its writes stalled: the server stopped reading because its answers had nowhere to go
    /// (or, queued behind a full server, nobody read at all). `false`: a write failed, the
    /// server closed the connection.
    pub backed_up: bool,
}

impl NeverReads {
    /// Connects from `local` with a small receive buffer and pipelines `request` until a write
    /// stalls or fails.
    pub async fn start(local: IpAddr, addr: SocketAddr, request: &[u8]) -> io::Result<NeverReads> {
        let mut stream = connect_with(local, addr, Some(4096)).await?;
        let chunk = request.repeat(COPIES_PER_WRITE);
        for _ in 0..WRITES_MAX {
            match tokio::time::timeout(STALL, stream.write_all(&chunk)).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Ok(NeverReads { stream, backed_up: false }),
                Err(_) => return Ok(NeverReads { stream, backed_up: true }),
            }
        }
        Err(io::Error::other(format!("{addr} read {WRITES_MAX} writes of pipelined requests without backing up")))
    }

    /// Whether the server has closed the connection: a read finds its end (or a reset) within
    /// `within`. An answer waiting to be read, or nothing at all, means it is still open.
    pub async fn closed_by_server(&mut self, within: Duration) -> bool {
        let mut buffer = [0u8; 1024];
        match tokio::time::timeout(within, self.stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }
}
