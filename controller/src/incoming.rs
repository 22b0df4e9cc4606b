//! The connections a gRPC port accepts (the controllers' and the brokers' data plane):
//!
//! - at most `max_connections` open at once: accepting waits for one to close, so further
//!   peers wait in the listen backlog (as on the Kafka listeners), and a flood of sockets
//!   cannot take the file descriptors the rest of the process needs;
//! - a connection that sends nothing for `idle_timeout` is closed. Every gRPC server pings a
//!   connection silent for 5 s (HTTP/2 keepalive), so a live peer sends something at least
//!   every 5 s; only a stalled or hostile one goes longer, for instance one that never
//!   finishes its HTTP/2 preface (a TLS handshake is also bounded, at 10 s, by the TLS
//!   config);
//! - Nagle's algorithm off (tonic ignores its own `tcp_nodelay` for a given stream of
//!   connections): small RPC answers must not wait for delayed ACKs.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections a gRPC port keeps open at most, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a gRPC connection may send nothing before it is closed, by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a warning about a full port or failing accepts may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The limits of one gRPC port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// What a gRPC port counts, for /metrics.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Times accepting paused because `max_connections` were open.
    pub accept_paused: AtomicU64,
    /// Connections closed for sending nothing for `idle_timeout`.
    pub idle_closed: AtomicU64,
}

/// Accepts connections on `listener` under `limits`, counting them in `stats`; `port` names
/// the port in log lines. The listener is closed when the returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    port: &'static str,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(accept_loop(listener, limits, stats, port, tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    port: &'static str,
    tx: mpsc::Sender<io::Result<Connection>>,
) {
    let room = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut warned_full: Option<std::time::Instant> = None;
    let mut warned_accept: Option<std::time::Instant> = None;
    let due = |at: &mut Option<std::time::Instant>| {
        let due = at.is_none_or(|t| t.elapsed() >= WARN_EVERY);
        if due {
            *at = Some(std::time::Instant::now());
        }
        due
    };
    loop {
        let permit = match room.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                stats.accept_paused.fetch_add(1, Relaxed);
                if due(&mut warned_full) {
                    tracing::warn!(
                        port,
                        max_connections = limits.max_connections,
                        "gRPC port has max_connections open; new connections wait until one closes"
                    );
                }
                tokio::select! {
                    p = room.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    _ = tx.closed() => return,
                }
            }
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = tx.closed() => return,
        };
        let item = match accepted {
            Ok((io, _)) => {
                let _ = io.set_nodelay(true);
                stats.open.fetch_add(1, Relaxed);
                Ok(Connection {
                    io,
                    _permit: permit,
                    idle_timeout: limits.idle_timeout,
                    last_read: Instant::now(),
                    idle: Box::pin(tokio::time::sleep(limits.idle_timeout)),
                    stats: stats.clone(),
                })
            }
            Err(e) => {
                // Out of file descriptors, say: pause rather than spin.
                if due(&mut warned_accept) {
                    tracing::warn!(port, error = %e, "gRPC accept failed; retrying");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(e)
            }
        };
        if tx.send(item).await.is_err() {
            return;
        }
    }
}

/// An accepted connection: its place under `max_connections` is freed when it is dropped.
pub struct Connection {
    io: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    last_read: Instant,
    /// Fires `idle_timeout` after the last read (reset lazily, when it fires early).
    idle: Pin<Box<Sleep>>,
    stats: Arc<ConnectionStats>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Relaxed);
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut me.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    me.last_read = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => loop {
                let deadline = me.last_read + me.idle_timeout;
                if me.idle.deadline() != deadline {
                    me.idle.as_mut().reset(deadline);
                }
                if me.idle.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if me.last_read + me.idle_timeout <= Instant::now() {
                    me.stats.idle_closed.fetch_add(1, Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer sent nothing for the gRPC idle timeout",
                    )));
                }
            },
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    async fn port(limits: ConnectionLimits) -> (std::net::SocketAddr, Arc<ConnectionStats>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(ConnectionStats::default());
        let mut conns = incoming(listener, limits, stats.clone(), "test");
        // an echo server over the accepted connections
        tokio::spawn(async move {
            while let Some(c) = conns.next().await {
                let Ok(mut c) = c else { continue };
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (addr, stats)
    }

    async fn echoes(s: &mut TcpStream) -> bool {
        if s.write_all(b"x").await.is_err() {
            return false;
        }
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await,
            Ok(Ok(1))
        )
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_until_one_closes() {
        let (addr, stats) = port(ConnectionLimits {
            max_connections: 2,
            idle_timeout: Duration::from_secs(30),
        })
        .await;
        let mut a = TcpStream::connect(addr).await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut a).await && echoes(&mut b).await);
        let mut c = TcpStream::connect(addr).await.unwrap(); // in the backlog
        assert!(!echoes(&mut c).await, "a third connection was served");
        assert_eq!(stats.open.load(Relaxed), 2);
        assert!(stats.accept_paused.load(Relaxed) >= 1);
        drop(a);
        let mut got = [0u8; 1];
        let answered = tokio::time::timeout(Duration::from_secs(2), c.read(&mut got)).await;
        assert!(
            matches!(answered, Ok(Ok(1))),
            "the waiting connection was not served once one closed"
        );
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() {
        let (addr, stats) = port(ConnectionLimits {
            max_connections: 8,
            idle_timeout: Duration::from_millis(300),
        })
        .await;
        let mut talker = TcpStream::connect(addr).await.unwrap();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                echoes(&mut talker).await,
                "a connection that talks was closed"
            );
        }
        let mut b = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(2), silent.read(&mut b)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "the silent connection stayed open: {closed:?}"
        );
        assert_eq!(stats.idle_closed.load(Relaxed), 1);
    }
}
