//! First mistakes against PostgreSQL come back at once with their SQLSTATE
//! or TLS reason; an unreachable server within the connect timeout; TLS
//! failures are classified by cause (DESIGN §9). Run with
//! `bash scripts/test.sh` (it exports the DSNs), or after
//! `source scripts/db.sh`:
//! `cargo test --features postgres --test postgres_first_errors`.
//!
//! Each case checks the kind, the message, and how long the error took, on
//! the store's first call and through an [`Elector`]'s status. A bad
//! password cannot be provoked on the trust-auth test servers: a fake server
//! below answers the login with 28P01 instead.

mod pg_support;
mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::postgres::{PostgresStore, DEFAULT_CONNECT_TIMEOUT};
use leaderelection::{ElectionError, Elector, Store, StoreError};
use pg_support::{client, dsn_via, host_port, BOUNCER, DIRECT};
use support::{config, random_tag, wait_for, Proxy, TIMING};

/// "At once": a fatal answer from the server, with the connection set up
/// and torn down, on a loaded two-core machine.
const AT_ONCE: Duration = Duration::from_secs(1);
/// Allowed past a timeout the error is bounded by.
const SLACK: Duration = Duration::from_millis(750);
/// The elector's operation timeout in these tests.
const OP: Duration = TIMING.operation_timeout;

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// A store's first `ensure_schema()`, which must fail.
fn first_error(case: &str, store: &PostgresStore) -> (StoreError, Duration) {
    let (r, took) = timed(|| store.ensure_schema());
    let err = r.expect_err(case);
    eprintln!("{case}: ensure_schema failed after {took:?}: {err}");
    (err, took)
}

/// [`first_error`] on `store` comes back within [`AT_ONCE`], of `fatal`
/// kind and naming `needle` ([`check`]); the error, for the case's own
/// checks.
fn first_error_at_once(case: &str, store: &PostgresStore, fatal: bool, needle: &str) -> StoreError {
    let (err, took) = first_error(case, store);
    check(case, &err, fatal, needle);
    assert!(took < AT_ONCE, "{case} took {took:?}");
    err
}

/// A fatal first error naming `needle`, at once, whichever way a store for
/// `d` is first used: its first call, a call bounded by the elector's
/// operation timeout, and an elector's status.
fn fatal_at_once_everywhere(case: &str, d: &str, needle: &str) {
    first_error_at_once(case, &store_for(d), true, needle);
    bounded_call(case, &store_for(d), true, needle);
    elector_reports_fatal(case, store_for(d), needle);
}

/// Checks an error's kind, that its text names `needle`, and that it holds
/// no password.
fn check(case: &str, err: &StoreError, fatal: bool, needle: &str) {
    assert_eq!(err.is_fatal(), fatal, "{case}: kind of {err:?}");
    assert!(fatal || err.is_retryable(), "{case}: {err:?}");
    let text = format!("{err} {err:?}");
    assert!(text.contains(needle), "{case}: {needle:?} missing from {err}");
    assert!(!text.contains("hunter2"), "{case}: password in {text}");
}

/// `Elector::start` on `store` reports a fatal `last_error` whose text names
/// `needle`, within [`AT_ONCE`], and never leads.
fn elector_reports_fatal(case: &str, store: PostgresStore, needle: &str) {
    let name = format!("first-{}", random_tag());
    let (elector, _) = timed(|| Elector::start(config(store, &name, "node-a")).expect("start"));
    let start = Instant::now();
    let mut last = None;
    let ok = wait_for(Duration::from_secs(10), || {
        last = elector.status().last_error;
        last.as_ref().is_some_and(ElectionError::is_fatal)
    });
    let took = start.elapsed();
    eprintln!("{case}: elector reported after {took:?}: {last:?}");
    assert!(ok, "{case}: no fatal last_error within 10s; last {last:?}");
    assert!(took < AT_ONCE, "{case}: the elector took {took:?} to report {last:?}");
    let text = last.unwrap().to_string();
    assert!(text.contains(needle) && !text.contains("hunter2"), "{case}: {text}");
    assert!(!elector.is_leader(), "{case}");
    elector.shutdown_without_release();
}

/// A store call with the elector's operation timeout: fails of `fatal`
/// kind, never later than the timeout.
fn bounded_call(case: &str, store: &PostgresStore, fatal: bool, needle: &str) {
    let (r, took) = timed(|| store.inspect("first-errors", OP));
    let err = r.expect_err(case);
    eprintln!("{case}: inspect({OP:?}) failed after {took:?}: {err}");
    check(case, &err, fatal, needle);
    let bound = if fatal { AT_ONCE.min(OP) } else { OP + Duration::from_millis(150) };
    assert!(took <= bound, "{case}: inspect with a {OP:?} timeout took {took:?}");
}

fn store_for(d: &str) -> PostgresStore {
    PostgresStore::builder(d).table("public", "le_first_errors").build().expect("a DSN that parses")
}

// ---- the server says no ----

#[test]
fn missing_database_is_fatal_at_once() {
    let d = missing_database(DIRECT);
    let store = store_for(&d);
    let err = first_error_at_once("missing database", &store, true, "3D000");
    assert!(err.to_string().contains("does not exist"), "{err}");
    // The same store asked again (r2d2 retries in the background): the
    // refusal it already knows comes back at once, not after a wait.
    let (again, took) = timed(|| store.inspect("first-errors", Duration::from_secs(5)));
    check("missing database, asked again", &again.expect_err("still missing"), true, "3D000");
    assert!(took < AT_ONCE, "the second call took {took:?}");
    bounded_call("missing database", &store_for(&d), true, "3D000");
    elector_reports_fatal("missing database", store_for(&d), "3D000");
}

#[test]
fn missing_role_is_fatal_at_once_and_the_password_never_shows() {
    let (host, port) = host_port(DIRECT);
    let user = format!("le_nobody_{}:hunter2", random_tag());
    let d = dsn_via(DIRECT, &host, port, Some(&user), "");
    assert!(!format!("{:?}", store_for(&d)).contains("hunter2"));
    fatal_at_once_everywhere("missing role", &d, "28000");
}

/// PgBouncer refuses a missing database or an unknown user itself, with
/// SQLSTATE 08P01 (protocol violation), the code it also uses for passing
/// trouble such as a server login that keeps failing: the store cannot tell
/// them apart, so these are retryable. They still come back at once, with
/// the code and PgBouncer's message.
#[test]
fn first_errors_through_pgbouncer_come_back_at_once() {
    let (host, port) = host_port(BOUNCER);
    let unknown_user = dsn_via(BOUNCER, &host, port, Some(&format!("le_nobody_{}", random_tag())), "");
    for (case, d, says) in [
        ("missing database via PgBouncer", missing_database(BOUNCER), "does not exist"),
        ("unknown user via PgBouncer", unknown_user, "authentication failed"),
    ] {
        let err = first_error_at_once(case, &store_for(&d), false, "SQLSTATE 08P01");
        assert!(err.to_string().contains(says), "{case}: {err}");
    }
}

// ---- nobody answers ----

#[test]
fn refused_port_is_retryable_within_the_connect_timeout() {
    let port = unused_port();
    let d = format!("postgres://app:hunter2@127.0.0.1:{port}/app");
    let (err, took) = first_error("refused port", &store_for(&d));
    check("refused port", &err, false, "refused");
    assert!(took < DEFAULT_CONNECT_TIMEOUT + SLACK, "refused port took {took:?}");
    bounded_call("refused port", &store_for(&d), false, "refused");
    // The elector keeps trying and says why, without leading.
    let elector = Elector::start(config(store_for(&d), "refused", "node-a")).expect("start");
    let mut last = None;
    let ok = wait_for(OP + SLACK, || {
        last = elector.status().last_error;
        last.is_some()
    });
    assert!(ok, "no last_error within {:?}", OP + SLACK);
    let last = last.unwrap();
    assert!(!last.is_fatal() && last.to_string().contains("refused"), "{last}");
    elector.shutdown_without_release();
}

#[test]
fn silent_server_is_retryable_within_the_connect_timeout() {
    let silent = SilentServer::start();
    let d = format!("postgres://app@127.0.0.1:{}/app", silent.port);
    let (err, took) = first_error("silent server", &store_for(&d));
    check("silent server", &err, false, "no answer within 5s");
    assert!(took >= DEFAULT_CONNECT_TIMEOUT, "gave up before the connect timeout: {took:?}");
    assert!(took < DEFAULT_CONNECT_TIMEOUT + SLACK, "silent server took {took:?}");
    // A call bounded by the elector's operation timeout.
    bounded_call("silent server", &store_for(&d), false, "no connection within 500ms: still connecting");
    // With a shorter connect timeout, that is the bound.
    let short = PostgresStore::builder(&d).connect_timeout(Duration::from_millis(800)).build().unwrap();
    let (err, took) = first_error("silent server, 800ms", &short);
    check("silent server, 800ms", &err, false, "no answer within 800ms");
    assert!(took < Duration::from_millis(800) + SLACK, "took {took:?}");
}

// ---- TLS ----

#[test]
fn server_without_tls_is_fatal_at_once() {
    // PgBouncer here has no TLS: it answers the SSL request with 'N'.
    let (host, port) = host_port(BOUNCER);
    let d = dsn_via(BOUNCER, &host, port, None, "?sslmode=require");
    fatal_at_once_everywhere("server without TLS", &d, "does not support TLS");
}

#[test]
fn certificate_that_does_not_verify_is_fatal_at_once() {
    let server_cert = server_certificate();
    let (_, port) = host_port(DIRECT);
    let dir = TempDir::new("le-first-errors-ca");
    let stranger = dir.path().join("stranger-ca.pem");
    make_cert(&stranger, "le-stranger-ca");
    // This machine's CA store trusts the test server's self-signed
    // certificate (Debian's snakeoil is linked into /etc/ssl/certs), so the
    // untrusted cases run against a TLS server of the test's own, whose fresh
    // certificate for `localhost` nobody signed.
    let own = dir.path().join("own.pem");
    make_cert(&own, CERT_NAME);
    let fake = TlsServer::start(&own);
    let ca = |path: &Path| format!("?sslmode=require&sslrootcert={}", path.display());
    let cases = [
        // The right CA, but an address the certificate does not name.
        (
            "host name mismatch",
            dsn_via(DIRECT, "127.0.0.1", port, None, &ca(&server_cert).replace("require", "verify-full")),
        ),
        // A certificate no CA the system trusts has signed.
        ("untrusted certificate", dsn_via(DIRECT, CERT_NAME, fake.port, None, "?sslmode=require")),
        // A CA file of a CA that did not sign it.
        ("unrelated CA file", dsn_via(DIRECT, CERT_NAME, fake.port, None, &ca(&stranger))),
    ];
    for (case, d) in &cases {
        let err = first_error_at_once(case, &store_for(d), true, "TLS handshake rejected");
        assert!(err.to_string().contains("certificate verify failed"), "{case}: {err}");
        bounded_call(case, &store_for(d), true, "certificate verify failed");
    }
    elector_reports_fatal("host name mismatch", store_for(&cases[0].1), "certificate verify failed");
    elector_reports_fatal("unrelated CA file", store_for(&cases[2].1), "certificate verify failed");
    // Control: the same server verifies by the name its certificate has, so
    // the failures above are the certificates', not a TLS setup that never works.
    let good = dsn_via(DIRECT, CERT_NAME, port, None, &ca(&server_cert));
    store_for(&good).ensure_schema().expect("TLS to the server by its certificate's name");
}

/// A [`TlsCutter`] in front of the server, passing everything, and a DSN
/// through it that verifies the server's certificate. Control: through the
/// proxy, TLS works.
fn tls_through_a_cutter() -> (TlsCutter, String) {
    let server_cert = server_certificate();
    let proxy = TlsCutter::start(host_port(DIRECT));
    let params = format!("?sslmode=require&sslrootcert={}", server_cert.display());
    let d = dsn_via(DIRECT, CERT_NAME, proxy.port, None, &params);
    store_for(&d).ensure_schema().expect("TLS through the proxy");
    (proxy, d)
}

#[test]
fn tls_handshake_cut_by_the_network_is_retryable() {
    let (proxy, d) = tls_through_a_cutter();
    for (case, mode) in [("cut after the server's S", CUT_AFTER_S), ("cut inside the handshake", CUT_MID_HANDSHAKE)] {
        proxy.set(mode);
        first_error_at_once(case, &store_for(&d), false, "TLS handshake cut off");
        bounded_call(case, &store_for(&d), false, "TLS handshake cut off");
    }
    proxy.set(PASS);
    store_for(&d).ensure_schema().expect("TLS through the proxy again");
}

/// The scenario: a leader over TLS whose handshakes are reset for a
/// while (PgBouncer or the server restarting) rides out the lease instead of
/// ending its term at once.
#[test]
fn leader_rides_out_tls_handshake_resets() {
    let (proxy, d) = tls_through_a_cutter();
    let name = format!("tls-cut-{}", random_tag());
    let elector = Elector::start(config(store_for(&d), &name, "node-a")).expect("start");
    let guard = elector.wait_leader_timeout(Duration::from_secs(10)).expect("leads over TLS");
    // Let a renewal land so the deadline is fresh, then cut everything.
    let fence = guard.fence();
    // Renewals every 400 ms keep the deadline 1.85-2.25 s ahead.
    let renewed = wait_for(Duration::from_secs(3), || {
        elector.status().valid_until.is_some_and(|u| u > Instant::now() + Duration::from_millis(1800))
    });
    assert!(renewed, "no fresh renewal");
    proxy.set(CUT_AFTER_S);
    proxy.drop_connections();
    let cut = Duration::from_millis(800);
    let until = Instant::now() + cut;
    let mut errors = Vec::new();
    while Instant::now() < until {
        assert!(guard.is_valid(), "the term ended during a {cut:?} TLS outage: {:?}", elector.status().last_error);
        if let Some(e) = elector.status().last_error {
            errors.push(e);
        }
        thread::sleep(Duration::from_millis(10));
    }
    proxy.set(PASS);
    assert!(
        errors.iter().any(|e| !e.is_fatal() && e.to_string().contains("TLS handshake cut off")),
        "the outage was not seen as a cut TLS handshake: {errors:?}"
    );
    assert!(errors.iter().all(|e| !e.is_fatal()), "fatal errors: {errors:?}");
    // Renewals land again and the same term goes on.
    let back = wait_for(Duration::from_secs(3), || elector.status().last_error.is_none() && guard.is_valid());
    assert!(back, "no renewal after the outage: {:?}", elector.status());
    assert_eq!(elector.fence(), Some(fence));
    drop(guard);
    elector.shutdown().expect("shutdown");
}

/// Watching the attempts must not open more: a first call on an empty pool
/// opens exactly one connection (an early version looked for the new
/// connection with `get_timeout`, which started a second attempt while the
/// first still counted as pending).
#[test]
fn first_call_opens_one_connection() {
    let proxy = Proxy::start(host_port(DIRECT));
    let d = dsn_via(DIRECT, "127.0.0.1", proxy.port, None, "");
    let stores: Vec<PostgresStore> = (0..5).map(|_| store_for(&d)).collect();
    for (i, s) in stores.iter().enumerate() {
        s.ensure_schema().expect("ensure_schema through the proxy");
        s.inspect("first-errors", OP).ok();
        let opened = wait_for(Duration::from_secs(2), || proxy.open_connections() == i + 1);
        assert!(opened, "store {i}: {} connections open, {} expected", proxy.open_connections(), i + 1);
        // An absence cannot be waited for: give a stray second attempt
        // (which would start within a millisecond) time to land.
        thread::sleep(Duration::from_millis(50));
        assert_eq!(proxy.open_connections(), i + 1, "store {i} opened more than one connection");
    }
}

// ---- a fake server for the logins the test servers cannot refuse ----

#[test]
fn bad_password_is_fatal_at_once() {
    let fake = FakeServer::start(Login::AskPassword {
        then: Some(("28P01", "password authentication failed for user \"app\"")),
    });
    let d = format!("postgres://app:hunter2@127.0.0.1:{}/app", fake.port);
    let err = first_error_at_once("bad password", &store_for(&d), true, "28P01");
    assert!(err.to_string().contains("password authentication failed"), "{err}");
    elector_reports_fatal("bad password", store_for(&d), "28P01");
}

#[test]
fn missing_password_is_fatal_at_once() {
    let fake = FakeServer::start(Login::AskPassword { then: None });
    let d = format!("postgres://app@127.0.0.1:{}/app", fake.port);
    first_error_at_once("missing password", &store_for(&d), true, "password missing");
}

#[test]
fn server_starting_up_is_retryable() {
    let fake = FakeServer::start(Login::Refuse("57P03", "the database system is starting up"));
    let d = format!("postgres://app@127.0.0.1:{}/app", fake.port);
    first_error_at_once("starting up", &store_for(&d), false, "57P03");
}

/// A pool built outside the store keeps only the text of its last error;
/// the kind is still right, read from the SQLSTATE.
#[test]
fn pool_built_elsewhere_still_reports_the_kind() {
    use leaderelection::postgres::PgManager;
    let d = missing_database(DIRECT);
    let manager = PgManager::from_dsn(&d, None, None).unwrap();
    let pool = r2d2::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_millis(500))
        .test_on_check_out(false)
        .build_unchecked(manager);
    let store = PostgresStore::from_pool(pool, "public", "le_first_errors").unwrap();
    let (err, took) = first_error("pool built elsewhere", &store);
    check("pool built elsewhere", &err, true, "3D000");
    assert!(took < Duration::from_millis(500) + SLACK, "took {took:?}");
}

/// A pool built outside the store that cannot reach its server: retryable,
/// after the pool's own connection timeout.
#[test]
fn pool_built_elsewhere_reports_a_refused_port_as_retryable() {
    use leaderelection::postgres::PgManager;
    let d = format!("postgres://app:hunter2@127.0.0.1:{}/app", unused_port());
    let manager = PgManager::from_dsn(&d, None, None).unwrap();
    let wait = Duration::from_millis(300);
    let pool = r2d2::Pool::builder().max_size(1).connection_timeout(wait).build_unchecked(manager);
    let store = PostgresStore::from_pool(pool, "public", "le_first_errors").unwrap();
    let (r, took) = timed(|| store.inspect("first-errors", Duration::from_secs(5)));
    check("pool built elsewhere, refused", &r.expect_err("nothing listens"), false, "no connection within");
    assert!(took >= wait && took < wait + SLACK, "took {took:?}");
}

/// A server that closes the connection after the startup packet, with no
/// word (a pooler or server going down mid-login): retryable, at once.
#[test]
fn server_hanging_up_during_login_is_retryable_at_once() {
    let fake = FakeServer::start(Login::HangUp);
    let d = format!("postgres://app:hunter2@127.0.0.1:{}/app", fake.port);
    first_error_at_once("hang-up during login", &store_for(&d), false, "closed the connection during login");
}

/// `sslmode=require` over a Unix socket has no host name to verify a
/// certificate against (and the server offers no TLS there): fatal, at
/// once, saying so.
#[test]
fn tls_over_a_unix_socket_is_fatal_at_once() {
    let dir = "/var/run/postgresql";
    let (_, port) = host_port(DIRECT);
    assert!(
        Path::new(&format!("{dir}/.s.PGSQL.{port}")).exists(),
        "no PostgreSQL socket in {dir} for port {port}: run `source scripts/db.sh`"
    );
    let d = format!("host={dir} port={port} user=root dbname=test sslmode=require");
    first_error_at_once("unix socket with sslmode=require", &store_for(&d), true, "TLS needs a host name");
}

// ---- helpers ----

/// `var`'s server and user, and a database that does not exist.
fn missing_database(var: &str) -> String {
    let (host, port) = host_port(var);
    let cfg: tokio_postgres::Config = pg_support::dsn(var).parse().expect("test DSN parses");
    let user = cfg.get_user().unwrap_or("root");
    format!("postgres://{user}@{host}:{port}/le_missing_{}", random_tag())
}

/// The name the server's certificate is issued to (Debian's snakeoil).
const CERT_NAME: &str = "localhost";

/// The server's own certificate (self-signed), to use as its CA.
fn server_certificate() -> PathBuf {
    let mut c = client(DIRECT);
    let row = c.simple_query("SHOW ssl").unwrap();
    let on = row.iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    });
    assert_eq!(on.as_deref(), Some("on"), "these tests need ssl = on on the server behind LE_PG_DSN");
    let rows = c.simple_query("SHOW ssl_cert_file").unwrap();
    let file = rows
        .iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(PathBuf::from),
            _ => None,
        })
        .expect("ssl_cert_file");
    let file = if file.is_relative() { data_dir(&mut c).join(file) } else { file };
    assert!(std::fs::metadata(&file).is_ok(), "cannot read the server's certificate {}", file.display());
    file
}

fn data_dir(c: &mut postgres::Client) -> PathBuf {
    let rows = c.simple_query("SHOW data_directory").unwrap();
    rows.iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(PathBuf::from),
            _ => None,
        })
        .expect("data_directory")
}

/// A fresh self-signed certificate for `name` at `pem`, its key beside it.
fn make_cert(pem: &Path, name: &str) {
    let key = pem.with_extension("key");
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"])
        .arg("-subj")
        .arg(format!("/CN={name}"))
        .arg("-addext")
        .arg(format!("subjectAltName=DNS:{name}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(pem)
        .output()
        .expect("these tests need the openssl command");
    assert!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
}

/// Answers the SSL request with 'S' and offers the certificate at `pem`
/// (key beside it) in a TLS handshake; never gets further.
struct TlsServer {
    port: u16,
}

impl TlsServer {
    fn start(pem: &Path) -> TlsServer {
        let cert = std::fs::read(pem).unwrap();
        let key = std::fs::read(pem.with_extension("key")).unwrap();
        let identity = native_tls::Identity::from_pkcs8(&cert, &key).expect("the generated certificate loads");
        let acceptor = Arc::new(native_tls::TlsAcceptor::new(identity).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for mut c in listener.incoming().flatten() {
                let acceptor = Arc::clone(&acceptor);
                thread::spawn(move || {
                    let mut request = [0u8; 8];
                    if c.read_exact(&mut request).is_ok() && c.write_all(b"S").is_ok() {
                        // The client refuses the certificate: this fails.
                        let _ = acceptor.accept(c);
                    }
                });
            }
        });
        TlsServer { port }
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", random_tag()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nothing listens on (bound, then released).
fn unused_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Accepts TCP connections and never says a word.
struct SilentServer {
    port: u16,
}

impl SilentServer {
    fn start() -> SilentServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().flatten() {
                held.push(s);
            }
        });
        SilentServer { port }
    }
}

const PASS: u8 = 0;
const CUT_AFTER_S: u8 = 1;
const CUT_MID_HANDSHAKE: u8 = 2;

/// A TCP proxy in front of the server that can cut TLS handshakes: it relays
/// the SSL request and the server's 'S', then closes both ends
/// (`CUT_AFTER_S`), or also relays the client's hello and the first bytes of
/// the server's reply before closing (`CUT_MID_HANDSHAKE`).
struct TlsCutter {
    port: u16,
    mode: Arc<AtomicU8>,
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl TlsCutter {
    fn start(target: (String, u16)) -> TlsCutter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(PASS));
        let live = Arc::new(Mutex::new(Vec::new()));
        let (m, l) = (Arc::clone(&mode), Arc::clone(&live));
        thread::spawn(move || {
            for c in listener.incoming().flatten() {
                let Ok(s) = TcpStream::connect((target.0.as_str(), target.1)) else { continue };
                let mode = m.load(Ordering::SeqCst);
                let l = Arc::clone(&l);
                thread::spawn(move || match mode {
                    PASS => {
                        l.lock().unwrap().extend([c.try_clone().unwrap(), s.try_clone().unwrap()]);
                        relay_both(c, s);
                    }
                    _ => cut(c, s, mode == CUT_MID_HANDSHAKE),
                });
            }
        });
        TlsCutter { port, mode, live }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// Closes every relayed connection, as a restarting pooler would.
    fn drop_connections(&self) {
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn relay_both(c: TcpStream, s: TcpStream) {
    let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
    thread::spawn(move || relay(c2, s2));
    relay(s, c);
}

fn relay(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn cut(mut c: TcpStream, mut s: TcpStream, mid_handshake: bool) {
    let _ = (|| -> std::io::Result<()> {
        let mut request = [0u8; 8];
        c.read_exact(&mut request)?;
        s.write_all(&request)?;
        let mut answer = [0u8; 1];
        s.read_exact(&mut answer)?;
        c.write_all(&answer)?;
        if mid_handshake && answer[0] == b'S' {
            // The client's hello (one TLS record), then a few bytes of the
            // server's: not enough for it to present a certificate.
            let mut header = [0u8; 5];
            c.read_exact(&mut header)?;
            let mut body = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
            c.read_exact(&mut body)?;
            s.write_all(&header)?;
            s.write_all(&body)?;
            let mut some = [0u8; 20];
            s.read_exact(&mut some)?;
            c.write_all(&some)?;
        }
        Ok(())
    })();
    let _ = c.shutdown(Shutdown::Both);
    let _ = s.shutdown(Shutdown::Both);
}

/// How [`FakeServer`] answers a login.
#[derive(Clone, Copy)]
enum Login {
    /// Ask for a cleartext password; read it, then send this error (or, with
    /// `None`, nothing: the client without a password gives up first).
    AskPassword { then: Option<(&'static str, &'static str)> },
    /// Refuse the login with this SQLSTATE and message.
    Refuse(&'static str, &'static str),
    /// Close the connection without a word.
    HangUp,
}

/// Speaks just enough of the PostgreSQL protocol to refuse a login.
struct FakeServer {
    port: u16,
}

impl FakeServer {
    fn start(login: Login) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for c in listener.incoming().flatten() {
                thread::spawn(move || {
                    let _ = fake_login(c, login);
                });
            }
        });
        FakeServer { port }
    }
}

fn fake_login(mut c: TcpStream, login: Login) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    // The startup packet: length, protocol 3.0, then parameters.
    let mut len = [0u8; 4];
    c.read_exact(&mut len)?;
    let mut rest = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
    c.read_exact(&mut rest)?;
    let error = match login {
        Login::HangUp => {
            let _ = c.shutdown(Shutdown::Both);
            return Ok(());
        }
        Login::Refuse(code, msg) => (code, msg),
        Login::AskPassword { then } => {
            c.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3])?; // AuthenticationCleartextPassword
            let Some(then) = then else {
                let mut sink = [0u8; 64];
                let _ = c.read(&mut sink);
                return Ok(());
            };
            let mut tag = [0u8; 1];
            c.read_exact(&mut tag)?;
            c.read_exact(&mut len)?;
            let mut password = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
            c.read_exact(&mut password)?;
            assert_eq!(tag[0], b'p');
            then
        }
    };
    let mut fields = Vec::new();
    for (t, v) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', error.0), (b'M', error.1)] {
        fields.push(t);
        fields.extend_from_slice(v.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    msg.extend_from_slice(&fields);
    c.write_all(&msg)?;
    let _ = c.shutdown(Shutdown::Write);
    let mut sink = [0u8; 64];
    let _ = c.read(&mut sink);
    Ok(())
}
