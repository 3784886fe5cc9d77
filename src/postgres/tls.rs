//! The TLS connector behind a trace, so a failed connection can be
//! classified by cause (DESIGN §9): whether the server agreed to TLS, and
//! whether the socket under a failed handshake broke (retryable) or the TLS
//! library refused the peer with the socket intact (fatal). The handshake
//! itself is native-tls through postgres-native-tls, unchanged.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

/// What one connection attempt's TLS got to, per address tried: whether the
/// SSL request went out for it and whether the server agreed ('S') so the
/// handshake began.
#[derive(Debug, Default)]
pub(crate) struct TlsTrace {
    asked: AtomicBool,
    handshake: AtomicBool,
    no_host_name: AtomicBool,
}

impl TlsTrace {
    /// The SSL request went out for the last address tried and no
    /// handshake followed: the server said no (or there was no host name
    /// to verify, see [`TlsTrace::no_host_name`]).
    pub(crate) fn declined(&self) -> bool {
        self.asked.load(Ordering::SeqCst) && !self.handshake.load(Ordering::SeqCst)
    }

    /// The last address tried had no host name (a Unix socket).
    pub(crate) fn no_host_name(&self) -> bool {
        self.no_host_name.load(Ordering::SeqCst)
    }
}

/// native-tls behind a trace: tokio-postgres asks for a connector for each
/// address once the TCP connection is up, right before the SSL request, and
/// calls it only when the server agreed to TLS.
pub(crate) struct MakeTls {
    connector: native_tls::TlsConnector,
    trace: Arc<TlsTrace>,
}

impl MakeTls {
    pub(crate) fn new(connector: native_tls::TlsConnector, trace: Arc<TlsTrace>) -> MakeTls {
        MakeTls { connector, trace }
    }
}

impl MakeTlsConnect<Socket> for MakeTls {
    type Stream = postgres_native_tls::TlsStream<Watched<Socket>>;
    type TlsConnect = Tls;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Tls, io::Error> {
        self.trace.asked.store(true, Ordering::SeqCst);
        self.trace.handshake.store(false, Ordering::SeqCst);
        self.trace.no_host_name.store(domain.is_empty(), Ordering::SeqCst);
        let inner = postgres_native_tls::TlsConnector::new(self.connector.clone(), domain);
        Ok(Tls { inner, trace: Arc::clone(&self.trace) })
    }
}

/// One address's connector: marks the handshake begun and watches its socket.
pub(crate) struct Tls {
    inner: postgres_native_tls::TlsConnector,
    trace: Arc<TlsTrace>,
}

type TlsFuture =
    Pin<Box<dyn Future<Output = Result<postgres_native_tls::TlsStream<Watched<Socket>>, HandshakeFailed>> + Send>>;

impl TlsConnect<Socket> for Tls {
    type Stream = postgres_native_tls::TlsStream<Watched<Socket>>;
    type Error = HandshakeFailed;
    type Future = TlsFuture;

    fn connect(self, stream: Socket) -> TlsFuture {
        self.trace.handshake.store(true, Ordering::SeqCst);
        let fault = Arc::new(OnceLock::new());
        let watched = Watched { inner: stream, fault: Arc::clone(&fault) };
        let handshake = TlsConnect::<Watched<Socket>>::connect(self.inner, watched);
        Box::pin(async move { handshake.await.map_err(|source| HandshakeFailed { io: fault.get().copied(), source }) })
    }
}

/// A TLS handshake that did not complete. `io` is the first failure of the
/// socket under it (end of file counts), if any: with one, the path broke;
/// without, the TLS library refused the peer.
#[derive(Debug)]
pub(crate) struct HandshakeFailed {
    io: Option<io::ErrorKind>,
    source: native_tls::Error,
}

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.io {
            Some(kind) => write!(f, "TLS handshake cut off ({})", io_phrase(kind)),
            None => f.write_str(TLS_REJECTED),
        }
    }
}

impl HandshakeFailed {
    /// The socket's first failure during the handshake, if any.
    pub(crate) fn io_fault(&self) -> Option<io::ErrorKind> {
        self.io
    }

    /// What the TLS library said.
    pub(crate) fn tls_error(&self) -> &native_tls::Error {
        &self.source
    }
}

impl StdError for HandshakeFailed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

/// A socket that remembers its first failure: an I/O error, a read that hit
/// end of file, or a write that wrote nothing.
pub(crate) struct Watched<S> {
    inner: S,
    fault: Arc<OnceLock<io::ErrorKind>>,
}

impl<S> Watched<S> {
    fn note<T>(&self, r: &Poll<io::Result<T>>) {
        if let Poll::Ready(Err(e)) = r {
            let _ = self.fault.set(e.kind());
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.note(&r);
        if matches!(r, Poll::Ready(Ok(()))) && room && buf.filled().len() == before {
            let _ = self.fault.set(io::ErrorKind::UnexpectedEof);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(&r);
        if matches!(r, Poll::Ready(Ok(0))) && !buf.is_empty() {
            let _ = self.fault.set(io::ErrorKind::WriteZero);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(&r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.note(&r);
        r
    }
}

/// The phrases of fatal connection failures that carry no SQLSTATE. A pool
/// built outside the store keeps only the text of the last failure, so the
/// store reads the kind back from these (see `connect_text_is_fatal`).
pub(crate) const TLS_REJECTED: &str = "TLS handshake rejected";

pub(crate) fn io_phrase(kind: io::ErrorKind) -> String {
    match kind {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::ConnectionReset => "connection reset".into(),
        io::ErrorKind::UnexpectedEof => "connection closed by the other end".into(),
        io::ErrorKind::BrokenPipe => "broken pipe".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that reads `data` once, then end of file or `fail`.
    struct Scripted {
        data: Option<&'static [u8]>,
        fail: Option<io::ErrorKind>,
    }

    impl AsyncRead for Scripted {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            if let Some(d) = self.data.take() {
                buf.put_slice(d);
                return Poll::Ready(Ok(()));
            }
            match self.fail {
                Some(k) => Poll::Ready(Err(k.into())),
                None => Poll::Ready(Ok(())),
            }
        }
    }

    fn read_all(fail: Option<io::ErrorKind>) -> Option<io::ErrorKind> {
        let fault = Arc::new(OnceLock::new());
        let mut w = Watched { inner: Scripted { data: Some(b"hello"), fail }, fault: Arc::clone(&fault) };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut space = [0u8; 16];
        for _ in 0..3 {
            let mut buf = ReadBuf::new(&mut space);
            let _ = Pin::new(&mut w).poll_read(&mut cx, &mut buf);
        }
        fault.get().copied()
    }

    /// A socket whose writes write nothing and whose shutdown fails.
    struct Stuck;

    impl AsyncWrite for Stuck {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(0))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
        }
    }

    fn watched_stuck() -> (Watched<Stuck>, Arc<OnceLock<io::ErrorKind>>) {
        let fault = Arc::new(OnceLock::new());
        (Watched { inner: Stuck, fault: Arc::clone(&fault) }, fault)
    }

    #[test]
    fn watched_socket_counts_a_write_of_nothing_and_a_failed_shutdown() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (mut w, fault) = watched_stuck();
        assert!(Pin::new(&mut w).poll_write(&mut cx, b"").is_ready());
        assert!(Pin::new(&mut w).poll_flush(&mut cx).is_ready());
        assert_eq!(fault.get(), None, "an empty write or a flush is no failure");
        let _ = Pin::new(&mut w).poll_write(&mut cx, b"x");
        assert_eq!(fault.get(), Some(&io::ErrorKind::WriteZero));

        let (mut w, fault) = watched_stuck();
        let _ = Pin::new(&mut w).poll_shutdown(&mut cx);
        assert_eq!(fault.get(), Some(&io::ErrorKind::NotConnected));
    }

    #[test]
    fn a_failed_handshake_says_whether_the_path_broke_and_keeps_the_tls_cause() {
        let tls_error = || native_tls::Certificate::from_pem(b"not a certificate").err().expect("not PEM");
        let cut = HandshakeFailed { io: Some(io::ErrorKind::ConnectionReset), source: tls_error() };
        assert_eq!(cut.to_string(), "TLS handshake cut off (connection reset)");
        let refused = HandshakeFailed { io: None, source: tls_error() };
        assert_eq!(refused.to_string(), super::TLS_REJECTED);
        for e in [&cut, &refused] {
            let source = e.source().expect("the TLS library's error is kept");
            assert_eq!(source.to_string(), tls_error().to_string());
        }
    }

    #[test]
    fn watched_socket_remembers_its_first_failure() {
        assert_eq!(read_all(None), Some(io::ErrorKind::UnexpectedEof));
        assert_eq!(read_all(Some(io::ErrorKind::ConnectionReset)), Some(io::ErrorKind::ConnectionReset));
        // A read with no room is not end of file.
        let fault = Arc::new(OnceLock::new());
        let mut w = Watched { inner: Scripted { data: None, fail: None }, fault: Arc::clone(&fault) };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let _ = Pin::new(&mut w).poll_read(&mut cx, &mut ReadBuf::new(&mut []));
        assert_eq!(fault.get(), None);
    }
}
