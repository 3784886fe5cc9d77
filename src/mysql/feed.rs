//! The feed of releases ([`Store::releases`](crate::Store::releases)) on
//! MySQL and MariaDB, which have no `LISTEN`: named locks instead.
//!
//! **Leader side.** The store knows from its own answers which elections it
//! leads under which identity (a claim or a renewal that succeeded: leads
//! until the lease's expiry; a release that succeeded, or a renewal told
//! the lease is lost: no more). While it leads one or more under identity
//! `I`, a thread of its own holds `GET_LOCK(L(I), 0)` on a session of its
//! own; when it leads none any more, it runs `RELEASE_LOCK(L(I))`, after
//! the release's statement has committed (the store call has returned). A
//! store call only updates a map under a mutex and wakes that thread: it
//! never waits for the lock session.
//!
//! **Follower side.** Once subscribed, the store records the live leases of
//! other identities its answers show (claims, reads), and keeps one waiter
//! session per such identity `J`, looping: `IS_USED_LOCK(L(J))`; NULL (no
//! one holds it: a leader without a feed, a broken lock session, another
//! node of a multi-primary cluster) → look again in a second, never wake;
//! held → `GET_LOCK(L(J), 30), RELEASE_LOCK(L(J))` in one statement, and
//! when it got the lock, every name recorded for `J` goes to the
//! subscribers. So a wake needs the lock to go from held to free: a live
//! leader wakes nobody, a release wakes each follower once, and a leader's
//! lock session that breaks (or a crashed leader's) wakes each follower
//! once too, then the waiter sees the lock free and does not wake again.
//!
//! Bounded: 32 followed identities (one session each), 1,024 names each,
//! the subscribers' channels of `crate::feed`. Any error on a feed session
//! drops it and tries again later, with a growing pause; the store's calls
//! never see it. On a multi-primary cluster named locks do not cross
//! nodes, so the feed is off there: no locks, no waiters, and the
//! subscribers' channels end (their drivers poll).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder};
use parking_lot::{Condvar, Mutex, MutexGuard};

use super::cluster;
use crate::feed::{fnv1a64, Subscribers};
use crate::lease::Lease;
use crate::store::Released;

/// The feed's waits. Always [`PACE`] but in tests, which shorten them.
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// How long a waiter's `GET_LOCK` waits: one statement per this long
    /// while the leader lives. Whole seconds but in tests (MariaDB takes a
    /// fraction of a second too).
    lock_wait: Duration,
    /// A waiter that found the lock free, or just woke, looks again after
    /// this.
    look_again: Duration,
    /// A lock someone else holds for a moment (a waiter's `GET_LOCK`, or a
    /// process with the same identity) is asked for again after `retake`,
    /// doubling up to `max_retake`.
    retake: Duration,
    max_retake: Duration,
    /// How often the lock session is checked while it holds locks, so a
    /// broken one is replaced.
    check_every: Duration,
    /// After a failed session, connecting again waits `first_backoff` at
    /// first, doubling up to `max_backoff`.
    first_backoff: Duration,
    max_backoff: Duration,
    /// A followed name not seen again for this long is forgotten.
    forget: Duration,
}

const PACE: Pace = Pace {
    lock_wait: Duration::from_secs(30),
    look_again: Duration::from_secs(1),
    retake: Duration::from_millis(50),
    max_retake: Duration::from_secs(5),
    check_every: Duration::from_secs(2),
    first_backoff: Duration::from_millis(500),
    max_backoff: Duration::from_secs(30),
    forget: Duration::from_secs(600),
};

/// Leader identities followed (one waiter session each); more are left to
/// the poll.
const MAX_FOLLOWED: usize = 32;
/// Names recorded per followed identity.
const MAX_NAMES: usize = 1024;
/// Names recorded as led per identity.
const MAX_LED: usize = 65_536;

/// The named lock of `identity`'s leadership in the table `quoted` (36
/// characters; MySQL's limit is 64), the same in every process.
pub(super) fn lock_name(quoted: &str, identity: &str) -> String {
    format!("le:{:016x}:{:016x}", fnv1a64(quoted), fnv1a64(identity))
}

/// What the store keeps; its clones share it. Dropping the last one ends
/// the feed: the subscribers' channels close, the threads stop and their
/// sessions are closed (waiters blocked in `GET_LOCK` are killed).
pub(super) struct Feed {
    shared: Arc<Shared>,
}

struct Shared {
    quoted: String,
    /// What the feed's sessions connect with: the pool's options, with a
    /// read timeout that outlasts a waiter's `GET_LOCK`.
    opts: Opts,
    mode: Arc<cluster::Mode>,
    state: Mutex<State>,
    changed: Condvar,
    subscribers: Subscribers,
    /// The negative control of the storm rule: wake whenever the lock is
    /// free, without first seeing it held.
    wakes_on_free: bool,
    pace: Pace,
}

#[derive(Default)]
struct State {
    /// The store is gone: every thread stops.
    ended: bool,
    /// The feed is off (a multi-primary cluster): no locks, no waiters.
    off: bool,
    /// Someone subscribed: followed identities get waiters.
    subscribed: bool,
    /// Identity → name → until when it leads it (the lease's expiry on the
    /// local clock, as far as the answer said).
    led: HashMap<String, HashMap<String, Instant>>,
    /// The lock thread runs.
    locking: bool,
    /// Leader identity → what this store saw it lead.
    followed: HashMap<String, Followed>,
    /// The waiters' sessions, killed when the store goes.
    sessions: Vec<u32>,
}

#[derive(Default)]
struct Followed {
    /// Name → when last seen led by this identity, and under which fence.
    names: HashMap<String, (Instant, u64)>,
    waiting: bool,
}

impl Feed {
    pub(super) fn new(quoted: &str, opts: &Opts, mode: Arc<cluster::Mode>, wakes_on_free: bool) -> Feed {
        Feed::paced(quoted, opts, mode, wakes_on_free, PACE)
    }

    fn paced(quoted: &str, opts: &Opts, mode: Arc<cluster::Mode>, wakes_on_free: bool, pace: Pace) -> Feed {
        let socket = opts.get_read_timeout().copied().unwrap_or(super::DEFAULT_SOCKET_TIMEOUT);
        let opts = Opts::from(OptsBuilder::from_opts(opts.clone()).read_timeout(Some(socket + pace.lock_wait)));
        Feed {
            shared: Arc::new(Shared {
                quoted: quoted.to_owned(),
                opts,
                mode,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                subscribers: Subscribers::default(),
                wakes_on_free,
                pace,
            }),
        }
    }

    /// A new subscription; `None` once the feed is off or gone.
    pub(super) fn subscribe(&self) -> Option<crossbeam_channel::Receiver<Released>> {
        if self.shared.mode.known() == Some(true) {
            self.shared.turn_off();
        }
        let mut st = self.shared.state.lock();
        if st.ended || st.off {
            return None;
        }
        st.subscribed = true;
        Some(self.shared.subscribers.subscribe())
    }

    /// `identity` holds `lease` (a claim or renewal that succeeded).
    pub(super) fn leads(&self, identity: &str, lease: &Lease) {
        if lease.expired() {
            return;
        }
        if self.shared.mode.known() == Some(true) {
            return self.shared.turn_off();
        }
        let now = Instant::now();
        let until = now.checked_add(lease.ttl()).unwrap_or(now + self.shared.pace.forget);
        let mut st = self.shared.state.lock();
        if st.off || st.ended {
            return;
        }
        // Led by `identity` now, not by whoever led it before (but still
        // followed under `identity` itself: the store's own followers wait
        // for this lock too).
        for (who, f) in &mut st.followed {
            if who != identity {
                f.names.remove(&lease.name);
            }
        }
        let names = st.led.entry(identity.to_owned()).or_default();
        let new = names.is_empty();
        if names.len() < MAX_LED || names.contains_key(&lease.name) {
            names.insert(lease.name.clone(), until);
        }
        if new {
            self.shared.changed.notify_all();
        }
        if !st.locking {
            st.locking = spawn("leaderelection-mysql-lock", &self.shared, locker);
        }
    }

    /// `identity` no longer leads `name` (its release committed, or a
    /// renewal found the lease lost).
    pub(super) fn left(&self, identity: &str, name: &str) {
        let mut st = self.shared.state.lock();
        if let Some(names) = st.led.get_mut(identity) {
            names.remove(name);
            if names.is_empty() {
                st.led.remove(identity);
                self.shared.changed.notify_all();
            }
        }
    }

    /// An answer showed `lease`; `caller` is the identity that asked, if
    /// any (a claim). A live lease of another identity is followed.
    pub(super) fn saw(&self, caller: Option<&str>, lease: &Lease) {
        if lease.expired() || caller == Some(lease.holder.as_str()) {
            return;
        }
        let mut st = self.shared.state.lock();
        if !st.subscribed || st.off || st.ended {
            return;
        }
        let holder = lease.holder.as_str();
        for (who, f) in &mut st.followed {
            if who != holder {
                f.names.remove(&lease.name);
            }
        }
        if !st.followed.contains_key(holder) && st.followed.len() >= MAX_FOLLOWED {
            return;
        }
        let f = st.followed.entry(holder.to_owned()).or_default();
        if f.names.len() < MAX_NAMES || f.names.contains_key(&lease.name) {
            f.names.insert(lease.name.clone(), (Instant::now(), lease.fence));
        }
        if !f.waiting {
            let holder = holder.to_owned();
            let started = spawn("leaderelection-mysql-wait", &self.shared, move |s| waiter(s, &holder));
            if let Some(f) = st.followed.get_mut(lease.holder.as_str()) {
                f.waiting = started;
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let sessions = {
            let mut st = self.shared.state.lock();
            st.ended = true;
            std::mem::take(&mut st.sessions)
        };
        self.shared.changed.notify_all();
        self.shared.subscribers.clear();
        if sessions.is_empty() {
            return;
        }
        // Waiters may be blocked in a 30 s `GET_LOCK`: end their sessions
        // from a connection of its own, off the dropping thread.
        let opts = self.shared.opts.clone();
        let _ = thread::Builder::new().name("leaderelection-mysql-feed-stop".into()).spawn(move || {
            if let Ok(mut conn) = Conn::new(opts) {
                for id in sessions {
                    let _ = conn.query_drop(format!("KILL CONNECTION {id}"));
                }
            }
        });
    }
}

/// Starts `run` on a thread of its own; whether it started.
fn spawn(name: &str, shared: &Arc<Shared>, run: impl FnOnce(&Shared) + Send + 'static) -> bool {
    let shared = Arc::clone(shared);
    let started = thread::Builder::new().name(name.into()).spawn(move || run(&shared));
    if let Err(e) = &started {
        log::warn!("leaderelection: cannot start the mysql release feed's thread ({e}); followers poll");
    }
    started.is_ok()
}

impl Shared {
    /// The feed is off for good (a multi-primary cluster): the threads
    /// stop, the subscribers' channels close.
    fn turn_off(&self) {
        let was = std::mem::replace(&mut self.state.lock().off, true);
        if !was {
            log::info!(
                "leaderelection: mysql: named locks do not cross the nodes of a multi-primary cluster; no feed of \
                 releases, followers learn of releases by polling"
            );
        }
        self.changed.notify_all();
        self.subscribers.clear();
    }

    /// A new session, once the store is known not to be a multi-primary
    /// cluster's (asked on this session when not known yet).
    fn connect(&self) -> Result<Conn, mysql::Error> {
        let mut conn = Conn::new(self.opts.clone())?;
        if self.mode.known().is_none() {
            let rows = super::conn::query(&mut conn, cluster::DETECT)?;
            self.mode.learn(cluster::multi_primary(&rows));
        }
        if self.mode.known() == Some(true) {
            self.turn_off();
            return Err(mysql::DriverError::Timeout.into());
        }
        Ok(conn)
    }

    /// Waits on the state until `until` or a change, unless the threads
    /// must stop.
    fn pause(&self, st: &mut MutexGuard<'_, State>, until: Instant) {
        if !st.ended && !st.off {
            self.changed.wait_until(st, until);
        }
    }
}

/// A pause that doubles with each failure in a row, from `first` up to
/// `max`, and starts over after a success.
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first }
    }

    /// When to try again after a failure now; the next pause doubles.
    fn after_failure(&mut self) -> Instant {
        let at = Instant::now() + self.next;
        self.next = (self.next * 2).min(self.max);
        at
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}

/// The leader side's thread: holds the lock of every identity the store
/// leads, on one session, and releases the lock of each identity that
/// leads nothing any more.
fn locker(shared: &Shared) {
    let mut session: Option<Conn> = None;
    let mut held: BTreeSet<String> = BTreeSet::new();
    let pace = shared.pace;
    let mut backoff = Backoff::new(pace.first_backoff, pace.max_backoff);
    let mut retake = Backoff::new(pace.retake, pace.max_retake);
    // When to try again (a connect, or a lock someone else held).
    let mut again: Option<Instant> = None;
    let mut checked = Instant::now();
    loop {
        let wanted: BTreeSet<String> = {
            let mut st = shared.state.lock();
            loop {
                if st.ended || st.off {
                    st.locking = false;
                    return; // dropping the session frees its locks
                }
                let now = Instant::now();
                st.led.retain(|_, names| {
                    names.retain(|_, until| *until > now);
                    !names.is_empty()
                });
                let wanted: BTreeSet<String> = st.led.keys().cloned().collect();
                let check = session.as_ref().map(|_| checked + pace.check_every);
                let due = again.is_some_and(|t| t <= now) || check.is_some_and(|t| t <= now);
                // A lock to give back never waits for a retry of another.
                let release = held.iter().any(|i| !wanted.contains(i));
                if due || release || (wanted != held && again.is_none()) {
                    break wanted;
                }
                let expiry = st.led.values().flat_map(|n| n.values()).min().copied();
                let wake = [again, check, expiry].into_iter().flatten().min();
                match wake {
                    Some(t) => {
                        shared.changed.wait_until(&mut st, t);
                    }
                    None => shared.changed.wait(&mut st),
                }
            }
        };
        again = None;
        if wanted.is_empty() && session.is_none() {
            continue;
        }
        if session.is_none() {
            match shared.connect() {
                Ok(c) => session = Some(c),
                Err(e) => {
                    log::debug!("leaderelection: mysql release feed: lock session: {e}; trying again");
                    again = Some(backoff.after_failure());
                    continue;
                }
            }
        }
        let Some(conn) = session.as_mut() else { continue };
        checked = Instant::now();
        match lock_step(conn, &shared.quoted, &wanted, &mut held) {
            Ok(true) => {
                backoff.reset();
                retake.reset();
                if wanted.is_empty() {
                    // Leads nothing: its locks given back, the session goes.
                    session = None;
                }
            }
            Ok(false) => {
                // Someone held a lock for a moment: ask again soon.
                again = Some(retake.after_failure());
            }
            Err(e) => {
                log::debug!("leaderelection: mysql release feed: lock session: {e}; connecting again");
                session = None;
                held.clear();
                again = Some(backoff.after_failure());
            }
        }
    }
}

/// Releases the locks no longer wanted, takes the ones wanted, or checks
/// the session; `Ok(false)` when a lock was held by someone else.
fn lock_step(
    conn: &mut Conn, quoted: &str, wanted: &BTreeSet<String>, held: &mut BTreeSet<String>,
) -> Result<bool, mysql::Error> {
    let stale: Vec<String> = held.difference(wanted).cloned().collect();
    let stale_or_missing = stale.len() + wanted.difference(held).count();
    for identity in stale {
        conn.query_drop(format!("DO RELEASE_LOCK('{}')", lock_name(quoted, &identity)))?;
        held.remove(&identity);
    }
    let mut all = true;
    let missing: Vec<String> = wanted.difference(held).cloned().collect();
    for identity in missing {
        let got: Option<Option<i64>> =
            conn.query_first(format!("SELECT GET_LOCK('{}', 0)", lock_name(quoted, &identity)))?;
        match got.flatten() {
            Some(1) => {
                held.insert(identity);
            }
            Some(_) => all = false,
            None => return Err(mysql::DriverError::Timeout.into()),
        }
    }
    if stale_or_missing == 0 {
        // Nothing to do but check that the session (and its locks) lives.
        conn.ping()?;
    }
    Ok(all)
}

/// A waiter for the releases of `identity`, until it is no longer followed
/// (nothing seen led by it for a while) or the feed ends.
fn waiter(shared: &Shared, identity: &str) {
    let lock = lock_name(&shared.quoted, identity);
    let mut session: Option<(Conn, u32)> = None;
    let pace = shared.pace;
    let mut backoff = Backoff::new(pace.first_backoff, pace.max_backoff);
    let mut until: Option<Instant> = None;
    let forget = |st: &mut State, id: Option<u32>| {
        st.sessions.retain(|s| Some(*s) != id);
    };
    loop {
        {
            let mut st = shared.state.lock();
            loop {
                let now = Instant::now();
                let gone = st.ended || st.off || {
                    let f = st.followed.get_mut(identity);
                    f.is_none_or(|f| {
                        f.names.retain(|_, (seen, _)| now.saturating_duration_since(*seen) < pace.forget);
                        f.names.is_empty()
                    })
                };
                if gone {
                    st.followed.remove(identity);
                    forget(&mut st, session.as_ref().map(|s| s.1));
                    return;
                }
                match until {
                    Some(t) if t > now => shared.pause(&mut st, t),
                    _ => break,
                }
            }
        }
        until = None;
        if session.is_none() {
            match shared.connect() {
                Ok(c) => {
                    let id = c.connection_id();
                    let mut st = shared.state.lock();
                    if st.ended {
                        return;
                    }
                    st.sessions.push(id);
                    session = Some((c, id));
                }
                Err(e) => {
                    log::debug!("leaderelection: mysql release feed: waiter session: {e}; trying again");
                    until = Some(backoff.after_failure());
                    continue;
                }
            }
        }
        let Some((conn, id)) = session.as_mut() else { continue };
        match wait_step(conn, &lock, pace.lock_wait, shared.wakes_on_free) {
            Ok(Waited::Free) => until = Some(Instant::now() + pace.look_again),
            Ok(Waited::Held) => backoff.reset(),
            Ok(Waited::Released) => {
                backoff.reset();
                let names: Vec<(String, u64)> = {
                    let st = shared.state.lock();
                    let f = st.followed.get(identity);
                    f.map(|f| f.names.iter().map(|(n, (_, fence))| (n.clone(), *fence)).collect()).unwrap_or_default()
                };
                for (name, fence) in &names {
                    shared.subscribers.send(name, Some(*fence));
                }
                until = Some(Instant::now() + pace.look_again);
            }
            Err(e) => {
                log::debug!("leaderelection: mysql release feed: waiter session: {e}; connecting again");
                let id = *id;
                forget(&mut shared.state.lock(), Some(id));
                session = None;
                until = Some(backoff.after_failure());
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

/// What one look at a leader's lock found.
enum Waited {
    /// Nobody holds it: nothing to wait for.
    Free,
    /// Held all along the wait.
    Held,
    /// Held, then free: the leader released it.
    Released,
}

fn wait_step(conn: &mut Conn, lock: &str, lock_wait: Duration, wakes_on_free: bool) -> Result<Waited, mysql::Error> {
    if !wakes_on_free {
        let holder: Option<Option<u64>> = conn.query_first(format!("SELECT IS_USED_LOCK('{lock}')"))?;
        if holder.flatten().is_none() {
            return Ok(Waited::Free);
        }
    }
    let got: Option<(Option<i64>, Option<i64>)> = conn.query_first(wait_for(lock, lock_wait))?;
    match got.and_then(|g| g.0) {
        Some(1) => Ok(Waited::Released),
        Some(_) => Ok(Waited::Held),
        None => Err(mysql::DriverError::Timeout.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_doubles_up_to_its_bound_and_starts_over_after_a_success() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(3));
        let waits: Vec<Duration> = (0..5)
            .map(|_| {
                let before = Instant::now();
                b.after_failure().saturating_duration_since(before)
            })
            .collect();
        // Each wait is its pause plus the moment between the two clock reads.
        for (w, ms) in waits.iter().zip([500, 1000, 2000, 3000, 3000]) {
            let pause = Duration::from_millis(ms);
            assert!(*w >= pause && *w < pause + Duration::from_millis(100), "{waits:?}");
        }
        b.reset();
        assert!(b.after_failure().saturating_duration_since(Instant::now()) <= Duration::from_millis(500));
    }

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
        Feed::paced("`unreachable`", &opts, Arc::new(mode), false, QUICK)
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
        feed.shared.mode.learn(true);
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

    fn mysql_url() -> String {
        std::env::var("LE_MYSQL_URL").expect(
            "LE_MYSQL_URL is not set. These tests need a MySQL or MariaDB server: run `bash scripts/test.sh` (or \
             `source scripts/mysql.sh` first), which starts it and exports LE_MYSQL_URL.",
        )
    }

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
            let lock = lock_name(&feed.shared.quoted, "leader");
            (feed, lock, Admin::new())
        }

        fn feed(&self, mode: cluster::Mode, pace: Pace) -> Feed {
            self.feed_waking_on_free(mode, pace, false)
        }

        fn feed_waking_on_free(&self, mode: cluster::Mode, pace: Pace, wakes_on_free: bool) -> Feed {
            let via = OptsBuilder::from_opts(server_opts()).ip_or_hostname(Some("127.0.0.1")).tcp_port(self.port);
            Feed::paced(&format!("`feed_test_{}`", self.port), &Opts::from(via), Arc::new(mode), wakes_on_free, pace)
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
        let lock = lock_name(&feed.shared.quoted, "leader");
        let mut admin = Admin::new();
        feed.leads("leader", &lease("jobs", "leader", MINUTE));
        eventually("five failed connects", || gate.refused().len() >= 5);
        assert_backed_off(&gate.refused());
        assert_eq!(admin.holder(&lock), None);
        gate.open();
        eventually("the lock taken", || admin.holder(&lock).is_some());
        assert_eq!(feed.shared.mode.known(), Some(false), "the lock session asked the server");
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
