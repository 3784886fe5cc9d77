//! The feed of releases ([`Store::releases`](crate::Store::releases)): a
//! thread of its own holds one connection that `LISTEN`s on the table's
//! channel, and hands each released election's name to every subscriber.
//!
//! Releases notify in the statement that releases (see `sql::release`),
//! so a name is sent exactly when a live term was released, and only once
//! the release has committed. Renewals never notify: a live leader wakes
//! nobody.
//!
//! The feed is a hint (see the trait): it may lose names while its
//! connection is down or a subscriber's channel is full, and followers keep
//! polling. What it must never do is pass itself off where it cannot work:
//! behind a pooler in transaction mode, `LISTEN` registers on whichever
//! server connection the pooler lent and is lost with it. So each new
//! listening connection first proves itself: it sends a probe through the
//! store's pool (another client connection) and must receive it. Through
//! a transaction-mode pooler the probe's notification goes to the server
//! connection that sent it or to one that no client holds, never to the
//! listener, so the feed ends there and followers poll, as before.

use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::Mutex;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls, Socket};

use super::conn::{classify_connect, PgManager};
use super::locks;
use super::tls::{MakeTls, TlsTrace};
use crate::error::Human;
use crate::feed::Subscribers;
use crate::store::{Released, StoreError};
use crate::timing::MAX_NAME_LEN;

/// Probes that fail in a row before the feed gives up for good.
const PROBES: u32 = 3;

/// The feed's waits. Always [`PACE`] but in tests, which shorten them.
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// How long a new listening connection waits for its own probe.
    probe_wait: Duration,
    /// How often an idle listening connection checks that it still reaches
    /// the server (a half-open TCP connection would otherwise hear nothing
    /// forever).
    check_every: Duration,
    /// The first pause before connecting again; it doubles with each
    /// attempt in a row, up to `max_backoff`.
    first_backoff: Duration,
    max_backoff: Duration,
}

const PACE: Pace = Pace {
    probe_wait: Duration::from_secs(2),
    check_every: Duration::from_secs(30),
    first_backoff: Duration::from_millis(500),
    max_backoff: Duration::from_secs(30),
};

impl Pace {
    /// The pause before connecting again, after `previous` (`None` before
    /// the first) and a session that had worked for `worked`: the first
    /// pause again once a session outlived a check (its connection was
    /// good), else the previous one doubled, up to the longest.
    fn pause(&self, previous: Option<Duration>, worked: Duration) -> Duration {
        match previous {
            Some(p) if worked <= self.check_every => (p * 2).min(self.max_backoff),
            _ => self.first_backoff,
        }
    }
}

/// The notification channel of election table `qualified`: a name the
/// length of the table's never matters (63 bytes at most), the same in
/// every process.
pub(super) fn channel(qualified: &str) -> String {
    format!("leaderelection_{:016x}", crate::feed::fnv1a64(qualified))
}

/// What separates a released name from its fence in a notification's
/// payload (`sql::notify` writes it as `chr(31)`).
pub(super) const FENCE_MARK: char = '\u{1f}';

/// A notification's name and fence. A payload without a fence (a release
/// sent by an older build, which notified the name alone) is all name.
fn parse_payload(payload: &str) -> (&str, Option<u64>) {
    match payload.rsplit_once(FENCE_MARK).map(|(n, f)| (n, f.parse().ok())) {
        Some((name, Some(fence))) => (name, Some(fence)),
        _ => (payload, None),
    }
}

/// A probe's payload: longer than any election name, so no subscriber can
/// take it for one.
fn probe_payload() -> String {
    let mut random = [0u8; 8];
    let tag = getrandom::fill(&mut random).map(|()| u64::from_le_bytes(random)).unwrap_or(0);
    format!("leaderelection probe {tag:016x} {}", "-".repeat(MAX_NAME_LEN))
}

/// What the store keeps: the subscribers, shared with the thread, which
/// is started by the first subscription. Dropping the last clone of the
/// store stops the thread (within a second) and closes its connection.
pub(super) struct Feed {
    shared: Arc<Shared>,
}

struct Shared {
    channel: String,
    /// Shared with the lock feed (`locks.rs`).
    subscribers: Arc<Subscribers>,
    started: AtomicBool,
    /// The store is gone, or the feed gave up: no more subscriptions.
    ended: AtomicBool,
    /// The probe a new connection waits for, and where to say it came.
    probe: Mutex<Option<(String, Arc<AtomicBool>)>>,
    /// What the probes found out about this server's sessions, for the
    /// lock feed.
    lent: Arc<locks::Lent>,
    pace: Pace,
}

impl Feed {
    pub(super) fn new(qualified: &str, subscribers: &Arc<Subscribers>, lent: &Arc<locks::Lent>) -> Feed {
        Feed {
            shared: Arc::new(Shared {
                channel: channel(qualified),
                subscribers: Arc::clone(subscribers),
                started: AtomicBool::new(false),
                ended: AtomicBool::new(false),
                probe: Mutex::new(None),
                lent: Arc::clone(lent),
                pace: PACE,
            }),
        }
    }

    /// A new subscription, starting the thread on the first; `None` once
    /// the feed has ended or the thread cannot be started.
    pub(super) fn subscribe(
        &self, manager: &Arc<PgManager>, pool: &r2d2::Pool<PgManager>,
    ) -> Option<Receiver<Released>> {
        if self.shared.ended.load(Ordering::SeqCst) {
            return None;
        }
        let rx = self.shared.subscribers.subscribe();
        if !self.shared.started.swap(true, Ordering::SeqCst) {
            let (shared, manager, pool) = (Arc::clone(&self.shared), Arc::clone(manager), pool.clone());
            let spawned = std::thread::Builder::new()
                .name("leaderelection-listen".into())
                .spawn(move || run(&shared, &manager, &pool));
            if let Err(e) = spawned {
                log::warn!("leaderelection: cannot start the release listener ({e}); followers poll");
                self.shared.end();
                return None;
            }
        }
        Some(rx)
    }

    /// Whether the first subscription started the thread.
    pub(super) fn started(&self) -> bool {
        self.shared.started.load(Ordering::SeqCst)
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.shared.ended.store(true, Ordering::SeqCst);
    }
}

impl Shared {
    /// Ends every subscription: their receivers see the channel closed,
    /// and their drivers go on polling.
    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.subscribers.clear();
    }

    fn deliver(&self, payload: &str) {
        let (name, fence) = parse_payload(payload);
        if name.len() > MAX_NAME_LEN {
            // A probe (ours, or another process's).
            if let Some((probe, heard)) = &*self.probe.lock() {
                if probe == name {
                    heard.store(true, Ordering::SeqCst);
                }
            }
            return;
        }
        self.subscribers.send(name, fence);
    }
}

/// Why a listening connection ended.
#[derive(Debug)]
enum Ended {
    /// The store is gone.
    Stopped,
    /// The probe did not come back: no notifications reach this connection.
    Deaf,
    /// The connection failed; connect again.
    Failed(StoreError),
}

/// The thread: connect, prove, listen; again after a failure, with a
/// growing pause; until the store is gone or the probes keep failing.
fn run(shared: &Shared, manager: &PgManager, pool: &r2d2::Pool<PgManager>) {
    // However the thread ends (a panic too), its subscribers learn of it.
    struct EndOnExit<'a>(&'a Shared);
    impl Drop for EndOnExit<'_> {
        fn drop(&mut self) {
            self.0.end();
        }
    }
    let _end = EndOnExit(shared);
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        log::warn!("leaderelection: cannot start the release listener's runtime; followers poll");
        return;
    };
    let (mut pause, mut deaf) = (None, 0);
    while !shared.ended.load(Ordering::SeqCst) {
        let started = Instant::now();
        let worked = match session(shared, manager, pool, &rt) {
            Ended::Stopped => break,
            Ended::Deaf => {
                deaf += 1;
                if deaf >= PROBES {
                    shared.lent.set(true);
                    log::info!(
                        "leaderelection: release notifications do not reach a listening connection \
                         (a pooler in transaction mode?); followers learn of releases by polling"
                    );
                    break;
                }
                Duration::ZERO
            }
            Ended::Failed(e) => {
                log::debug!("leaderelection: release listener: {e}; connecting again");
                started.elapsed()
            }
        };
        let wait = shared.pace.pause(pause, worked);
        pause = Some(wait);
        let until = Instant::now() + wait;
        while Instant::now() < until && !shared.ended.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now())));
        }
    }
}

/// One listening connection, from connect to its end.
fn session(shared: &Shared, manager: &PgManager, pool: &r2d2::Pool<PgManager>, rt: &tokio::runtime::Runtime) -> Ended {
    // Named apart from the pool's sessions, so an operator (or a test
    // counting a pool's sessions) tells the listening one from them.
    let mut config = manager.config().clone();
    let app = format!("{} listen", config.get_application_name().unwrap_or("leaderelection"));
    config.application_name(&app);
    match manager.tls() {
        None => connect_and_listen(shared, manager, pool, rt, &config, NoTls, None),
        Some(tls) => {
            let trace = Arc::new(TlsTrace::default());
            let tls = MakeTls::new(tls.clone(), Arc::clone(&trace));
            connect_and_listen(shared, manager, pool, rt, &config, tls, Some(&trace))
        }
    }
}

/// Opens the listening connection with `tls` (`trace` its TLS steps, when
/// TLS is required), then listens on it.
fn connect_and_listen<T>(
    shared: &Shared, manager: &PgManager, pool: &r2d2::Pool<PgManager>, rt: &tokio::runtime::Runtime,
    config: &tokio_postgres::Config, tls: T, trace: Option<&TlsTrace>,
) -> Ended
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Unpin,
{
    let timeout = manager.connect_timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    match rt.block_on(async { tokio::time::timeout_at(deadline, config.connect(tls)).await }) {
        Ok(Ok((client, conn))) => listen(shared, timeout, pool, rt, &client, conn),
        Ok(Err(e)) => Ended::Failed(classify_connect(&e, trace)),
        Err(_) => Ended::Failed(no_connect(timeout)),
    }
}

fn no_connect(after: Duration) -> StoreError {
    StoreError::retryable(format!("cannot connect: no answer within {} (connect timeout)", Human(after)))
}

/// `LISTEN`, the probe, then names until the connection fails or the
/// store is gone.
fn listen<S, T>(
    shared: &Shared, timeout: Duration, pool: &r2d2::Pool<PgManager>, rt: &tokio::runtime::Runtime, client: &Client,
    mut conn: Connection<S, T>,
) -> Ended
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let listen = format!("LISTEN \"{}\"", shared.channel);
    if let Err(e) = rt.block_on(drive(shared, &mut conn, client.batch_execute(&listen), timeout)) {
        return Ended::Failed(e);
    }
    // The probe goes through the pool: another client connection, as a
    // release's notification comes from.
    let probe = probe_payload();
    let notify = format!("SELECT pg_notify('{}', '{probe}')", shared.channel);
    let heard = Arc::new(AtomicBool::new(false));
    *shared.probe.lock() = Some((probe, Arc::clone(&heard)));
    let sent = pool.get_timeout(timeout).map_err(|e| e.to_string()).and_then(|mut c| {
        c.simple_query(&notify, Instant::now() + timeout).map(drop).map_err(|_| "the probe failed".to_owned())
    });
    if let Err(e) = sent {
        return Ended::Failed(StoreError::retryable(format!("release listener probe: {e}")));
    }
    let waited = rt.block_on(idle(shared, &mut conn, shared.pace.probe_wait, || heard.load(Ordering::SeqCst)));
    *shared.probe.lock() = None;
    if let Err(e) = waited {
        return Ended::Failed(e);
    }
    if !heard.load(Ordering::SeqCst) {
        // Behind a pooler the `LISTEN` stayed on a server connection the
        // pooler lends to others; it most likely lends that one again now
        // (PgBouncer reuses the last), so take it back there.
        let _ = rt.block_on(drive(shared, &mut conn, client.batch_execute("UNLISTEN *"), timeout));
        return Ended::Deaf;
    }
    shared.lent.set(false);
    log::debug!("leaderelection: listening for releases on {}", shared.channel);
    loop {
        if shared.ended.load(Ordering::SeqCst) {
            return Ended::Stopped;
        }
        // Idle for a while, then check the connection with an empty query.
        let checked = rt.block_on(async {
            idle(shared, &mut conn, shared.pace.check_every, || false).await?;
            if shared.ended.load(Ordering::SeqCst) {
                return Ok(());
            }
            drive(shared, &mut conn, client.simple_query(""), timeout).await.map(drop)
        });
        if let Err(e) = checked {
            return Ended::Failed(e);
        }
    }
}

/// Runs `fut` while delivering the connection's notifications, giving up
/// after `timeout`.
async fn drive<S, T, F, R, E>(
    shared: &Shared, conn: &mut Connection<S, T>, fut: F, timeout: Duration,
) -> Result<R, StoreError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    F: std::future::Future<Output = Result<R, E>>,
    E: std::error::Error,
{
    let mut fut = std::pin::pin!(fut);
    let mut timer = std::pin::pin!(tokio::time::sleep(timeout));
    poll_fn(|cx| {
        loop {
            match conn.poll_message(cx) {
                std::task::Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => shared.deliver(n.payload()),
                std::task::Poll::Ready(Some(Ok(_))) => {}
                std::task::Poll::Ready(Some(Err(e))) => return std::task::Poll::Ready(Err(failed(&e))),
                std::task::Poll::Ready(None) => {
                    return std::task::Poll::Ready(Err(StoreError::retryable("release listener: connection closed")))
                }
                std::task::Poll::Pending => break,
            }
        }
        if let std::task::Poll::Ready(r) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(r.map_err(|e| failed(&e)));
        }
        if timer.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Err(StoreError::retryable(format!(
                "release listener: no answer within {}",
                Human::about(timeout)
            ))));
        }
        std::task::Poll::Pending
    })
    .await
}

/// A listening connection's failure, with the server's reason (the
/// driver's own text is only "db error").
fn failed(e: &dyn std::error::Error) -> StoreError {
    StoreError::retryable(format!("release listener: {}", crate::error::chain_text(e)))
}

/// Delivers notifications for `span`, or until `done` says so or the
/// store is gone (looked at every 50 ms).
async fn idle<S, T>(
    shared: &Shared, conn: &mut Connection<S, T>, span: Duration, mut done: impl FnMut() -> bool,
) -> Result<(), StoreError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let until = Instant::now() + span;
    while Instant::now() < until && !done() && !shared.ended.load(Ordering::SeqCst) {
        let tick = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<(), std::convert::Infallible>(())
        };
        drive(shared, conn, tick, Duration::from_secs(1)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_is_one_name_per_table_in_every_process() {
        let a = channel(r#""public"."leader_election""#);
        assert_eq!(a, channel(r#""public"."leader_election""#));
        assert_ne!(a, channel(r#""public"."other""#));
        assert!(a.len() <= 63 && a.starts_with("leaderelection_"), "{a}");
        // Pinned: processes of different builds must agree.
        assert_eq!(channel(""), "leaderelection_cbf29ce484222325");
    }

    #[test]
    fn a_probe_is_never_taken_for_a_name() {
        let shared = shared(&channel("t"), PACE);
        let rx = shared.subscribers.subscribe();
        shared.deliver(&probe_payload());
        shared.deliver("jobs");
        let got: Vec<Released> = rx.try_iter().collect();
        assert_eq!(got, [Released { name: "jobs".into(), fence: None }]);
        drop(rx);
        shared.deliver("jobs");
        assert_eq!(shared.subscribers.len(), 0, "a gone subscriber is forgotten");
    }

    #[test]
    fn a_payload_carries_the_name_and_the_fence_released() {
        assert_eq!(parse_payload("jobs\u{1f}42"), ("jobs", Some(42)));
        // A name may hold anything but control characters: spaces, digits.
        assert_eq!(parse_payload("17 jobs\u{1f}0"), ("17 jobs", Some(0)));
        // An older build's release: the name alone.
        assert_eq!(parse_payload("jobs"), ("jobs", None));
        assert_eq!(parse_payload("17 jobs"), ("17 jobs", None));
        // Not a fence: taken whole, so it matches no name.
        assert_eq!(parse_payload("jobs\u{1f}x"), ("jobs\u{1f}x", None));
        assert_eq!(parse_payload("jobs\u{1f}"), ("jobs\u{1f}", None));
        let long = probe_payload();
        assert_eq!(parse_payload(&long), (long.as_str(), None));
    }

    #[test]
    fn reconnecting_backs_off_and_starts_afresh_after_a_good_session() {
        let ms = Duration::from_millis;
        let mut waits = Vec::new();
        let mut last = None;
        for _ in 0..9 {
            // Connections that fail at once, or prove deaf (worked: zero).
            let wait = PACE.pause(last, Duration::ZERO);
            waits.push(wait.as_millis());
            last = Some(wait);
        }
        assert_eq!(waits, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]);
        // A session that outlived a check had a good connection: the next
        // failure is a new run of attempts.
        assert_eq!(PACE.pause(Some(Duration::from_secs(30)), Duration::from_secs(31)), ms(500));
        // One that did not goes on doubling.
        assert_eq!(PACE.pause(Some(ms(4_000)), Duration::from_secs(30)), ms(8_000));
    }

    fn shared(channel: &str, pace: Pace) -> Arc<Shared> {
        Arc::new(Shared {
            channel: channel.to_owned(),
            subscribers: Arc::default(),
            started: AtomicBool::new(true),
            ended: AtomicBool::new(false),
            probe: Mutex::new(None),
            lent: Arc::default(),
            pace,
        })
    }

    /// Waits short enough for a test: a check every 200 ms.
    const QUICK: Pace = Pace {
        probe_wait: Duration::from_secs(2),
        check_every: Duration::from_millis(200),
        first_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
    };

    fn manager(dsn: &str, timeout: Duration) -> Arc<PgManager> {
        Arc::new(PgManager::from_dsn(dsn, Some(timeout), None).expect("manager"))
    }

    fn pool(manager: &PgManager) -> r2d2::Pool<PgManager> {
        r2d2::Pool::builder().max_size(2).min_idle(Some(0)).build_unchecked(manager.clone())
    }

    /// One session of `shared` on a thread of its own; its end comes on the
    /// receiver.
    fn start_session(shared: &Arc<Shared>, manager: &Arc<PgManager>, pool: &r2d2::Pool<PgManager>) -> Receiver<Ended> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (shared, manager, pool) = (Arc::clone(shared), Arc::clone(manager), pool.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let _ = tx.send(session(&shared, &manager, &pool, &rt));
        });
        rx
    }

    /// The error a session failed with, within `within`.
    fn failure(ended: &Receiver<Ended>, within: Duration) -> StoreError {
        match ended.recv_timeout(within) {
            Ok(Ended::Failed(e)) => e,
            other => panic!("the session did not fail within {within:?}: {other:?}"),
        }
    }

    /// A port that takes connections (the kernel's backlog) and never
    /// answers.
    fn silent_port() -> (std::net::TcpListener, u16) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        (l, port)
    }

    #[test]
    fn a_server_that_never_answers_fails_the_session_at_the_connect_timeout() {
        let (_l, port) = silent_port();
        let m = manager(&format!("postgres://u@127.0.0.1:{port}/db"), Duration::from_millis(200));
        let started = Instant::now();
        let e = failure(&start_session(&shared("c", QUICK), &m, &pool(&m)), Duration::from_secs(10));
        assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains("no answer within 200ms (connect timeout)"), "{e}");
    }

    /// `sslmode=require` never falls back to plaintext on the listening
    /// connection either: a server that declines TLS fails it, fatally.
    #[test]
    fn the_listener_needs_the_tls_its_store_requires() {
        let (l, port) = silent_port();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for mut c in l.incoming().flatten() {
                let mut ssl_request = [0u8; 8];
                if c.read_exact(&mut ssl_request).is_ok() {
                    let _ = c.write_all(b"N");
                }
            }
        });
        let m = manager(&format!("postgres://u@127.0.0.1:{port}/db?sslmode=require"), Duration::from_secs(2));
        let e = failure(&start_session(&shared("c", QUICK), &m, &pool(&m)), Duration::from_secs(10));
        assert!(e.is_fatal(), "{e}");
        let text = "cannot connect: the server does not support TLS (sslmode=require never falls back to plaintext)";
        assert_eq!(e.to_string(), text);
    }

    use crate::postgres::test_dsn as pg_dsn;

    #[test]
    fn a_listen_the_server_refuses_fails_the_session() {
        let m = manager(&pg_dsn(), Duration::from_secs(5));
        // `LISTEN ""`: a zero-length identifier.
        let e = failure(&start_session(&shared("", QUICK), &m, &pool(&m)), Duration::from_secs(10));
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().starts_with("release listener: "), "{e}");
        assert!(e.to_string().contains("zero-length"), "{e}");
    }

    #[test]
    fn a_probe_that_cannot_be_sent_fails_the_session() {
        let m = manager(&pg_dsn(), Duration::from_secs(5));
        // `LISTEN` takes a channel name of 64 bytes (with a notice that it is
        // cut to 63); `pg_notify` refuses it.
        let e = failure(&start_session(&shared(&"c".repeat(64), QUICK), &m, &pool(&m)), Duration::from_secs(10));
        assert!(e.to_string().starts_with("release listener probe: "), "{e}");
        // And a pool that cannot connect sends no probe either.
        let m = manager(&pg_dsn(), Duration::from_secs(1));
        let (_l, port) = silent_port();
        let dead = manager(&format!("postgres://u@127.0.0.1:{port}/db"), Duration::from_millis(100));
        let e = failure(&start_session(&shared("c", QUICK), &m, &pool(&dead)), Duration::from_secs(10));
        assert!(e.to_string().starts_with("release listener probe: "), "{e}");
    }

    /// A TCP proxy to the server that forwards, swallows everything (a
    /// silent path: a half-open connection), or cuts its connections.
    struct Proxy {
        port: u16,
        silent: Arc<AtomicBool>,
        sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
    }

    impl Proxy {
        fn start(target: std::net::SocketAddr) -> Proxy {
            use std::io::{Read, Write};
            let (l, port) = silent_port();
            let (silent, sockets) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
            let (quiet, open) = (Arc::clone(&silent), Arc::clone(&sockets));
            std::thread::spawn(move || {
                for client in l.incoming().flatten() {
                    let Ok(server) = std::net::TcpStream::connect(target) else { continue };
                    let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) =
                        (client.try_clone(), server.try_clone(), client.try_clone(), server.try_clone())
                    else {
                        continue;
                    };
                    open.lock().extend([c3, s3]);
                    for (mut from, mut to) in [(client, s2), (server, c2)] {
                        let quiet = Arc::clone(&quiet);
                        std::thread::spawn(move || {
                            let mut buf = [0u8; 8192];
                            while let Ok(n @ 1..) = from.read(&mut buf) {
                                if !quiet.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        });
                    }
                }
            });
            Proxy { port, silent, sockets }
        }

        fn cut(&self) {
            for s in self.sockets.lock().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// A session listening through a proxy (the probe going straight to
    /// the server), once it has been heard: its proxy, its end, and a
    /// subscriber.
    fn listening_through_a_proxy() -> (Proxy, Arc<Shared>, Receiver<Ended>, Receiver<Released>) {
        let dsn = pg_dsn();
        let direct = manager(&dsn, Duration::from_secs(5));
        let config = direct.config();
        let target = match (&config.get_hosts()[0], config.get_ports().first()) {
            (tokio_postgres::config::Host::Tcp(h), port) => {
                std::net::ToSocketAddrs::to_socket_addrs(&(h.as_str(), port.copied().unwrap_or(5432)))
                    .expect("resolve")
                    .next()
                    .expect("an address")
            }
            #[allow(unreachable_patterns)]
            _ => panic!("LE_PG_DSN must use TCP"),
        };
        let proxy = Proxy::start(target);
        let mut via = tokio_postgres::Config::new();
        via.host("127.0.0.1").port(proxy.port).user(config.get_user().unwrap_or("postgres"));
        via.dbname(config.get_dbname().unwrap_or("postgres"));
        if let Some(password) = config.get_password() {
            via.password(password);
        }
        let via = Arc::new(PgManager::new(via, Some(Duration::from_millis(500)), None).expect("manager"));
        let shared = shared(&channel(&format!("listen-test-{}", proxy.port)), QUICK);
        let rx = shared.subscribers.subscribe();
        let pool = pool(&direct);
        let ended = start_session(&shared, &via, &pool);
        // Heard: a name sent straight to the server comes through the proxy,
        // and still does after several checks.
        let notify = |name: &str| {
            let sql = format!("SELECT pg_notify('{}', '{name}')", shared.channel);
            let mut c = pool.get().expect("a pooled connection");
            assert!(c.simple_query(&sql, Instant::now() + Duration::from_secs(5)).is_ok(), "notify {name}");
        };
        for i in 0..4 {
            let name = format!("n{i}");
            let deadline = Instant::now() + Duration::from_secs(5);
            // Sent again until heard: the first are sent before the session
            // listens.
            let heard = std::iter::from_fn(|| (Instant::now() < deadline).then_some(())).any(|()| {
                notify(&name);
                rx.recv_timeout(Duration::from_millis(100)).is_ok_and(|r| r.name == name && r.fence.is_none())
            });
            assert!(heard, "{name} was not heard through the proxy");
            assert!(ended.is_empty(), "the session ended while it worked");
            std::thread::sleep(QUICK.check_every); // time for a check to pass
        }
        (proxy, shared, ended, rx)
    }

    /// A connection that goes silent (a half-open TCP connection) is found
    /// by the next check, which gets no answer.
    #[test]
    fn a_silent_connection_is_found_by_its_check() {
        let (proxy, _shared, ended, _rx) = listening_through_a_proxy();
        proxy.silent.store(true, Ordering::SeqCst);
        let e = failure(&ended, Duration::from_secs(5));
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains("release listener: no answer within"), "{e}");
    }

    #[test]
    fn a_connection_cut_fails_the_session() {
        let (proxy, _shared, ended, _rx) = listening_through_a_proxy();
        proxy.cut();
        let e = failure(&ended, Duration::from_secs(5));
        assert!(e.is_retryable(), "{e}");
        assert_eq!(e.to_string(), "release listener: connection closed");
    }

    /// The control for both: a listening session that nothing disturbs goes
    /// on until its store is gone.
    #[test]
    fn a_session_left_alone_ends_only_with_its_store() {
        let (_proxy, shared, ended, _rx) = listening_through_a_proxy();
        assert!(ended.is_empty(), "the session ended by itself");
        shared.ended.store(true, Ordering::SeqCst);
        assert!(matches!(ended.recv_timeout(Duration::from_secs(5)), Ok(Ended::Stopped)), "did not stop");
    }
}
