//! The feed of releases ([`Store::releases`](crate::Store::releases)) on a
//! server's locks, written once for both servers: MySQL's and MariaDB's
//! named locks (`GET_LOCK`), PostgreSQL's session advisory locks
//! (`pg_advisory_lock`). Each server says how its statements read through
//! [`Locks`]; everything else is here.
//!
//! **Leader side.** The store knows from its own answers which elections it
//! leads under which identity (a claim or a renewal that succeeded: leads
//! until the lease's expiry; a release that succeeded, or a renewal told
//! the lease is lost: no more). While it leads one or more under identity
//! `I`, a thread of its own holds the lock `L(I)` on a session of its own;
//! when it leads none any more, it gives `L(I)` back, after the release's
//! statement has committed (the store call has returned). A store call
//! only updates a map under a mutex and wakes that thread: it never waits
//! for the lock session.
//!
//! **Follower side.** Once subscribed, the store records the live leases of
//! other identities its answers show (claims, reads), and keeps one waiter
//! session per such identity `J`, looping: is `L(J)` held? No (a leader
//! without a feed, a broken lock session, another node of a multi-primary
//! cluster) → look again in a second, never wake; held → take `L(J)`
//! within a wait and give it back at once, in one statement, and when it
//! got the lock, every name recorded for `J` goes to the subscribers. So a
//! wake needs the lock to go from held to free: a live leader wakes nobody,
//! a release wakes each follower once, and a leader's lock session that
//! breaks (or a crashed leader's) wakes each follower once too, then the
//! waiter sees the lock free and does not wake again. The server grants a
//! freed lock to one waiter, which passes it on at once: followers wake
//! one after another, not all in the same instant.
//!
//! Bounded: 32 followed identities (one session each), 1,024 names each,
//! the subscribers' channels of `crate::feed`. Any error on a feed session
//! drops it and tries again later, with a growing pause; the store's calls
//! never see it. Where the locks cannot work (named locks do not cross the
//! nodes of a multi-primary cluster; a pooler in transaction mode lends a
//! session's locks to others), the server says so ([`Locks::off`],
//! [`Failed::Off`]) and the feed turns off: no locks, no waiters, and the
//! subscribers' channels end (their drivers poll).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::batch::BatchItem;
use crate::feed::Subscribers;
use crate::lease::Lease;
use crate::store::{Released, StoreError};

/// The answer to a yes-or-no question about the server, once known: not
/// asked yet (`None`), or the answer. Is it a node of a multi-primary
/// cluster (MySQL)? Does a pooler lend its sessions (PostgreSQL)?
#[derive(Debug, Default)]
pub(crate) struct Known(AtomicU8);

const UNKNOWN: u8 = 0;
const NO: u8 = 1;
const YES: u8 = 2;

impl Known {
    /// An answer given in advance (a builder's setting).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn fixed(yes: bool) -> Known {
        Known(AtomicU8::new(if yes { YES } else { NO }))
    }

    /// `Some(answer)` once known.
    pub(crate) fn known(&self) -> Option<bool> {
        match self.0.load(Ordering::SeqCst) {
            UNKNOWN => None,
            a => Some(a == YES),
        }
    }

    /// The first answer stands.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn learn(&self, yes: bool) {
        let _ = self.0.compare_exchange(UNKNOWN, if yes { YES } else { NO }, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The latest answer stands.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn set(&self, yes: bool) {
        self.0.store(if yes { YES } else { NO }, Ordering::SeqCst);
    }
}

/// Why a step on a feed session failed.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The locks cannot work on this server: the feed turns off for good.
    Off,
    /// The session failed (or could not be opened): drop it, try again.
    Session(String),
}

/// What a server's locks do: its statements, on sessions of its own.
pub(crate) trait Locks: Send + Sync + 'static {
    /// A session of the feed's, and its id on the server.
    type Session: Send;
    /// The server, as thread names and log lines name it.
    const SERVER: &'static str;
    /// Why the feed turns off, for the log line that says so.
    const OFF: &'static str;
    /// A lock as the server names it.
    type Lock: Send;
    /// The lock of `identity`'s leadership, the same in every process.
    fn lock(&self, identity: &str) -> Self::Lock;
    /// The server is known to be one where the locks cannot work.
    fn off(&self) -> bool;
    /// A new session, and its id for [`Locks::kill`].
    fn connect(&self) -> Result<(Self::Session, u32), Failed>;
    /// Takes `lock` without waiting: whether it got it (`false`: someone
    /// else holds it).
    fn take(&self, s: &mut Self::Session, lock: &Self::Lock) -> Result<bool, Failed>;
    /// Gives `lock` back.
    fn give_back(&self, s: &mut Self::Session, lock: &Self::Lock) -> Result<(), Failed>;
    /// Checks that the session (and so its locks) lives.
    fn check(&self, s: &mut Self::Session) -> Result<(), Failed>;
    /// Whether some session holds `lock`.
    fn held(&self, s: &mut Self::Session, lock: &Self::Lock) -> Result<bool, Failed>;
    /// Takes `lock` within `wait` and gives it back at once, in one
    /// statement: whether it got it (`false`: the wait ran out).
    fn wait(&self, s: &mut Self::Session, lock: &Self::Lock, wait: Duration) -> Result<bool, Failed>;
    /// Ends the sessions `ids` from a session of its own (waiters may be
    /// blocked in a wait). Runs on a thread of its own.
    fn kill(&self, ids: &[u32]);
}

/// The feed's waits. Always [`PACE`] but in tests, which shorten them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// How long a waiter's wait for a lock lasts: one statement per this
    /// long while the leader lives.
    pub(crate) lock_wait: Duration,
    /// A waiter that found the lock free, or just woke, looks again after
    /// this.
    pub(crate) look_again: Duration,
    /// A lock someone else holds for a moment (a waiter's, or a process
    /// with the same identity's) is asked for again after `retake`,
    /// doubling up to `max_retake`.
    pub(crate) retake: Duration,
    pub(crate) max_retake: Duration,
    /// How often the lock session is checked while it holds locks, so a
    /// broken one is replaced.
    pub(crate) check_every: Duration,
    /// After a failed session, connecting again waits `first_backoff` at
    /// first, doubling up to `max_backoff`.
    pub(crate) first_backoff: Duration,
    pub(crate) max_backoff: Duration,
    /// A followed name not seen again for this long is forgotten.
    pub(crate) forget: Duration,
}

pub(crate) const PACE: Pace = Pace {
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
pub(crate) const MAX_FOLLOWED: usize = 32;
/// Names recorded per followed identity.
const MAX_NAMES: usize = 1024;
/// Names recorded as led per identity.
const MAX_LED: usize = 65_536;

/// What the store keeps; its clones share it. Dropping the last one ends
/// the feed: the subscribers' channels close, the threads stop and their
/// sessions are closed (waiters blocked in a wait are killed).
pub(crate) struct Feed<L: Locks> {
    pub(crate) shared: Arc<Shared<L>>,
}

pub(crate) struct Shared<L: Locks> {
    pub(crate) locks: L,
    pub(crate) state: Mutex<State>,
    changed: Condvar,
    /// Shared with another feed of the store's, if any (PostgreSQL's
    /// `LISTEN`): one channel per subscriber, whichever feed sends.
    subscribers: Arc<Subscribers>,
    /// The negative control of the storm rule: wake whenever the lock is
    /// free, without first seeing it held.
    wakes_on_free: bool,
    pace: Pace,
}

#[derive(Default)]
pub(crate) struct State {
    /// The store is gone: every thread stops.
    pub(crate) ended: bool,
    /// The feed is off (the locks cannot work here): no locks, no waiters.
    pub(crate) off: bool,
    /// Someone subscribed: followed identities get waiters.
    pub(crate) subscribed: bool,
    /// Identity → name → until when it leads it (the lease's expiry on the
    /// local clock, as far as the answer said).
    pub(crate) led: HashMap<String, HashMap<String, Instant>>,
    /// The lock thread runs.
    pub(crate) locking: bool,
    /// The identities whose lock the lock thread holds.
    pub(crate) held: BTreeSet<String>,
    /// Leader identity → what this store saw it lead.
    pub(crate) followed: HashMap<String, Followed>,
    /// The waiters' sessions, killed when the store goes.
    pub(crate) sessions: Vec<u32>,
}

#[derive(Default)]
pub(crate) struct Followed {
    /// Name → when last seen led by this identity, and under which fence.
    pub(crate) names: HashMap<String, (Instant, u64)>,
    waiting: bool,
}

impl<L: Locks> Feed<L> {
    pub(crate) fn new(locks: L, subscribers: Arc<Subscribers>, wakes_on_free: bool, pace: Pace) -> Feed<L> {
        Feed {
            shared: Arc::new(Shared {
                locks,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                subscribers,
                wakes_on_free,
                pace,
            }),
        }
    }

    /// A new subscription; `None` once the feed is off or gone.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn subscribe(&self) -> Option<crossbeam_channel::Receiver<Released>> {
        self.follow().then(|| self.shared.subscribers.subscribe())
    }

    /// Someone subscribed (here, or to the feed it shares its subscribers
    /// with): from now on, leaders seen get waiters. Whether the feed is
    /// still on.
    pub(crate) fn follow(&self) -> bool {
        if self.shared.locks.off() {
            self.shared.turn_off();
        }
        let mut st = self.shared.state.lock();
        st.subscribed = !st.ended && !st.off;
        st.subscribed
    }

    /// `identity` holds `lease` (a claim or renewal that succeeded).
    pub(crate) fn leads(&self, identity: &str, lease: &Lease) {
        if lease.expired() {
            return;
        }
        if self.shared.locks.off() {
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
            st.locking = spawn(&self.shared, "lock", locker);
        }
    }

    /// Whether a release of `names` by `identity` will wake its waiters
    /// through the lock: the lock is held, and `identity` leads nothing
    /// else here, so the lock goes once the release commits. A name led
    /// beyond its lease's expiry still counts as led (the answer then is
    /// no, and the release notifies: a hint too many, never one too few).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn gives_back_after(&self, identity: &str, names: &[&str]) -> bool {
        let st = self.shared.state.lock();
        if !st.held.contains(identity) {
            return false;
        }
        // A group's release may carry thousands of names: a set, not a scan
        // of `names` for each name led.
        let names: HashSet<&str> = names.iter().copied().collect();
        st.led
            .get(identity)
            .is_none_or(|led| led.len() <= names.len() && led.keys().all(|n| names.contains(n.as_str())))
    }

    /// `identity` no longer leads `name` (its release committed, or a
    /// renewal found the lease lost).
    pub(crate) fn left(&self, identity: &str, name: &str) {
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
    pub(crate) fn saw(&self, caller: Option<&str>, lease: &Lease) {
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
            let started = spawn(&self.shared, "wait", move |s| waiter(s, &holder));
            if let Some(f) = st.followed.get_mut(lease.holder.as_str()) {
                f.waiting = started;
            }
        }
    }
}

impl<L: Locks> Feed<L> {
    /// What a claim, renewal (`identity` the caller's) or read (`None`)
    /// answered about `name`.
    fn answered(&self, identity: Option<&str>, name: &str, answer: &Result<Lease, StoreError>) {
        match (answer, identity) {
            (Ok(lease), Some(i)) if lease.holder == i => self.leads(i, lease),
            (Ok(lease), _) => self.saw(identity, lease),
            (Err(e), Some(i)) if e.is_lease_lost() => self.left(i, name),
            (Err(_), _) => {}
        }
    }

    /// A batch of releases by `identity` answered: those that committed
    /// let their locks go.
    pub(crate) fn released_each(&self, identity: &str, items: &[BatchItem<'_>], answers: &[Result<(), StoreError>]) {
        for (it, answer) in items.iter().zip(answers) {
            if answer.is_ok() {
                self.left(identity, it.name);
            }
        }
    }
}

/// Tells `feed` (a store's, if it keeps one) what a claim, renewal
/// (`identity` the caller's) or read (`None`) answered about `name`;
/// returns the answer.
pub(crate) fn told<L: Locks>(
    feed: Option<&Feed<L>>, identity: Option<&str>, name: &str, answer: Result<Lease, StoreError>,
) -> Result<Lease, StoreError> {
    if let Some(feed) = feed {
        feed.answered(identity, name, &answer);
    }
    answer
}

/// [`told`] for each of a batch's names and answers; returns the answers.
pub(crate) fn told_each<'a, L: Locks>(
    feed: Option<&Feed<L>>, identity: Option<&str>, names: impl Iterator<Item = &'a str>,
    answers: Vec<Result<Lease, StoreError>>,
) -> Vec<Result<Lease, StoreError>> {
    if let Some(feed) = feed {
        for (name, answer) in names.zip(&answers) {
            feed.answered(identity, name, answer);
        }
    }
    answers
}

impl<L: Locks> Drop for Feed<L> {
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
        // Waiters may be blocked in a 30 s wait: end their sessions from a
        // session of its own, off the dropping thread.
        let _ = spawn(&self.shared, "feed-stop", move |s| s.locks.kill(&sessions));
    }
}

/// Starts `run` on a thread of its own, named after the server and `what`;
/// whether it started.
fn spawn<L: Locks>(shared: &Arc<Shared<L>>, what: &str, run: impl FnOnce(&Shared<L>) + Send + 'static) -> bool {
    let shared = Arc::clone(shared);
    let name = format!("leaderelection-{}-{what}", L::SERVER);
    let started = thread::Builder::new().name(name).spawn(move || run(&shared));
    if let Err(e) = &started {
        log::warn!("leaderelection: cannot start the {} release feed's thread ({e}); followers poll", L::SERVER);
    }
    started.is_ok()
}

impl<L: Locks> Shared<L> {
    /// The feed is off for good: the threads stop, the subscribers'
    /// channels close.
    fn turn_off(&self) {
        let was = std::mem::replace(&mut self.state.lock().off, true);
        if !was {
            log::info!(
                "leaderelection: {}: {}; no feed of releases, followers learn of releases by polling",
                L::SERVER,
                L::OFF
            );
        }
        self.changed.notify_all();
        self.subscribers.clear();
    }

    /// A new session, unless the locks cannot work here (the feed turns
    /// off).
    fn connect(&self) -> Result<(L::Session, u32), String> {
        self.locks.connect().map_err(|e| {
            if matches!(e, Failed::Off) {
                self.turn_off();
            }
            said(e)
        })
    }

    /// Waits on the state until `until` or a change, unless the threads
    /// must stop.
    fn pause(&self, st: &mut MutexGuard<'_, State>, until: Instant) {
        if !st.ended && !st.off {
            self.changed.wait_until(st, until);
        }
    }
}

/// What a failed step says, for the debug log.
fn said(e: Failed) -> String {
    match e {
        Failed::Off => "the locks cannot work here".into(),
        Failed::Session(e) => e,
    }
}

/// A pause that doubles with each failure in a row, from `first` up to
/// `max`, and starts over after a success.
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first }
    }

    /// When to try again after a failure now; the next pause doubles.
    pub(crate) fn after_failure(&mut self) -> Instant {
        let at = Instant::now() + self.next;
        self.next = (self.next * 2).min(self.max);
        at
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

/// The leader side's thread: holds the lock of every identity the store
/// leads, on one session, and releases the lock of each identity that
/// leads nothing any more.
fn locker<L: Locks>(shared: &Shared<L>) {
    let mut session: Option<L::Session> = None;
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
                    st.held.clear();
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
                Ok((s, _)) => session = Some(s),
                Err(e) => {
                    log::debug!("leaderelection: {} release feed: lock session: {e}; trying again", L::SERVER);
                    again = Some(backoff.after_failure());
                    continue;
                }
            }
        }
        let Some(s) = session.as_mut() else { continue };
        checked = Instant::now();
        match lock_step(&shared.locks, s, &wanted, &mut held) {
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
                let e = said(e);
                log::debug!("leaderelection: {} release feed: lock session: {e}; connecting again", L::SERVER);
                session = None;
                held.clear();
                again = Some(backoff.after_failure());
            }
        }
        // What a release asks (`Feed::gives_back_after`).
        shared.state.lock().held.clone_from(&held);
    }
}

/// Releases the locks no longer wanted, takes the ones wanted, or checks
/// the session; `Ok(false)` when a lock was held by someone else.
fn lock_step<L: Locks>(
    locks: &L, s: &mut L::Session, wanted: &BTreeSet<String>, held: &mut BTreeSet<String>,
) -> Result<bool, Failed> {
    let stale: Vec<String> = held.difference(wanted).cloned().collect();
    let stale_or_missing = stale.len() + wanted.difference(held).count();
    for identity in stale {
        locks.give_back(s, &locks.lock(&identity))?;
        held.remove(&identity);
    }
    let mut all = true;
    let missing: Vec<String> = wanted.difference(held).cloned().collect();
    for identity in missing {
        if locks.take(s, &locks.lock(&identity))? {
            held.insert(identity);
        } else {
            all = false;
        }
    }
    if stale_or_missing == 0 {
        // Nothing to do but check that the session (and its locks) lives.
        locks.check(s)?;
    }
    Ok(all)
}

/// A waiter for the releases of `identity`, until it is no longer followed
/// (nothing seen led by it for a while) or the feed ends.
fn waiter<L: Locks>(shared: &Shared<L>, identity: &str) {
    let lock = shared.locks.lock(identity);
    let mut session: Option<(L::Session, u32)> = None;
    let pace = shared.pace;
    let mut backoff = Backoff::new(pace.first_backoff, pace.max_backoff);
    let mut until: Option<Instant> = None;
    // The last wait ran out with the lock held all along.
    let mut held = false;
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
                Ok((s, id)) => {
                    let mut st = shared.state.lock();
                    if st.ended {
                        return;
                    }
                    st.sessions.push(id);
                    session = Some((s, id));
                }
                Err(e) => {
                    log::debug!("leaderelection: {} release feed: waiter session: {e}; trying again", L::SERVER);
                    until = Some(backoff.after_failure());
                    continue;
                }
            }
        }
        let Some((s, id)) = session.as_mut() else { continue };
        // A wait that ran out under a live leader waits again at once, without
        // asking again whether the lock is held: one statement per wait.
        match wait_step(shared, s, &lock, held) {
            Ok(Waited::Free) => {
                held = false;
                until = Some(Instant::now() + pace.look_again);
            }
            Ok(Waited::Held) => {
                held = true;
                backoff.reset();
            }
            Ok(Waited::Released) => {
                held = false;
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
                held = false;
                let e = said(e);
                log::debug!("leaderelection: {} release feed: waiter session: {e}; connecting again", L::SERVER);
                let id = *id;
                forget(&mut shared.state.lock(), Some(id));
                session = None;
                until = Some(backoff.after_failure());
            }
        }
    }
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

/// One wait for `lock`; `held`: the last wait ran out with it held, so it
/// need not be looked at first.
fn wait_step<L: Locks>(shared: &Shared<L>, s: &mut L::Session, lock: &L::Lock, held: bool) -> Result<Waited, Failed> {
    if !held && !shared.wakes_on_free && !shared.locks.held(s, lock)? {
        return Ok(Waited::Free);
    }
    let got = shared.locks.wait(s, lock, shared.pace.lock_wait)?;
    Ok(if got { Waited::Released } else { Waited::Held })
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
}
