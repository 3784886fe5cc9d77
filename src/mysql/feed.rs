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
    /// Name → when last seen led by this identity.
    names: HashMap<String, Instant>,
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
    pub(super) fn subscribe(&self) -> Option<crossbeam_channel::Receiver<String>> {
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
            f.names.insert(lease.name.clone(), Instant::now());
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
                        f.names.retain(|_, seen| now.saturating_duration_since(*seen) < pace.forget);
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
                let names: Vec<String> = {
                    let st = shared.state.lock();
                    st.followed.get(identity).map(|f| f.names.keys().cloned().collect()).unwrap_or_default()
                };
                for name in &names {
                    shared.subscribers.send(name);
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
}
