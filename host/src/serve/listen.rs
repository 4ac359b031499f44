//! Accepting connections within bounds, for the HTTP and gRPC ports alike: at most
//! `max_connections` open at once across both, and at most `max_per_client` from one client
//! address. Past either, a new connection is closed at once, so a flood of idle connections
//! can neither use up the server's file descriptors nor crowd out other clients. Accepted
//! sockets get `TCP_NODELAY` (small answers must not wait for an acknowledgement).
//!
//! HTTP/1 connections are served here with hyper directly, so that a client that is slow to
//! send its request line and headers, or that keeps a connection open without sending the
//! next request, is cut off after the header timeout. On both ports, a connection whose client
//! reads nothing of what the server sends it for the send timeout is closed: such a client
//! would otherwise hold its connection's place (and the answer queued on it) for ever.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::telemetry::metrics::metrics;

/// How many connections may be open.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionSettings {
    /// Across both ports.
    pub max_connections: usize,
    /// From one client IP address.
    pub max_per_client: usize,
    /// For a request's line and headers, and for the next request on an idle connection.
    pub header_timeout: Duration,
    /// How long a write may wait for the client to read (nginx's `send_timeout`).
    pub send_timeout: Duration,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            max_connections: 16384,
            max_per_client: 4096,
            header_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(30),
        }
    }
}

/// The open connections, shared by both listeners.
pub struct ConnectionLimits {
    open: Arc<Semaphore>,
    per_client: Mutex<HashMap<IpAddr, usize>>,
    settings: ConnectionSettings,
}

impl ConnectionLimits {
    pub fn new(settings: ConnectionSettings) -> Arc<Self> {
        Arc::new(Self {
            open: Arc::new(Semaphore::new(settings.max_connections)),
            per_client: Mutex::new(HashMap::new()),
            settings,
        })
    }

    /// A slot for a connection from `client`, or `None` when a limit is reached.
    fn admit(self: &Arc<Self>, client: IpAddr) -> Option<Slot> {
        let permit = self.open.clone().try_acquire_owned().ok()?;
        let mut per_client = self.per_client.lock().unwrap_or_else(PoisonError::into_inner);
        let count = per_client.entry(client).or_insert(0);
        if *count >= self.settings.max_per_client {
            return None;
        }
        *count += 1;
        Some(Slot { limits: self.clone(), client, _permit: permit })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.settings.max_connections - self.open.available_permits()
    }
}

/// One connection's place; dropping it frees the place.
struct Slot {
    limits: Arc<ConnectionLimits>,
    client: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_client = self.limits.per_client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = per_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                per_client.remove(&self.client);
            }
        }
    }
}

/// An accepted connection holding its slot.
pub struct Connection {
    stream: TcpStream,
    _slot: Slot,
    /// Whether the client has sent anything yet (read by the drain).
    sent_any: Arc<AtomicBool>,
    send_timeout: Duration,
    /// Running while the socket takes nothing more: since the first write that had to wait.
    stalled: Option<Pin<Box<Sleep>>>,
    port: &'static str,
}

impl Connection {
    /// `written`, or once writes have waited the send timeout without the client reading
    /// anything, an error that ends the connection.
    fn within_send_timeout<T>(&mut self, cx: &mut Context<'_>, written: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let send_timeout = self.send_timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(send_timeout)));
        if stalled.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        metrics().send_timed_out(self.port);
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client read nothing for the send timeout")))
    }
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && !self.sent_any.load(Ordering::Relaxed) {
            self.sent_any.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.within_send_timeout(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.within_send_timeout(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// The next connection the limits admit; refused ones are closed and counted, and accept
/// errors (out of descriptors, say) are logged and waited out rather than ending the server.
pub async fn accept(listener: &TcpListener, limits: &Arc<ConnectionLimits>, port: &'static str) -> Connection {
    loop {
        let (stream, peer): (TcpStream, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(port, error = %err, "cannot accept a connection; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match limits.admit(peer.ip()) {
            Some(slot) => {
                let _ = stream.set_nodelay(true);
                return Connection {
                    stream,
                    _slot: slot,
                    sent_any: Arc::default(),
                    send_timeout: limits.settings.send_timeout,
                    stalled: None,
                    port,
                };
            }
            None => {
                metrics().connection_refused(port);
                drop(stream);
            }
        }
    }
}

/// Raise the soft limit on open descriptors to the hard limit; the soft limit in force after.
#[allow(unsafe_code)] // getrlimit/setrlimit: plain libc calls on a local struct
pub fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit for the duration of each call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    limit.rlim_cur
}

/// The accepted connections of a listener as the stream tonic serves.
pub fn incoming(
    listener: TcpListener,
    limits: Arc<ConnectionLimits>,
    port: &'static str,
) -> impl Stream<Item = io::Result<Connection>> {
    futures::stream::unfold((listener, limits), move |(listener, limits)| async move {
        let connection = accept(&listener, &limits, port).await;
        Some((Ok(connection), (listener, limits)))
    })
}

/// Serve HTTP/1 on `listener` until `stop` resolves, then let the connections finish the
/// requests they are serving (at most `timeout`); idle keep-alive connections close.
pub async fn serve_http(
    listener: TcpListener,
    router: impl crate::api::http::HttpService,
    limits: Arc<ConnectionLimits>,
    stop: impl Future<Output = ()>,
    timeout: Duration,
) {
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.settings.header_timeout)
        .keep_alive(true)
        .max_header_size(MAX_REQUEST_HEAD_BYTES);
    let first_request_window = limits.settings.header_timeout.min(FIRST_REQUEST_WINDOW);
    let serve = |connection: Connection| {
        let service = TowerToHyperService::new(router.clone());
        let sent_any = connection.sent_any.clone();
        let served = builder.serve_connection(TokioIo::new(connection), service);
        tokio::spawn(serve_until_drained(served, sent_any, stopped.clone(), first_request_window));
    };
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            connection = accept(&listener, &limits, "http") => serve(connection),
            () = &mut stop => break,
        }
    }
    // Connections the kernel completed before the stop are served their request, not reset.
    while let Some(connection) = futures::FutureExt::now_or_never(accept(&listener, &limits, "http")) {
        serve(connection);
    }
    drop(listener);
    drop(stopped);
    let _ = stopping.send(true);
    // Every connection holds a receiver until it ends.
    if tokio::time::timeout(timeout, stopping.closed()).await.is_err() {
        tracing::warn!("HTTP requests still open after the drain timeout; closing them");
    }
}

/// Largest HTTP/1 request line and headers (past it, 431 and the connection closed). hyper's
/// default, its read buffer's limit (~400 KiB), let any client with no key make the server hold
/// that much a connection for the header timeout: ~1.6 GiB from one address at its connection
/// limit.
const MAX_REQUEST_HEAD_BYTES: usize = 64 << 10;

/// How long a connection accepted before the stop, that has sent nothing yet, gets to send
/// its request: its client may have written it just as the listener closed.
const FIRST_REQUEST_WINDOW: Duration = Duration::from_secs(1);

/// Serve one connection; once `stopped` turns true, finish the request in progress (or the
/// first one, within `first_request_window`, where none came yet) and close.
async fn serve_until_drained<S>(
    served: hyper::server::conn::http1::Connection<TokioIo<Connection>, S>,
    sent_any: Arc<AtomicBool>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    first_request_window: Duration,
) where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut served = std::pin::pin!(served);
    let ended = tokio::select! {
        ended = served.as_mut() => Some(ended),
        _ = stopped.wait_for(|stop| *stop) => None,
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            // hyper closes a connection that has sent nothing at once: wait for the first bytes.
            let deadline = tokio::time::Instant::now() + first_request_window;
            let mut ended = None;
            while ended.is_none() && !sent_any.load(Ordering::Relaxed) && tokio::time::Instant::now() < deadline {
                tokio::select! {
                    done = served.as_mut() => ended = Some(done),
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
            match ended {
                Some(ended) => ended,
                None => {
                    served.as_mut().graceful_shutdown();
                    served.await
                }
            }
        }
    };
    if let Err(err) = ended {
        tracing::debug!(error = %err, "HTTP connection ended");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn connected(send_timeout: Duration) -> (Connection, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let limits = ConnectionLimits::new(ConnectionSettings { send_timeout, ..ConnectionSettings::default() });
        let client = TcpStream::connect(listener.local_addr().expect("address")).await.expect("connects");
        (accept(&listener, &limits, "http").await, client)
    }

    #[tokio::test]
    async fn writes_fail_once_the_client_has_read_nothing_for_the_send_timeout() {
        let (mut connection, _client) = connected(Duration::from_millis(300)).await;
        let chunk = vec![7u8; 64 << 10];
        let (error, waited) = loop {
            let started = Instant::now();
            if let Err(error) = connection.write(&chunk).await {
                break (error, started.elapsed());
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(waited >= Duration::from_millis(300), "failed after {waited:?}");
        assert!(waited < Duration::from_secs(5), "failed only after {waited:?}");
    }

    #[tokio::test]
    async fn a_client_reading_slower_than_the_server_writes_is_not_cut_off() {
        let (mut connection, mut client) = connected(Duration::from_secs(1)).await;
        let reader = tokio::spawn(async move {
            let mut read = 0;
            let mut buffer = vec![0u8; 1 << 20];
            loop {
                match client.read(&mut buffer).await.expect("reads") {
                    0 => return read,
                    n => read += n,
                }
                // Less than the send timeout between reads.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let chunk = vec![7u8; 64 << 10];
        let started = Instant::now();
        let mut written = 0;
        while started.elapsed() < Duration::from_secs(2) {
            connection.write_all(&chunk).await.expect("a client that reads keeps its connection");
            written += chunk.len();
        }
        drop(connection);
        assert_eq!(reader.await.expect("reader"), written, "all of it read");
    }
}
