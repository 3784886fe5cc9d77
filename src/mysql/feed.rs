//! The feed of releases ([`Store::releases`](crate::Store::releases)) on
//! MySQL and MariaDB, which have no `LISTEN`: named locks instead, through
//! the lock feed written once for both servers (`crate::lockfeed`, which
//! says how it works). Here: the lock of an identity is `GET_LOCK(L, 0)`,
//! given back with `RELEASE_LOCK(L)`; a waiter asks `IS_USED_LOCK(L)` and
//! waits with `GET_LOCK(L, 30), RELEASE_LOCK(L)` in one statement; the
//! store's sessions end with `KILL CONNECTION`. On a multi-primary cluster
//! named locks do not cross nodes, so the feed is off there.

use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder};

use super::cluster;
use crate::feed::fnv1a64;
use crate::lockfeed::{Failed, Locks, Pace, PACE};

/// The store's feed.
pub(super) type Feed = crate::lockfeed::Feed<NamedLocks>;

/// The named lock of `identity`'s leadership in the table `quoted` (36
/// characters; MySQL's limit is 64), the same in every process.
pub(super) fn lock_name(quoted: &str, identity: &str) -> String {
    format!("le:{:016x}:{:016x}", fnv1a64(quoted), fnv1a64(identity))
}

/// A new feed for the table `quoted`, whose sessions connect with `opts`.
pub(super) fn feed(quoted: &str, opts: &Opts, mode: Arc<cluster::Mode>, wakes_on_free: bool) -> Feed {
    paced(quoted, opts, mode, wakes_on_free, PACE)
}

fn paced(quoted: &str, opts: &Opts, mode: Arc<cluster::Mode>, wakes_on_free: bool, pace: Pace) -> Feed {
    let socket = opts.get_read_timeout().copied().unwrap_or(super::DEFAULT_SOCKET_TIMEOUT);
    let opts = Opts::from(OptsBuilder::from_opts(opts.clone()).read_timeout(Some(socket + pace.lock_wait)));
    let locks = NamedLocks { quoted: quoted.to_owned(), opts, mode };
    crate::lockfeed::Feed::new(locks, Arc::default(), wakes_on_free, pace)
}

/// MySQL's and MariaDB's named locks.
pub(super) struct NamedLocks {
    quoted: String,
    /// What the feed's sessions connect with: the pool's options, with a
    /// read timeout that outlasts a waiter's `GET_LOCK`.
    opts: Opts,
    mode: Arc<cluster::Mode>,
}

fn failed(e: mysql::Error) -> Failed {
    Failed::Session(e.to_string())
}

/// A `GET_LOCK` that answered NULL: an error on the server (or the wait
/// killed); the session goes.
fn null() -> Failed {
    Failed::Session("GET_LOCK answered NULL".into())
}

impl Locks for NamedLocks {
    type Session = Conn;
    type Lock = String;
    const SERVER: &'static str = "mysql";
    const OFF: &'static str = "named locks do not cross the nodes of a multi-primary cluster";

    fn lock(&self, identity: &str) -> String {
        lock_name(&self.quoted, identity)
    }

    fn off(&self) -> bool {
        self.mode.known() == Some(true)
    }

    /// A new session, once the store is known not to be a multi-primary
    /// cluster's (asked on this session when not known yet).
    fn connect(&self) -> Result<(Conn, u32), Failed> {
        let mut conn = Conn::new(self.opts.clone()).map_err(failed)?;
        if self.mode.known().is_none() {
            let rows = super::conn::query(&mut conn, cluster::DETECT).map_err(failed)?;
            self.mode.learn(cluster::multi_primary(&rows));
        }
        if self.off() {
            return Err(Failed::Off);
        }
        let id = conn.connection_id();
        Ok((conn, id))
    }

    fn take(&self, conn: &mut Conn, lock: &String) -> Result<bool, Failed> {
        let got: Option<Option<i64>> = conn.query_first(format!("SELECT GET_LOCK('{lock}', 0)")).map_err(failed)?;
        got.flatten().map(|g| g == 1).ok_or_else(null)
    }

    fn give_back(&self, conn: &mut Conn, lock: &String) -> Result<(), Failed> {
        conn.query_drop(format!("DO RELEASE_LOCK('{lock}')")).map_err(failed)
    }

    fn check(&self, conn: &mut Conn) -> Result<(), Failed> {
        conn.ping().map_err(failed)
    }

    fn held(&self, conn: &mut Conn, lock: &String) -> Result<bool, Failed> {
        let holder: Option<Option<u64>> = conn.query_first(format!("SELECT IS_USED_LOCK('{lock}')")).map_err(failed)?;
        Ok(holder.flatten().is_some())
    }

    fn wait(&self, conn: &mut Conn, lock: &String, wait: Duration) -> Result<bool, Failed> {
        let got: Option<(Option<i64>, Option<i64>)> = conn.query_first(wait_for(lock, wait)).map_err(failed)?;
        got.and_then(|g| g.0).map(|g| g == 1).ok_or_else(null)
    }

    fn kill(&self, ids: &[u32]) {
        if let Ok(mut conn) = Conn::new(self.opts.clone()) {
            for id in ids {
                let _ = conn.query_drop(format!("KILL CONNECTION {id}"));
            }
        }
    }
}

/// A waiter's statement: `lock` taken within `wait` and given back, in one
/// statement (so another waiter looking meanwhile almost never sees this
/// one hold it). The wait in seconds, as a person writes it: `30`, `0.2`.
fn wait_for(lock: &str, wait: Duration) -> String {
    format!("SELECT GET_LOCK('{lock}', {}), RELEASE_LOCK('{lock}')", wait.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;
    use crate::lockfeed::MAX_FOLLOWED;
    use crate::store::Released;
    use parking_lot::Mutex;
    use std::thread;
    use std::time::Instant;

    #[test]
    fn a_lock_name_fits_and_is_the_same_in_every_process() {
        let a = lock_name("`leader_election`", "worker-1#abc");
        assert_eq!(a, lock_name("`leader_election`", "worker-1#abc"));
        assert_ne!(a, lock_name("`other`", "worker-1#abc"));
        assert_ne!(a, lock_name("`leader_election`", "worker-2#abc"));
        assert_eq!(a.len(), 36);
        // Pinned: processes of different builds must agree.
        assert_eq!(lock_name("", ""), "le:cbf29ce484222325:cbf29ce484222325");
    }

    #[test]
    fn the_waiters_statement_is_the_same_on_every_server() {
        // Whole seconds, as MySQL and MariaDB both take them.
        assert_eq!(wait_for("L", PACE.lock_wait), "SELECT GET_LOCK('L', 30), RELEASE_LOCK('L')");
        assert_eq!(wait_for("L", Duration::from_millis(200)), "SELECT GET_LOCK('L', 0.2), RELEASE_LOCK('L')");
    }

    fn lease(name: &str, holder: &str, ttl: Duration) -> Lease {
        Lease::granted(name, holder, 1, crate::lease::DbTime::from_unix_micros(1_000_000), ttl, b"")
    }

    const MINUTE: Duration = Duration::from_secs(60);

    /// What a subscriber hears when the leader of [`lease`]`("jobs", …)`
    /// lets go.
    fn jobs_released() -> Released {
        Released { name: "jobs".into(), fence: Some(1) }
    }

    /// A feed whose sessions can never connect (nothing listens on port 1).
    fn unreachable_feed(mode: cluster::Mode) -> Feed {
        let opts = Opts::from(OptsBuilder::new().ip_or_hostname(Some("127.0.0.1")).tcp_port(1).prefer_socket(false));
        paced("`unreachable`", &opts, Arc::new(mode), false, QUICK)
    }

    /// What the store tells the feed changes only what it should: an
    /// expired lease is neither led nor followed, nothing is followed
    /// before a subscription nor the caller's own lease, and 32 identities
    /// are followed at most. Needs no server.
    #[test]
    fn the_mysql_feed_records_only_live_leases_of_others_and_within_its_bounds() {
        let feed = unreachable_feed(cluster::Mode::fixed(false));
        feed.leads("me", &lease("jobs", "me", Duration::ZERO));
        feed.saw(None, &lease("jobs", "other", MINUTE));
        {
            let st = feed.shared.state.lock();
            assert!(st.led.is_empty() && !st.locking, "an expired lease is not led");
            assert!(st.followed.is_empty(), "nothing is followed before a subscription");
        }
        let _rx = feed.subscribe().expect("a subscription");
        feed.saw(None, &lease("jobs", "other", Duration::ZERO));
        feed.saw(Some("me"), &lease("jobs", "me", MINUTE));
        assert!(feed.shared.state.lock().followed.is_empty(), "an expired lease, or the caller's own");
        for i in 0..MAX_FOLLOWED + 3 {
            feed.saw(None, &lease(&format!("job-{i}"), &format!("leader-{i}"), MINUTE));
        }
        {
            let st = feed.shared.state.lock();
            assert_eq!(st.followed.len(), MAX_FOLLOWED);
            assert!(!st.followed.contains_key(&format!("leader-{MAX_FOLLOWED}")), "the 33rd is left to the poll");
        }
        // A name is followed under its latest holder only.
        feed.saw(None, &lease("job-0", "leader-1", MINUTE));
        let st = feed.shared.state.lock();
        let holders: Vec<&String> =
            st.followed.iter().filter(|(_, f)| f.names.contains_key("job-0")).map(|(who, _)| who).collect();
        assert_eq!(holders, ["leader-1"]);
    }

    /// What the feed holds locks for is what the store was told last: a
    /// name led by this store is no longer followed under its previous
    /// leader, and an identity leads until it left every name. Needs no
    /// server.
    #[test]
    fn what_the_mysql_feed_leads_is_what_it_was_told_last() {
        let feed = unreachable_feed(cluster::Mode::fixed(false));
        let _rx = feed.subscribe().expect("a subscription");
        let led = |feed: &Feed| -> Vec<String> {
            let st = feed.shared.state.lock();
            let mut names: Vec<String> = st.led.get("me").map(|n| n.keys().cloned().collect()).unwrap_or_default();
            names.sort();
            names
        };
        feed.saw(None, &lease("jobs", "other", MINUTE));
        feed.leads("me", &lease("jobs", "me", MINUTE));
        feed.leads("me", &lease("cron", "me", MINUTE));
        {
            let st = feed.shared.state.lock();
            assert!(st.followed.get("other").is_none_or(|f| f.names.is_empty()), "jobs is no longer other's");
            assert!(st.locking, "a lock thread");
        }
        assert_eq!(led(&feed), ["cron", "jobs"]);
        feed.left("someone", "jobs");
        assert_eq!(led(&feed), ["cron", "jobs"], "only the leader's own release counts");
        feed.left("me", "jobs");
        assert_eq!(led(&feed), ["cron"]);
        feed.left("me", "cron");
        assert!(feed.shared.state.lock().led.is_empty());
    }

    /// On a multi-primary cluster a lease led turns the feed off: no lock
    /// thread, the subscribers' channels close, no new subscription.
    #[test]
    fn a_mysql_feed_told_of_a_lease_on_a_multi_primary_cluster_turns_off() {
        let feed = unreachable_feed(cluster::Mode::default());
        let rx = feed.subscribe().expect("a subscription while the mode is unknown");
        feed.shared.locks.mode.learn(true);
        feed.leads("me", &lease("jobs", "me", MINUTE));
        let st = feed.shared.state.lock();
        assert!(st.off && !st.locking && st.led.is_empty(), "off, and nothing led");
        drop(st);
        assert_eq!(rx.try_recv(), Err(crossbeam_channel::TryRecvError::Disconnected), "the channel closed");
        assert!(feed.subscribe().is_none());
    }

    /// Waits short enough for a test.
    const QUICK: Pace = Pace {
        lock_wait: Duration::from_millis(200),
        look_again: Duration::from_millis(20),
        retake: Duration::from_millis(20),
        max_retake: Duration::from_millis(80),
        check_every: Duration::from_millis(100),
        first_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(80),
        forget: Duration::from_secs(600),
    };

    use crate::mysql::test_url as mysql_url;

    fn server_opts() -> Opts {
        let opts = Opts::from_url(&mysql_url()).expect("LE_MYSQL_URL is a MySQL URL");
        Opts::from(OptsBuilder::from_opts(opts).prefer_socket(false))
    }

    /// A session of the test's own: it holds locks as another leader would,
    /// and looks at them.
    struct Admin(Conn);

    impl Admin {
        fn new() -> Admin {
            Admin(Conn::new(server_opts()).expect("a session to LE_MYSQL_URL"))
        }

        fn id(&self) -> u64 {
            u64::from(self.0.connection_id())
        }

        fn take(&mut self, lock: &str) {
            let got: Option<i64> = self.0.query_first(format!("SELECT GET_LOCK('{lock}', 0)")).expect("GET_LOCK");
            assert_eq!(got, Some(1), "{lock} taken by the test");
        }

        fn give_back(&mut self, lock: &str) {
            self.0.query_drop(format!("DO RELEASE_LOCK('{lock}')")).expect("RELEASE_LOCK");
        }

        /// Whether session `id` is waiting in a `GET_LOCK`.
        fn waiting(&mut self, id: u32) -> bool {
            let sql = format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id} AND INFO LIKE 'SELECT GET_LOCK%'"
            );
            self.0.query_first::<u64, _>(sql).expect("PROCESSLIST") == Some(1)
        }

        /// The session that holds `lock`, if any.
        fn holder(&mut self, lock: &str) -> Option<u64> {
            let h: Option<Option<u64>> =
                self.0.query_first(format!("SELECT IS_USED_LOCK('{lock}')")).expect("IS_USED_LOCK");
            h.flatten()
        }
    }

    /// Polls `ok` until it holds, failing the test after 5 s.
    fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ok() {
            assert!(Instant::now() < deadline, "not within 5 s: {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// A TCP gate before the server: closed, it takes each connection and
    /// drops it at once (the client's handshake fails); open, it forwards.
    /// It records when it refused each connection, and what each forwarded
    /// connection sent.
    struct Gate {
        port: u16,
        open: Arc<std::sync::atomic::AtomicBool>,
        refused: Arc<Mutex<Vec<Instant>>>,
        sent: Arc<Mutex<Vec<Sent>>>,
    }

    /// What one forwarded connection sent.
    type Sent = Arc<Mutex<Vec<u8>>>;

    /// A client's side of the gate, which keeps a copy of what it read.
    struct Logged(Sent, std::net::TcpStream);

    impl std::io::Read for Logged {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.read(buf)?;
            self.0.lock().extend_from_slice(&buf[..n]);
            Ok(n)
        }
    }

    impl Gate {
        fn start(open: bool) -> Gate {
            use std::sync::atomic::{AtomicBool, Ordering};
            let opts = server_opts();
            let target = (opts.get_ip_or_hostname().into_owned(), opts.get_tcp_port());
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = l.local_addr().expect("addr").port();
            let gate =
                Gate { port, open: Arc::new(AtomicBool::new(open)), refused: Arc::default(), sent: Arc::default() };
            let (open, refused, sent) = (Arc::clone(&gate.open), Arc::clone(&gate.refused), Arc::clone(&gate.sent));
            thread::spawn(move || {
                for client in l.incoming().flatten() {
                    if !open.load(Ordering::SeqCst) {
                        refused.lock().push(Instant::now());
                        continue;
                    }
                    let Ok(server) = std::net::TcpStream::connect((target.0.as_str(), target.1)) else { continue };
                    let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else { continue };
                    let log = Arc::new(Mutex::new(Vec::new()));
                    sent.lock().push(Arc::clone(&log));
                    let (mut from_client, mut server) = (Logged(log, client), server);
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut from_client, &mut s2);
                        let _ = s2.shutdown(std::net::Shutdown::Both);
                    });
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut server, &mut c2);
                        let _ = c2.shutdown(std::net::Shutdown::Both);
                    });
                }
            });
            gate
        }

        fn open(&self) {
            self.open.store(true, std::sync::atomic::Ordering::SeqCst);
        }

        /// The connections refused so far.
        fn refused(&self) -> Vec<Instant> {
            self.refused.lock().clone()
        }

        /// The connections forwarded so far.
        fn sessions(&self) -> usize {
            self.sent.lock().len()
        }

        /// How many times the forwarded connections sent `text`.
        fn sent(&self, text: &str) -> usize {
            let text = text.as_bytes();
            self.sent.lock().iter().map(|log| log.lock().windows(text.len()).filter(|w| *w == text).count()).sum()
        }

        /// A feed whose sessions come through this gate, with its own lock
        /// names (the table's name is the gate's port).
        /// A feed through the gate on a single-primary server, the lock of
        /// the identity `leader` in it, and a session of the test's own.
        fn leader_feed(&self, pace: Pace) -> (Feed, String, Admin) {
            let feed = self.feed(cluster::Mode::fixed(false), pace);
            let lock = lock_name(&feed.shared.locks.quoted, "leader");
            (feed, lock, Admin::new())
        }

        fn feed(&self, mode: cluster::Mode, pace: Pace) -> Feed {
            self.feed_waking_on_free(mode, pace, false)
        }

        fn feed_waking_on_free(&self, mode: cluster::Mode, pace: Pace, wakes_on_free: bool) -> Feed {
            let via = OptsBuilder::from_opts(server_opts()).ip_or_hostname(Some("127.0.0.1")).tcp_port(self.port);
            paced(&format!("`feed_test_{}`", self.port), &Opts::from(via), Arc::new(mode), wakes_on_free, pace)
        }
    }

    /// The pauses between the gate's refusals: at least the lock and waiter
    /// threads' backoff (20, 40, 80, 80 ms with `QUICK`).
    fn assert_backed_off(refused: &[Instant]) {
        let gaps: Vec<Duration> = refused.windows(2).map(|w| w[1] - w[0]).collect();
        for (gap, ms) in gaps.iter().zip([20, 40, 80, 80]) {
            assert!(*gap >= Duration::from_millis(ms) - Duration::from_millis(2), "{gaps:?}");
        }
    }

    /// The lock session cannot connect: it tries again after a pause that
    /// doubles, never giving up, and once the server can be reached it
    /// asks whether the server is a multi-primary cluster's and takes the
    /// lock.
    #[test]
    fn a_mysql_lock_session_that_cannot_connect_backs_off_then_takes_the_lock() {
        let gate = Gate::start(false);
        let feed = gate.feed(cluster::Mode::default(), QUICK);
        let lock = lock_name(&feed.shared.locks.quoted, "leader");
        let mut admin = Admin::new();
        feed.leads("leader", &lease("jobs", "leader", MINUTE));
        eventually("five failed connects", || gate.refused().len() >= 5);
        assert_backed_off(&gate.refused());
        assert_eq!(admin.holder(&lock), None);
        gate.open();
        eventually("the lock taken", || admin.holder(&lock).is_some());
        assert_eq!(feed.shared.locks.mode.known(), Some(false), "the lock session asked the server");
    }

    /// What the waiter tests start from: a feed through `gate` following
    /// the identity `leader`, whose lock `admin` holds, with a subscriber.
    struct Following {
        feed: Feed,
        lock: String,
        admin: Admin,
        rx: crossbeam_channel::Receiver<Released>,
    }

    impl Following {
        fn start(gate: &Gate, pace: Pace) -> Following {
            let (feed, lock, mut admin) = gate.leader_feed(pace);
            admin.take(&lock);
            let rx = feed.subscribe().expect("a subscription");
            feed.saw(None, &lease("jobs", "leader", MINUTE));
            Following { feed, lock, admin, rx }
        }

        /// The leader gives its lock back: the subscriber hears of `jobs`.
        fn release_wakes(mut self) {
            self.admin.give_back(&self.lock);
            // With the fence this store saw the leader hold.
            assert_eq!(self.rx.recv_timeout(Duration::from_secs(5)), Ok(jobs_released()));
        }
    }

    /// A waiter that cannot connect backs off the same way, and once it
    /// can, it waits for the lock and wakes the subscriber at its release.
    #[test]
    fn a_mysql_waiter_that_cannot_connect_backs_off_then_wakes_at_the_release() {
        let gate = Gate::start(false);
        let f = Following::start(&gate, QUICK);
        eventually("five failed connects", || gate.refused().len() >= 5);
        assert_backed_off(&gate.refused());
        gate.open();
        eventually("the waiter waiting", || gate.sent("GET_LOCK(") >= 1);
        f.release_wakes();
    }

    /// A waiter's `GET_LOCK` that times out while the leader still holds
    /// the lock wakes nobody, and waits again on the same session; the
    /// release then wakes the subscriber.
    #[test]
    fn a_mysql_waiter_whose_wait_times_out_under_a_live_leader_waits_again() {
        let gate = Gate::start(true);
        let mut f = Following::start(&gate, QUICK);
        // Two waits of 200 ms ran out; the third is under way.
        eventually("a third wait", || gate.sent("GET_LOCK(") >= 3);
        assert!(f.rx.is_empty(), "woken while the leader held its lock: {:?}", f.rx.try_recv());
        assert_eq!(gate.sessions(), 1, "the waiter waits again on its session");
        // One statement per wait: a wait that ran out under a live leader
        // waits again without asking first whether the lock is held.
        assert_eq!(gate.sent("IS_USED_LOCK("), 1, "asked again after a wait ran out");
        assert_eq!(f.admin.holder(&f.lock), Some(f.admin.id()));
        f.release_wakes();
    }

    /// A lock another session holds (a process with the same identity, a
    /// waiter's moment) is asked for again, with a pause, until it is free.
    #[test]
    fn a_mysql_lock_held_elsewhere_is_asked_for_again_until_it_is_free() {
        let gate = Gate::start(true);
        let (feed, lock, mut admin) = gate.leader_feed(QUICK);
        admin.take(&lock);
        feed.leads("leader", &lease("jobs", "leader", MINUTE));
        eventually("asked three times", || gate.sent("GET_LOCK(") >= 3);
        assert_eq!(admin.holder(&lock), Some(admin.id()));
        admin.give_back(&lock);
        eventually("the lock taken by the feed", || admin.holder(&lock).is_some_and(|h| h != admin.id()));
        assert_eq!(gate.sessions(), 1);
    }

    /// The lock session killed by the server: the next check finds it
    /// gone, and a new session takes the lock again.
    #[test]
    fn a_mysql_lock_session_killed_is_replaced_and_the_lock_taken_again() {
        let gate = Gate::start(true);
        let (feed, lock, mut admin) = gate.leader_feed(QUICK);
        feed.leads("leader", &lease("jobs", "leader", MINUTE));
        let mut first = None;
        eventually("the lock taken", || {
            first = admin.holder(&lock);
            first.is_some()
        });
        let first = first.unwrap_or_default();
        admin.0.query_drop(format!("KILL CONNECTION {first}")).expect("KILL");
        eventually("the lock taken again", || admin.holder(&lock).is_some_and(|h| h != first));
        assert_eq!(gate.sessions(), 2);
    }

    /// An identity not seen leading for `forget` is no longer followed: its
    /// waiter ends and its session goes; seen again, it gets a new one.
    #[test]
    fn a_mysql_waiter_forgets_a_leader_not_seen_for_a_while() {
        let gate = Gate::start(true);
        let forget = Duration::from_millis(300);
        let feed = gate.feed(cluster::Mode::fixed(false), Pace { forget, ..QUICK });
        let _rx = feed.subscribe().expect("a subscription");
        let seen = Instant::now();
        feed.saw(None, &lease("jobs", "leader", MINUTE));
        // No one holds the lock: the waiter looks at it every 20 ms.
        eventually("the waiter's session", || feed.shared.state.lock().sessions.len() == 1);
        eventually("the leader forgotten", || {
            let st = feed.shared.state.lock();
            st.followed.is_empty() && st.sessions.is_empty()
        });
        assert!(seen.elapsed() >= forget, "forgotten after {:?}", seen.elapsed());
        feed.saw(None, &lease("jobs", "leader", MINUTE));
        eventually("a new waiter's session", || feed.shared.state.lock().sessions.len() == 1);
        assert_eq!(gate.sessions(), 2);
    }

    /// An identity that leads nothing any more has its lock given back at
    /// once (not left to the session's end), and the lock session closes:
    /// a new lead takes the lock on a new session.
    #[test]
    fn a_mysql_lock_is_given_back_when_its_identity_leads_nothing() {
        let gate = Gate::start(true);
        let (feed, lock, mut admin) = gate.leader_feed(QUICK);
        feed.leads("leader", &lease("jobs", "leader", MINUTE));
        feed.leads("leader", &lease("cron", "leader", MINUTE));
        eventually("the lock taken", || admin.holder(&lock).is_some());
        feed.left("leader", "jobs");
        feed.left("leader", "cron");
        eventually("the lock given back", || admin.holder(&lock).is_none());
        assert_eq!(gate.sent("RELEASE_LOCK("), 1, "released by a statement");
        feed.leads("leader", &lease("jobs", "leader", MINUTE));
        eventually("the lock taken again", || admin.holder(&lock).is_some());
        assert_eq!(gate.sessions(), 2, "on a new session");
    }

    /// A waiter's `GET_LOCK` killed by the server (`KILL QUERY`: it answers
    /// NULL) wakes nobody; the session is dropped, and a new one waits and
    /// wakes the subscriber at the release.
    #[test]
    fn a_mysql_waiter_whose_wait_is_killed_waits_again_on_a_new_session() {
        let gate = Gate::start(true);
        let mut f = Following::start(&gate, Pace { lock_wait: Duration::from_secs(5), ..QUICK });
        let sessions = |f: &Following| f.feed.shared.state.lock().sessions.clone();
        let mut first = 0;
        eventually("the waiter waiting", || {
            first = sessions(&f).first().copied().unwrap_or_default();
            first != 0 && f.admin.waiting(first)
        });
        f.admin.0.query_drop(format!("KILL QUERY {first}")).expect("KILL QUERY");
        eventually("a new waiter's session, the first forgotten", || sessions(&f).iter().all(|s| *s != first));
        eventually("the new session waiting", || sessions(&f).len() == 1 && f.admin.waiting(sessions(&f)[0]));
        assert!(f.rx.is_empty(), "woken by a killed wait: {:?}", f.rx.try_recv());
        assert_eq!(gate.sessions(), 2);
        f.release_wakes();
    }

    /// A free lock (a leader without a lock session) wakes nobody: the
    /// waiter only looks at it, and never waits on it. The control that
    /// waits on a free lock wakes its subscriber, so the test can fail.
    #[test]
    fn a_mysql_waiter_never_wakes_on_a_lock_that_was_never_held() {
        for control in [false, true] {
            let gate = Gate::start(true);
            let feed = gate.feed_waking_on_free(cluster::Mode::fixed(false), QUICK, control);
            let rx = feed.subscribe().expect("a subscription");
            feed.saw(None, &lease("jobs", "leader", MINUTE));
            if control {
                assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(jobs_released()), "the control woke");
                continue;
            }
            eventually("three looks at the lock", || gate.sent("IS_USED_LOCK(") >= 3);
            assert!(rx.is_empty(), "woken by a free lock: {:?}", rx.try_recv());
            assert_eq!(gate.sent("GET_LOCK("), 0, "waited on a free lock");
        }
    }
}
