//! Pooled connections with a real per-call deadline.
//!
//! Each [`PgConnection`] owns a current-thread tokio runtime, a
//! `tokio_postgres::Client` and the connection future that drives the socket.
//! A call polls the connection, the query and a timer together on the calling
//! thread; when the timer wins, the connection future is dropped, which closes
//! the socket at once, and the connection is reported broken so r2d2 discards
//! it instead of handing it out again.

use std::error::Error as StdError;
use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::str::FromStr;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::Severity;
use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage};

use super::sql;
use super::tls::{io_phrase, HandshakeFailed, MakeTls, TlsTrace, TLS_REJECTED};
use super::DEFAULT_CONNECT_TIMEOUT;
use crate::error::Human;
use crate::ident::percent_decode;
use crate::store::StoreError;

type Driver = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// Opens [`PgConnection`]s for an r2d2 pool, each call bounded by its
/// deadline. Pass it to `r2d2::Pool::builder().build_unchecked(…)` and the
/// pool to [`PostgresStore::from_pool`](super::PostgresStore::from_pool).
///
/// Its `Debug` shows host, port, database, user and TLS mode, never the
/// password.
#[derive(Clone)]
pub struct PgManager {
    config: Config,
    tls: Option<native_tls::TlsConnector>,
    connect_timeout: Duration,
    log: Arc<ConnectLog>,
}

impl PgManager {
    /// A manager for the database at `dsn`. See
    /// [`PostgresStore::connect`](super::PostgresStore::connect) for the TLS
    /// rules; `ca_file` adds trusted CA certificates (PEM) and requires TLS.
    /// `connect_timeout` bounds opening a connection (TCP, TLS, login);
    /// `None` takes the DSN's `connect_timeout`, else 5 s.
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when the DSN cannot be parsed or the CA file
    /// cannot be read. It never repeats the DSN.
    pub fn from_dsn(
        dsn: &str, connect_timeout: Option<Duration>, ca_file: Option<&Path>,
    ) -> Result<PgManager, StoreError> {
        let (dsn, dsn_ca) = preprocess_dsn(dsn);
        let config = Config::from_str(&dsn).map_err(|e| {
            // tokio-postgres' parse errors name the option, not its value.
            StoreError::fatal(format!("invalid PostgreSQL connection string: {}", redact(&e.to_string())))
        })?;
        let ca = ca_file.map(Path::to_path_buf).or(dsn_ca);
        PgManager::new(config, connect_timeout, ca.as_deref())
    }

    /// A manager for a parsed `config`. TLS is used when the config's
    /// `ssl_mode` is `Require` or `ca_file` is given, and then the server's
    /// certificate and host name are verified.
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when the CA file cannot be read or TLS cannot
    /// be set up.
    pub fn new(
        mut config: Config, connect_timeout: Option<Duration>, ca_file: Option<&Path>,
    ) -> Result<PgManager, StoreError> {
        let wants_tls = config.get_ssl_mode() == SslMode::Require || ca_file.is_some();
        let tls = if wants_tls {
            config.ssl_mode(SslMode::Require);
            let mut builder = native_tls::TlsConnector::builder();
            if let Some(path) = ca_file {
                let pem = std::fs::read(path)
                    .map_err(|e| StoreError::fatal(format!("cannot read CA file {}", path.display())).with_source(e))?;
                let cert = native_tls::Certificate::from_pem(&pem).map_err(|e| {
                    StoreError::fatal(format!("cannot parse CA file {}", path.display())).with_source(e)
                })?;
                builder.add_root_certificate(cert);
            }
            Some(builder.build().map_err(|e| StoreError::fatal("cannot set up TLS").with_source(e))?)
        } else {
            // `prefer` would try TLS and fall back; plaintext it is, said so.
            config.ssl_mode(SslMode::Disable);
            None
        };
        if config.get_application_name().is_none() {
            config.application_name("leaderelection");
        }
        let connect_timeout = connect_timeout
            .or_else(|| config.get_connect_timeout().copied())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
            .clamp(Duration::from_millis(1), super::MAX_WAIT);
        Ok(PgManager { config, tls, connect_timeout, log: Arc::default() })
    }

    /// The bound on opening one connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Whether connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The parsed connection settings.
    pub(super) fn config(&self) -> &Config {
        &self.config
    }

    /// The TLS connector, when the connections use TLS.
    pub(super) fn tls(&self) -> Option<&native_tls::TlsConnector> {
        self.tls.as_ref()
    }

    pub(crate) fn connect_log(&self) -> Arc<ConnectLog> {
        Arc::clone(&self.log)
    }

    fn open(&self) -> Result<PgConnection, StoreError> {
        self.open_with(&self.config)
    }

    /// A connection of the feed's own, outside the pool, named apart from
    /// the pool's sessions: the pool's `application_name` with `role`
    /// after it (so an operator, or a test counting a pool's sessions,
    /// tells them apart).
    pub(super) fn open_for(&self, role: &str) -> Result<PgConnection, StoreError> {
        let mut config = self.config.clone();
        let app = format!("{} {role}", config.get_application_name().unwrap_or("leaderelection"));
        config.application_name(&app);
        self.open_with(&config)
    }

    fn open_with(&self, config: &Config) -> Result<PgConnection, StoreError> {
        if inside_a_runtime() {
            return Err(runtime_error());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::retryable("cannot start a connection runtime").with_source(e))?;
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let trace = Arc::new(TlsTrace::default());
        let opened = rt.block_on(async {
            let connecting = async {
                match &self.tls {
                    None => config.connect(NoTls).await.map(|(c, d)| (c, Box::pin(d) as Driver)),
                    Some(tls) => {
                        let tls = MakeTls::new(tls.clone(), Arc::clone(&trace));
                        config.connect(tls).await.map(|(c, d)| (c, Box::pin(d) as Driver))
                    }
                }
            };
            tokio::time::timeout_at(deadline, connecting).await
        });
        match opened {
            Ok(Ok((client, driver))) => Ok(PgConnection { rt: Some(rt), client: Some(client), driver: Some(driver) }),
            Ok(Err(e)) => Err(classify_connect(&e, self.tls.is_some().then_some(&*trace))),
            Err(_) => Err(StoreError::retryable(format!(
                "cannot connect: no answer within {} (connect timeout)",
                Human(self.connect_timeout)
            ))),
        }
    }
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgConnection;
    type Error = StoreError;

    fn connect(&self) -> Result<PgConnection, StoreError> {
        self.log.begin();
        let result = self.open();
        self.log.end(result.as_ref().err());
        result
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        match conn.simple_query("", super::deadline_after(self.connect_timeout)) {
            Ok(_) => Ok(()),
            Err(CallError::Db(e) | CallError::Closed(Some(e))) => Err(sql::classify("check", &e)),
            Err(CallError::Closed(None)) => Err(closed_error("check", None)),
            Err(CallError::TimedOut) => Err(StoreError::retryable(format!(
                "postgres check: no answer within {}; connection closed",
                Human::about(self.connect_timeout)
            ))),
            Err(CallError::Misuse) => Err(runtime_error()),
        }
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        conn.is_broken()
    }
}

impl fmt::Debug for PgManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(s) => s.clone(),
                #[cfg(unix)]
                Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        f.debug_struct("PgManager")
            .field("hosts", &hosts)
            .field("ports", &self.config.get_ports())
            .field("dbname", &self.config.get_dbname())
            .field("user", &self.config.get_user())
            .field("tls", &self.tls.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

/// One pooled connection. Only [`PostgresStore`](super::PostgresStore) uses
/// it; it is public because it appears in the pool's type.
pub struct PgConnection {
    /// `None` only while being dropped.
    rt: Option<tokio::runtime::Runtime>,
    /// `None` only while being dropped.
    client: Option<Client>,
    /// `None` once the connection ended or was abandoned at a deadline.
    driver: Option<Driver>,
}

impl fmt::Debug for PgConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConnection").field("broken", &self.is_broken()).finish()
    }
}

impl Drop for PgConnection {
    /// A healthy connection says goodbye (Terminate) so neither the server
    /// nor a pooler logs an unexpected EOF; briefly, never blocking for long.
    /// Inside another tokio runtime, where blocking on this one or dropping
    /// it would panic, the socket is just closed.
    fn drop(&mut self) {
        drop(self.client.take());
        let driver = self.driver.take();
        let Some(rt) = self.rt.take() else { return };
        if inside_a_runtime() {
            drop(driver);
            rt.shutdown_background();
        } else if let Some(driver) = driver {
            rt.block_on(async {
                let _ = tokio::time::timeout(Duration::from_millis(100), driver).await;
            });
        }
    }
}

/// Blocking on our runtime from inside another tokio runtime would panic.
fn inside_a_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

pub(crate) fn runtime_error() -> StoreError {
    StoreError::fatal(
        "postgres: store called from inside a tokio runtime; call it from a plain thread (spawn_blocking)",
    )
}

/// Logs failures to open a connection at `warn` (r2d2's default logs each
/// retry as an error); the store reports them through its calls.
#[derive(Debug)]
pub(crate) struct LogConnectErrors;

impl r2d2::HandleError<StoreError> for LogConnectErrors {
    fn handle_error(&self, error: StoreError) {
        log::warn!("leaderelection: postgres {error}");
    }
}

/// Every attempt to open a connection and how the latest one ended, shared
/// between a [`PgManager`] (whose attempts run on r2d2's threads) and the
/// store waiting for a connection, which r2d2 would otherwise leave waiting
/// out its checkout time while the server keeps saying no.
#[derive(Default)]
pub(crate) struct ConnectLog {
    state: Mutex<LogState>,
    changed: Condvar,
}

/// What a [`ConnectLog`] knows at one moment.
#[derive(Clone, Default)]
pub(crate) struct LogState {
    /// Attempts that have ended, successful or not.
    pub(crate) ended: u64,
    /// The failure of the latest attempt to end; `None` once one succeeded.
    pub(crate) failure: Option<StoreError>,
    /// Attempts under way.
    pub(crate) in_flight: usize,
}

impl ConnectLog {
    fn begin(&self) {
        self.state.lock().in_flight += 1;
    }

    fn end(&self, failure: Option<&StoreError>) {
        let mut st = self.state.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        st.ended += 1;
        st.failure = failure.cloned();
        self.changed.notify_all();
    }

    pub(crate) fn state(&self) -> LogState {
        self.state.lock().clone()
    }

    /// Waits until an attempt ends after the `ended`-th, or until `until`.
    pub(crate) fn wait_after(&self, ended: u64, until: Instant) -> LogState {
        let mut st = self.state.lock();
        while st.ended == ended {
            if self.changed.wait_until(&mut st, until).timed_out() {
                break;
            }
        }
        st.clone()
    }
}

/// What a call `op` reports when its connection ended under it: the
/// server's last word if it said one (classified by its SQLSTATE), else a
/// retryable "connection closed".
pub(crate) fn closed_error(op: &str, e: Option<&tokio_postgres::Error>) -> StoreError {
    match e {
        Some(e) => sql::classify(op, e),
        None => StoreError::retryable(format!("postgres {op}: connection closed")),
    }
}

/// How a call on one connection failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The server answered with an error; the session goes on.
    Db(tokio_postgres::Error),
    /// The connection failed or the session ended (`None`: without a word),
    /// possibly with the server's FATAL message.
    Closed(Option<tokio_postgres::Error>),
    /// The deadline passed; the connection was dropped.
    TimedOut,
    /// Called from inside a tokio runtime, where blocking would panic.
    Misuse,
}

impl PgConnection {
    fn is_broken(&self) -> bool {
        self.driver.is_none() || self.client.as_ref().is_none_or(Client::is_closed)
    }

    /// Whether the connection has ended, found without a statement (so
    /// without a transaction the server would count): the driver reads
    /// what the socket holds for a millisecond, and a session the server
    /// ended (a FATAL, or EOF) ends it. A peer gone silent is not found
    /// here, only by the socket's keepalives.
    pub(crate) fn ended(&mut self) -> bool {
        if inside_a_runtime() {
            return false;
        }
        let (Some(rt), Some(driver)) = (self.rt.as_ref(), self.driver.as_mut()) else { return true };
        let ended = rt.block_on(async {
            let done = poll_fn(|cx| driver.as_mut().poll(cx).map(drop));
            tokio::time::timeout(Duration::from_millis(1), done).await.is_ok()
        });
        if ended {
            self.driver = None;
        }
        ended || self.is_broken()
    }

    /// Runs `sql` with the simple-query protocol (no prepared statement of
    /// any kind), giving up at `deadline`.
    pub(crate) fn simple_query(&mut self, sql: &str, deadline: Instant) -> Result<Vec<SimpleQueryMessage>, CallError> {
        if inside_a_runtime() {
            return Err(CallError::Misuse);
        }
        let (Some(rt), Some(driver), Some(client)) = (self.rt.as_ref(), self.driver.as_mut(), self.client.as_ref())
        else {
            return Err(CallError::Closed(None));
        };
        enum Out {
            Done(Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>, bool),
            Ended(Option<tokio_postgres::Error>),
            Late,
        }
        let out = rt.block_on(async {
            let mut query = pin!(client.simple_query(sql));
            let mut timer = pin!(tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)));
            poll_fn(|cx| {
                // Every poll that sees the driver end also returns, so the
                // driver is never polled again after it ended.
                let ended = match driver.as_mut().poll(cx) {
                    Poll::Ready(r) => Some(r),
                    Poll::Pending => None,
                };
                if let Poll::Ready(r) = query.as_mut().poll(cx) {
                    return Poll::Ready(Out::Done(r, ended.is_some()));
                }
                if let Some(r) = ended {
                    return Poll::Ready(Out::Ended(r.err()));
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Out::Late);
                }
                Poll::Pending
            })
            .await
        });
        match out {
            Out::Done(r, ended) => {
                if ended {
                    self.driver = None;
                }
                r.map_err(|e| {
                    // Only an ERROR from the server leaves the session going
                    // on. A FATAL ends it (such as 57P01 from an idle
                    // connection the server terminated), though the driver
                    // may only notice on its next poll; any other failure is
                    // the connection's (I/O, protocol).
                    let session_goes_on = e.as_db_error().is_some_and(|d| {
                        !matches!(d.parsed_severity(), Some(Severity::Fatal | Severity::Panic))
                            && !matches!(d.severity(), "FATAL" | "PANIC")
                    });
                    if session_goes_on && !self.is_broken() {
                        CallError::Db(e)
                    } else {
                        self.driver = None;
                        CallError::Closed(Some(e))
                    }
                })
            }
            Out::Ended(e) => {
                self.driver = None;
                Err(CallError::Closed(e))
            }
            Out::Late => {
                // Dropping the driver closes the socket now; the server (or
                // the pooler) sees EOF and rolls the transaction back.
                self.driver = None;
                Err(CallError::TimedOut)
            }
        }
    }
}

/// Classifies a failure to open a connection by its cause.
///
/// - The server refused the login (an SQLSTATE): by the code, so a missing
///   database (3D000), role (28000) or bad password (28P01) is fatal and a
///   server that is starting up (57P03) or full (53300) retryable.
/// - The TLS handshake failed: retryable when the socket under it failed
///   (reset, closed, broken pipe: a pooler or server restarting), fatal
///   when the TLS library refused the peer with the socket intact
///   (certificate or host name that does not verify, no common protocol).
/// - The socket failed (refused, reset, unreachable, name lookup) or the
///   server closed it during login: retryable.
/// - TLS is required and the server answered the SSL request with "no":
///   fatal; `sslmode=require` never falls back to plaintext.
/// - Anything else is the login exchange itself going wrong with the
///   connection intact (the server asks for a password the DSN does not
///   have, an authentication method this client does not speak, replies
///   that are not the PostgreSQL protocol): the same exchange would fail
///   again, so fatal.
///
/// `tls` is the trace of the attempt's TLS steps when TLS was required.
pub(crate) fn classify_connect(e: &tokio_postgres::Error, tls: Option<&TlsTrace>) -> StoreError {
    if let Some(err) = sql::classify_db("cannot connect", e) {
        return err;
    }
    if let Some(h) = find_cause::<HandshakeFailed>(e) {
        let why = crate::error::chain_text(h.tls_error());
        return match h.io_fault() {
            Some(kind) => {
                StoreError::retryable(format!("cannot connect: TLS handshake cut off ({}): {why}", io_phrase(kind)))
            }
            None => StoreError::fatal(format!("cannot connect: {TLS_REJECTED}: {why}")),
        };
    }
    if let Some(io) = find_cause::<io::Error>(e) {
        return StoreError::retryable(format!(
            "cannot connect: {}: {}",
            io_phrase(io.kind()),
            crate::error::chain_text(e)
        ));
    }
    if e.is_closed() {
        return StoreError::retryable("cannot connect: the server closed the connection during login");
    }
    if let Some(t) = tls.filter(|t| t.declined()) {
        let why = if t.no_host_name() { TLS_NO_HOST } else { NO_TLS };
        return StoreError::fatal(format!("cannot connect: {why}"));
    }
    StoreError::fatal(format!("cannot connect: {LOGIN_FAILED}: {}", crate::error::chain_text(e)))
}

const NO_TLS: &str = "the server does not support TLS (sslmode=require never falls back to plaintext)";
const TLS_NO_HOST: &str = "TLS needs a host name to verify (a Unix socket cannot use sslmode=require)";
const LOGIN_FAILED: &str = "login failed";

/// Whether the text of a connection failure this module produced names a
/// fatal one. Only for pools built elsewhere, which keep no error but its
/// text; the store's own pools keep the typed error.
pub(crate) fn connect_text_is_fatal(text: &str) -> bool {
    if let Some(i) = text.find("SQLSTATE ") {
        if let Some(code) = text.get(i + 9..i + 14) {
            return sql::sqlstate_kind(code) == crate::store::ErrorKind::Fatal;
        }
    }
    [TLS_REJECTED, NO_TLS, TLS_NO_HOST, LOGIN_FAILED].iter().any(|p| text.contains(&format!("cannot connect: {p}")))
}

fn find_cause<'a, T: StdError + 'static>(e: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<T>() {
            return Some(t);
        }
        cur = c.source();
    }
    None
}

/// Pulls out what tokio-postgres does not parse: `sslrootcert=PATH` (kept
/// as the CA file) and `sslmode=verify-ca`/`verify-full`, which mean
/// `require` here since `require` already verifies. Handles URL and
/// key=value forms (unquoted values).
pub(crate) fn preprocess_dsn(dsn: &str) -> (String, Option<PathBuf>) {
    let mut ca = None;
    let mut keep = |k: &str, v: &str| -> Option<String> {
        match (k, v) {
            ("sslrootcert", v) => {
                ca = Some(PathBuf::from(v));
                None
            }
            ("sslmode", "verify-ca" | "verify-full") => Some("require".into()),
            (_, v) => Some(v.to_owned()),
        }
    };
    if dsn.starts_with("postgres://") || dsn.starts_with("postgresql://") {
        let Some((base, query)) = dsn.split_once('?') else { return (dsn.to_owned(), None) };
        let params: Vec<String> = query
            .split('&')
            .filter_map(|p| match p.split_once('=') {
                Some((k, v)) => keep(k, &percent_decode(v)).map(|v| format!("{k}={}", percent_encode(&v))),
                None => Some(p.to_owned()),
            })
            .collect();
        let out = if params.is_empty() { base.to_owned() } else { format!("{base}?{}", params.join("&")) };
        (out, ca)
    } else {
        let parts: Vec<String> = dsn
            .split_whitespace()
            .filter_map(|p| match p.split_once('=') {
                Some((k, v)) if !v.contains('\'') && !v.is_empty() => keep(k.trim(), v).map(|v| format!("{k}={v}")),
                _ => Some(p.to_owned()),
            })
            .collect();
        (parts.join(" "), ca)
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Belt and braces for messages built from parse errors: drop anything after
/// a `password` mention.
fn redact(msg: &str) -> String {
    crate::error::cut_from(msg, "password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsn_preprocessing_takes_ca_file_and_maps_verify_modes() {
        let (d, ca) =
            preprocess_dsn("postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x");
        assert_eq!(d, "postgres://u@h/db?sslmode=require&application_name=x");
        assert_eq!(ca, Some(PathBuf::from("/tmp/ca.pem")));
        let (d, ca) = preprocess_dsn("host=h sslmode=verify-ca sslrootcert=/ca.pem user=u");
        assert_eq!(d, "host=h sslmode=require user=u");
        assert_eq!(ca, Some(PathBuf::from("/ca.pem")));
        let (d, ca) = preprocess_dsn("postgres://u@h/db");
        assert_eq!((d.as_str(), ca), ("postgres://u@h/db", None));
    }

    #[test]
    fn tls_is_chosen_by_sslmode_or_ca_file() {
        let m = PgManager::from_dsn("postgres://u@h/db?sslmode=require", None, None).unwrap();
        assert!(m.uses_tls());
        let m = PgManager::from_dsn("postgres://u@h/db", None, None).unwrap();
        assert!(!m.uses_tls());
        let e = PgManager::from_dsn("postgres://u@h/db", None, Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(e.is_fatal() && e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn fatal_connect_text_is_read_back_for_pools_built_elsewhere() {
        let fatal = [
            "timed out waiting for connection: cannot connect: SQLSTATE 3D000: FATAL: database \"x\" does not exist",
            &format!("cannot connect: {TLS_REJECTED}: certificate verify failed"),
            &format!("cannot connect: {NO_TLS}"),
            &format!("cannot connect: {LOGIN_FAILED}: invalid configuration: password missing"),
        ];
        for t in fatal {
            assert!(connect_text_is_fatal(t), "{t}");
        }
        let retryable = [
            "timed out waiting for connection: cannot connect: SQLSTATE 57P03: FATAL: starting up",
            "cannot connect: TLS handshake cut off (connection reset): unexpected EOF",
            "cannot connect: connection refused: error connecting to server",
            "timed out waiting for connection",
            "cannot connect: SQLSTATE 3D",
        ];
        for t in retryable {
            assert!(!connect_text_is_fatal(t), "{t}");
        }
    }

    #[test]
    fn socket_failures_read_as_a_person_says_them() {
        use io::ErrorKind as K;
        let phrases = [
            (K::ConnectionRefused, "connection refused"),
            (K::ConnectionReset, "connection reset"),
            (K::UnexpectedEof, "connection closed by the other end"),
            (K::BrokenPipe, "broken pipe"),
            (K::TimedOut, "timed out"),
            (K::AddrNotAvailable, &K::AddrNotAvailable.to_string()),
        ];
        for (kind, phrase) in phrases {
            assert_eq!(io_phrase(kind), phrase, "{kind:?}");
        }
    }

    #[test]
    fn parse_error_text_is_cut_at_a_password_mention() {
        assert_eq!(redact("invalid value for option `password`: hunter2"), "invalid value for option `password …");
        assert_eq!(redact("unknown option `bogus`"), "unknown option `bogus`");
    }

    #[test]
    fn dsn_values_are_percent_encoded_again_after_decoding() {
        let (d, _) = preprocess_dsn("postgres://u@h/db?application_name=le%20app%2Fone%3F&sslmode=verify-ca");
        assert_eq!(d, "postgres://u@h/db?application_name=le%20app/one%3F&sslmode=require");
        let cfg = Config::from_str(&d).unwrap();
        assert_eq!(cfg.get_application_name(), Some("le app/one?"));
    }
}
