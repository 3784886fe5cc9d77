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
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls};

use super::conn::{classify_connect, PgManager};
use super::tls::{MakeTls, TlsTrace};
use crate::error::Human;
use crate::feed::Subscribers;
use crate::store::StoreError;
use crate::timing::MAX_NAME_LEN;

/// How long a new listening connection waits for its own probe.
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// How often an idle listening connection checks that it still reaches the
/// server (a half-open TCP connection would otherwise hear nothing forever).
const CHECK_EVERY: Duration = Duration::from_secs(30);
/// Reconnecting waits this long at first, doubling up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Probes that fail in a row before the feed gives up for good.
const PROBES: u32 = 3;

/// The notification channel of election table `qualified`: a name the
/// length of the table's never matters (63 bytes at most), the same in
/// every process.
pub(super) fn channel(qualified: &str) -> String {
    format!("leaderelection_{:016x}", crate::feed::fnv1a64(qualified))
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
    subscribers: Subscribers,
    started: AtomicBool,
    /// The store is gone, or the feed gave up: no more subscriptions.
    ended: AtomicBool,
    /// The probe a new connection waits for, and where to say it came.
    probe: Mutex<Option<(String, Arc<AtomicBool>)>>,
}

impl Feed {
    pub(super) fn new(qualified: &str) -> Feed {
        Feed {
            shared: Arc::new(Shared {
                channel: channel(qualified),
                subscribers: Subscribers::default(),
                started: AtomicBool::new(false),
                ended: AtomicBool::new(false),
                probe: Mutex::new(None),
            }),
        }
    }

    /// A new subscription, starting the thread on the first; `None` once
    /// the feed has ended or the thread cannot be started.
    pub(super) fn subscribe(&self, manager: &Arc<PgManager>, pool: &r2d2::Pool<PgManager>) -> Option<Receiver<String>> {
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

    fn deliver(&self, name: &str) {
        if name.len() > MAX_NAME_LEN {
            // A probe (ours, or another process's).
            if let Some((probe, heard)) = &*self.probe.lock() {
                if probe == name {
                    heard.store(true, Ordering::SeqCst);
                }
            }
            return;
        }
        self.subscribers.send(name);
    }
}

/// Why a listening connection ended.
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
    let (mut backoff, mut deaf) = (FIRST_BACKOFF, 0);
    while !shared.ended.load(Ordering::SeqCst) {
        let started = Instant::now();
        match session(shared, manager, pool, &rt) {
            Ended::Stopped => break,
            Ended::Deaf => {
                deaf += 1;
                if deaf >= PROBES {
                    log::info!(
                        "leaderelection: release notifications do not reach a listening connection \
                         (a pooler in transaction mode?); followers learn of releases by polling"
                    );
                    break;
                }
            }
            Ended::Failed(e) => {
                log::debug!("leaderelection: release listener: {e}; connecting again");
                if started.elapsed() > CHECK_EVERY {
                    backoff = FIRST_BACKOFF;
                }
            }
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !shared.ended.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now())));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One listening connection, from connect to its end.
fn session(shared: &Shared, manager: &PgManager, pool: &r2d2::Pool<PgManager>, rt: &tokio::runtime::Runtime) -> Ended {
    let deadline = tokio::time::Instant::now() + manager.connect_timeout();
    let trace = Arc::new(TlsTrace::default());
    // Named apart from the pool's sessions, so an operator (or a test
    // counting a pool's sessions) tells the listening one from them.
    let mut config = manager.config().clone();
    let app = format!("{} listen", config.get_application_name().unwrap_or("leaderelection"));
    config.application_name(&app);
    match manager.tls() {
        None => {
            let opened = rt.block_on(async { tokio::time::timeout_at(deadline, config.connect(NoTls)).await });
            match opened {
                Ok(Ok((client, conn))) => listen(shared, manager.connect_timeout(), pool, rt, &client, conn),
                Ok(Err(e)) => Ended::Failed(classify_connect(&e, None)),
                Err(_) => Ended::Failed(no_connect(manager.connect_timeout())),
            }
        }
        Some(tls) => {
            let tls = MakeTls::new(tls.clone(), Arc::clone(&trace));
            let opened = rt.block_on(async { tokio::time::timeout_at(deadline, config.connect(tls)).await });
            match opened {
                Ok(Ok((client, conn))) => listen(shared, manager.connect_timeout(), pool, rt, &client, conn),
                Ok(Err(e)) => Ended::Failed(classify_connect(&e, Some(&trace))),
                Err(_) => Ended::Failed(no_connect(manager.connect_timeout())),
            }
        }
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
    let waited = rt.block_on(idle(shared, &mut conn, PROBE_WAIT, || heard.load(Ordering::SeqCst)));
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
    log::debug!("leaderelection: listening for releases on {}", shared.channel);
    loop {
        if shared.ended.load(Ordering::SeqCst) {
            return Ended::Stopped;
        }
        // Idle for a while, then check the connection with an empty query.
        let checked = rt.block_on(async {
            idle(shared, &mut conn, CHECK_EVERY, || false).await?;
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
    E: std::fmt::Display,
{
    let mut fut = std::pin::pin!(fut);
    let mut timer = std::pin::pin!(tokio::time::sleep(timeout));
    poll_fn(|cx| {
        loop {
            match conn.poll_message(cx) {
                std::task::Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => shared.deliver(n.payload()),
                std::task::Poll::Ready(Some(Ok(_))) => {}
                std::task::Poll::Ready(Some(Err(e))) => {
                    return std::task::Poll::Ready(Err(StoreError::retryable(format!("release listener: {e}"))))
                }
                std::task::Poll::Ready(None) => {
                    return std::task::Poll::Ready(Err(StoreError::retryable("release listener: connection closed")))
                }
                std::task::Poll::Pending => break,
            }
        }
        if let std::task::Poll::Ready(r) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(r.map_err(|e| StoreError::retryable(format!("release listener: {e}"))));
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
        let shared = Shared {
            channel: channel("t"),
            subscribers: Subscribers::default(),
            started: AtomicBool::new(true),
            ended: AtomicBool::new(false),
            probe: Mutex::new(None),
        };
        let rx = shared.subscribers.subscribe();
        shared.deliver(&probe_payload());
        shared.deliver("jobs");
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["jobs"]);
        drop(rx);
        shared.deliver("jobs");
        assert_eq!(shared.subscribers.len(), 0, "a gone subscriber is forgotten");
    }
}
