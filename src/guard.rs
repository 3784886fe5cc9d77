//! `LeaderGuard`: a handle on one term.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::error::{ElectionError, OpKind};
use crate::machine::{EndReason, TermId};
use crate::slot::SlotClaim;
use crate::store::{Store, StoreError};
use crate::sync::{AtomicU64, AtomicU8, AtomicUsize, Link, Ordering};

/// What a guard sends its elector.
pub(crate) enum Command {
    /// The last guard of a term was dropped.
    GuardsGone(TermId),
    /// `LeaderGuard::resign` ended the term with this fence: release it and
    /// answer.
    Resign(TermId, u64, Sender<Result<(), ElectionError>>),
    /// Someone saw the term's deadline pass and ended it.
    Expired(TermId),
    /// `Elector::shutdown`; `false` skips the release.
    Shutdown { release: bool },
}

impl Command {
    /// The term a guard's command is about (none for the elector's own).
    pub(crate) fn term(&self) -> Option<TermId> {
        match self {
            Command::GuardsGone(t) | Command::Resign(t, ..) | Command::Expired(t) => Some(*t),
            Command::Shutdown { .. } => None,
        }
    }
}

/// `end` while the term is live.
const LIVE: u8 = 0;

fn end_code(reason: EndReason) -> u8 {
    match reason {
        EndReason::ExpiredLocally => 1,
        EndReason::LeaseLost => 2,
        EndReason::Fatal => 3,
        EndReason::Resigned => 4,
        EndReason::Shutdown => 5,
    }
}

fn end_reason(code: u8) -> Option<EndReason> {
    Some(match code {
        1 => EndReason::ExpiredLocally,
        2 => EndReason::LeaseLost,
        3 => EndReason::Fatal,
        4 => EndReason::Resigned,
        5 => EndReason::Shutdown,
        _ => return None,
    })
}

/// The state of one term, shared by its guards, the elector's threads and
/// the watchdog.
///
/// A term ends exactly once: whoever ends it (the program letting go of its
/// last guard or resigning, a reader that sees the deadline passed, the
/// renewal thread on the machine's word) does so by one compare-and-swap of
/// `end` from live to its reason, and everybody else reads that reason
/// instead of deciding again. The elector then tells its state machine the
/// reason that won, so a resignation racing a renewal answer is still a
/// resignation.
pub(crate) struct TermShared {
    pub(crate) id: TermId,
    pub(crate) fence: u64,
    origin: Instant,
    /// Local monotonic deadline, in nanoseconds after `origin`.
    deadline_nanos: AtomicU64,
    /// [`LIVE`], or the code of the reason it ended; written once.
    end: AtomicU8,
    guards: AtomicUsize,
    /// Dropped when the term ends, which wakes every `lost()` receiver.
    lost_tx: Mutex<Option<Sender<()>>>,
    lost_rx: Receiver<()>,
    /// The elector's command channel; `None` for test terms.
    link: Option<Link<Command>>,
    /// Where the term's lease lives, for the guard's own store calls
    /// (slots); `None` for test terms.
    store: Option<Arc<TermStore>>,
}

/// The store, election, identity and call bound a term's guard uses for
/// calls of its own.
pub(crate) struct TermStore {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) name: Arc<str>,
    pub(crate) identity: Arc<str>,
    pub(crate) timeout: Duration,
}

impl TermShared {
    pub(crate) fn new(
        id: TermId, fence: u64, origin: Instant, deadline: Duration, link: Option<Link<Command>>,
    ) -> TermShared {
        let (lost_tx, lost_rx) = crossbeam_channel::bounded(0);
        TermShared {
            id,
            fence,
            origin,
            deadline_nanos: AtomicU64::new(nanos(deadline)),
            end: AtomicU8::new(LIVE),
            guards: AtomicUsize::new(0),
            lost_tx: Mutex::new(Some(lost_tx)),
            lost_rx,
            link,
            store: None,
        }
    }

    /// The term with `store` for its guards' own calls.
    pub(crate) fn with_store(mut self, store: Arc<TermStore>) -> TermShared {
        self.store = Some(store);
        self
    }

    /// The term is live and its deadline, re-read against the monotonic
    /// clock now, has not passed.
    pub(crate) fn is_valid(&self) -> bool {
        self.is_valid_at(self.origin.elapsed())
    }

    /// [`is_valid`](Self::is_valid) with the clock read `elapsed` after the
    /// origin.
    ///
    /// Whoever first sees the deadline passed (a guard, the elector, the
    /// watchdog) ends the term there and then, so a renewal answer that
    /// arrives a moment later cannot make it valid again: once false, false
    /// forever. The elector is told, so its state machine ends the term too.
    pub(crate) fn is_valid_at(&self, elapsed: Duration) -> bool {
        if self.end.load(Ordering::Acquire) != LIVE {
            return false;
        }
        if nanos(elapsed) < self.deadline_nanos.load(Ordering::Acquire) {
            return true;
        }
        self.expire();
        false
    }

    /// Ends the term because its deadline passed, and tells the elector.
    /// Returns whether this call was the one that ended it.
    pub(crate) fn expire(&self) -> bool {
        let first = self.end(EndReason::ExpiredLocally).is_ok();
        if first {
            self.tell(Command::Expired(self.id));
        }
        first
    }

    fn tell(&self, cmd: Command) {
        if let Some(link) = &self.link {
            let _ = link.send(cmd);
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        let d = Duration::from_nanos(self.deadline_nanos.load(Ordering::Acquire));
        // u64 nanoseconds is under 585 years: far from any overflow, but
        // stay total anyway.
        self.origin.checked_add(d).unwrap_or(self.origin + Duration::from_secs(86_400 * 365 * 100))
    }

    /// Moves the deadline after a renewal, and returns the reason the term
    /// ended if it already has: the extension then changes nothing, and the
    /// caller must tell the state machine that reason.
    pub(crate) fn extend(&self, deadline: Duration) -> Option<EndReason> {
        if self.end.load(Ordering::Acquire) == LIVE {
            self.deadline_nanos.store(nanos(deadline), Ordering::Release);
        }
        // Re-read after the store: an end that raced the store is seen here,
        // and every reader checks `end` before the deadline.
        self.end_reason()
    }

    /// Why the term ended, or `None` while it is live.
    pub(crate) fn end_reason(&self) -> Option<EndReason> {
        end_reason(self.end.load(Ordering::Acquire))
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.end.load(Ordering::Acquire) != LIVE
    }

    /// Ends the term for `reason`, invalidating every guard and waking
    /// `lost()` receivers. `Err` carries the reason that ended it first when
    /// this call came too late.
    pub(crate) fn end(&self, reason: EndReason) -> Result<(), EndReason> {
        match self.end.compare_exchange(LIVE, end_code(reason), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // Make every later deadline check fail too, whatever reads it.
                self.deadline_nanos.store(0, Ordering::Release);
                drop(self.lost_tx.lock().take());
                Ok(())
            }
            Err(code) => Err(end_reason(code).unwrap_or(reason)),
        }
    }

    pub(crate) fn guards(&self) -> usize {
        self.guards.load(Ordering::Acquire)
    }

    /// A new guard. Callers hand out guards of live terms only; one that
    /// races the term's end is simply invalid.
    pub(crate) fn guard(self: &Arc<Self>) -> LeaderGuard {
        self.guards.fetch_add(1, Ordering::AcqRel);
        LeaderGuard { term: Arc::clone(self) }
    }

    /// A guard went away. The last guard of a live term resigns it.
    fn release_guard(&self) {
        if self.guards.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // The last guard: the term ends here and now (unless something ended
        // it first), so no later `wait_leader` can hand out a guard of it and
        // quietly cancel the resignation. The elector then releases the
        // lease, and also learns that no guard holds a new term back.
        let _ = self.end(EndReason::Resigned);
        self.tell(Command::GuardsGone(self.id));
    }

    pub(crate) fn was_resigned(&self) -> bool {
        self.end_reason() == Some(EndReason::Resigned)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A handle on one term of leadership.
///
/// Ask [`is_valid`](LeaderGuard::is_valid) before every write and stamp the
/// write with [`fence`](LeaderGuard::fence). Once `is_valid` is false it stays
/// false: a later term comes with a new guard.
///
/// Dropping the last guard of a term that is still live **resigns**: the
/// lease is released so a successor can take over at once, and this process
/// waits two retry periods before campaigning again, so a follower's next
/// poll (jittered up to 1.2 retry periods) gets there first. Hold the guard for the whole
/// work loop. [`resign`](LeaderGuard::resign) does the same and reports
/// whether the release worked.
///
/// While any guard of an ended term is alive, the elector starts no new term,
/// so two terms of one process never overlap in user code.
///
/// # Examples
///
/// ```
/// use leaderelection::testing::TestTerm;
///
/// fn work(guard: &leaderelection::LeaderGuard, out: &mut Vec<u64>) {
///     for _ in 0..3 {
///         if !guard.is_valid() {
///             return;
///         }
///         out.push(guard.fence());
///     }
/// }
///
/// let term = TestTerm::new(7);
/// let mut writes = Vec::new();
/// work(&term.guard(), &mut writes);
/// assert_eq!(writes, [7, 7, 7]);
/// ```
pub struct LeaderGuard {
    term: Arc<TermShared>,
}

impl LeaderGuard {
    /// Whether this term is still live. Re-reads the monotonic clock on every
    /// call and compares it with the term's deadline, so a late watchdog
    /// cannot stretch the term. Cheap: two atomic loads and a clock read.
    pub fn is_valid(&self) -> bool {
        self.term.is_valid()
    }

    /// The term's fencing token. Tokens of an election's terms strictly
    /// increase and are never shared; have the systems you write to refuse a
    /// token lower than the highest they have seen.
    pub fn fence(&self) -> u64 {
        self.term.fence
    }

    /// The local instant at which the term ends unless a renewal extends it.
    /// Advisory: decide with [`is_valid`](LeaderGuard::is_valid).
    pub fn valid_until(&self) -> Instant {
        self.term.deadline()
    }

    /// A channel that becomes ready when the term ends: a receive returns
    /// `Err(RecvError)` then (nothing is ever sent). Use it in `select!`
    /// beside your own channels.
    ///
    /// It is woken by the watchdog, a second line behind
    /// [`is_valid`](LeaderGuard::is_valid), which is exact.
    pub fn lost(&self) -> Receiver<()> {
        self.term.lost_rx.clone()
    }

    /// Blocks until the term ends or `timeout` passes.
    pub fn wait_lost_timeout(&self, timeout: Duration) -> WaitTimeoutResult {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_lost_deadline(deadline),
            None => {
                self.wait_lost();
                WaitTimeoutResult(false)
            }
        }
    }

    /// Blocks until the term ends or `deadline` passes.
    pub fn wait_lost_deadline(&self, deadline: Instant) -> WaitTimeoutResult {
        loop {
            if !self.is_valid() {
                return WaitTimeoutResult(false);
            }
            let now = Instant::now();
            if now >= deadline {
                return WaitTimeoutResult(true);
            }
            // Wake at the term's own deadline too, in case the watchdog is late.
            let until = deadline.min(self.term.deadline().max(now));
            match self.term.lost_rx.recv_deadline(until) {
                Err(RecvTimeoutError::Disconnected) => return WaitTimeoutResult(false),
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Blocks until the term ends.
    pub fn wait_lost(&self) {
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        while self.wait_lost_deadline(far).timed_out() {}
    }

    /// Claims `slot` for this term: the first claim of a slot by any term
    /// of any participant is [`SlotClaim::Claimed`], every other one
    /// [`SlotClaim::Taken`] (with the claiming term's fence and the outcome
    /// its run recorded). Run the slot's work only after `Claimed`, stamped
    /// with [`fence`](LeaderGuard::fence) as always, then record how it
    /// went with [`finish_slot`](LeaderGuard::finish_slot). The store
    /// records the claim in the same statement that checks this term still
    /// holds the lease on the database, so a host whose cron fired late, or
    /// that waited for the lease while another ran the job, is told the
    /// slot was taken. See [`crate::slot`] for what a run that fails or is
    /// killed means: by default the slot stays taken (at most once).
    ///
    /// Blocks for one store call, at most the operation timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use leaderelection::{period_slot, Config, Elector, MemStore};
    /// use std::time::Duration;
    ///
    /// let store = MemStore::new();
    /// let elector = Elector::start(Config::new(store.clone(), "nightly-report"))?;
    /// let guard = elector.wait_leader_timeout(Duration::from_secs(5))?;
    /// let slot = period_slot(store.now().as_unix_micros(), Duration::from_secs(86_400));
    /// if guard.claim_slot(&slot)?.is_claimed() {
    ///     // ... the day's report, stamped with guard.fence() ...
    ///     guard.finish_slot(&slot, 0)?;
    /// }
    /// assert!(!guard.claim_slot(&slot)?.is_claimed(), "once per slot");
    /// # drop(guard);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ElectionError::NotLeading`] when the term has ended (before the
    /// claim, or while it was on its way: then the slot may be claimed by
    /// this term and its work must not start); the store's error otherwise
    /// (the claim may or may not have landed). A store that keeps no slots
    /// fails with a fatal error, as does a slot name that is empty, longer
    /// than [`MAX_SLOT_LEN`](crate::MAX_SLOT_LEN) bytes or holds a control
    /// character.
    pub fn claim_slot(&self, slot: &str) -> Result<SlotClaim, ElectionError> {
        self.claim(slot, false)
    }

    /// Like [`claim_slot`](LeaderGuard::claim_slot), but a slot whose run
    /// did not record success (it failed, or was killed before it could
    /// say) is taken over from the earlier term that claimed it. Only an
    /// earlier term's: that term has ended on the database, so its run no
    /// longer leads. A slot whose run succeeded stays taken.
    ///
    /// # Errors
    ///
    /// As [`claim_slot`](LeaderGuard::claim_slot).
    pub fn claim_slot_retrying_failed(&self, slot: &str) -> Result<SlotClaim, ElectionError> {
        self.claim(slot, true)
    }

    fn claim(&self, slot: &str, retry_failed: bool) -> Result<SlotClaim, ElectionError> {
        let ts = self.term_store(OpKind::ClaimSlot)?;
        if !self.is_valid() {
            return Err(ElectionError::NotLeading);
        }
        let claim = ts
            .store
            .claim_slot(&ts.name, &ts.identity, self.term.fence, slot, retry_failed, ts.timeout)
            .map_err(|e| ElectionError::store(OpKind::ClaimSlot, e))?;
        if claim.is_claimed() && !self.is_valid() {
            return Err(ElectionError::NotLeading);
        }
        Ok(claim)
    }

    /// Records how this term's run of `slot` ended: `outcome` 0 for
    /// success, anything else a failure (the command-line tool records the
    /// child's exit status). Returns whether the slot was still this term's
    /// (a later term may have taken it over). Works after the term ended:
    /// a run says how it ended whenever it can.
    ///
    /// # Errors
    ///
    /// The store's error; then the outcome may or may not be recorded.
    pub fn finish_slot(&self, slot: &str, outcome: i32) -> Result<bool, ElectionError> {
        let ts = self.term_store(OpKind::FinishSlot)?;
        ts.store
            .finish_slot(&ts.name, self.term.fence, slot, outcome, ts.timeout)
            .map_err(|e| ElectionError::store(OpKind::FinishSlot, e))
    }

    /// What a lease check of this term in a transaction of yours needs:
    /// the election, this elector's identity and the term's fence (see
    /// `PostgresStore::check_lease`, `MySqlStore::check_lease`, or their
    /// `lease_check_sql` for another driver).
    ///
    /// # Errors
    ///
    /// [`ElectionError::NotLeading`] once the term has ended by this
    /// process's clock (a check would fail anyway); a fatal error for a
    /// test term, which has no election.
    pub fn lease_check(&self) -> Result<LeaseCheck<'_>, ElectionError> {
        let ts = self.term_store(OpKind::CheckLease)?;
        if !self.is_valid() {
            return Err(ElectionError::NotLeading);
        }
        Ok(LeaseCheck { name: &ts.name, identity: &ts.identity, fence: self.term.fence })
    }

    /// [`LeaderGuard::lease_check`] as a store's `check_lease` reports it:
    /// a term over by this process's clock is `LeaseLost`, a test term a
    /// fatal error naming `store`.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn lease_check_for(&self, store: &str) -> Result<LeaseCheck<'_>, StoreError> {
        match self.lease_check() {
            Ok(check) => Ok(check),
            Err(ElectionError::NotLeading) => {
                Err(StoreError::lease_lost_because("the term has ended by this process's clock"))
            }
            Err(e) => Err(StoreError::fatal(format!("{store} check_lease: {e}"))),
        }
    }

    fn term_store(&self, op: OpKind) -> Result<&TermStore, ElectionError> {
        self.term
            .store
            .as_deref()
            .ok_or_else(|| ElectionError::store(op, StoreError::fatal("a test term has no store to keep slots in")))
    }

    /// Ends the term now and releases the lease so a successor can take over
    /// at once; this process then waits two retry periods before campaigning
    /// again. Every guard of the term turns invalid before the release is
    /// sent. Blocks for at most about one operation timeout.
    ///
    /// # Errors
    ///
    /// The release failed or timed out: the lease then runs out on its own.
    pub fn resign(self) -> Result<(), ElectionError> {
        match self.begin_resign() {
            Some(answer) => answer.recv().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }

    /// Ends the term as resigned and asks the elector to release it; the
    /// receiver answers once the release is done. `None` when there is
    /// nothing to wait for: the term had already ended (lost, expired, shut
    /// down: nothing of it is ours to hand over, and whatever release it
    /// needed is under way), it is a test term, or the elector has stopped
    /// (and released on its way out).
    pub(crate) fn begin_resign(&self) -> Option<Receiver<Result<(), ElectionError>>> {
        self.term.end(EndReason::Resigned).ok()?;
        let link = self.term.link.as_ref()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        link.send(Command::Resign(self.term.id, self.term.fence, tx)).ok()?;
        Some(rx)
    }
}

#[cfg(all(test, loom))]
impl LeaderGuard {
    pub(crate) fn is_valid_at_for_test(&self, elapsed: Duration) -> bool {
        self.term.is_valid_at(elapsed)
    }
}

impl Clone for LeaderGuard {
    fn clone(&self) -> LeaderGuard {
        self.term.guard()
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        self.term.release_guard();
    }
}

impl fmt::Debug for LeaderGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderGuard").field("fence", &self.term.fence).field("valid", &self.is_valid()).finish()
    }
}

/// The values of a lease check of one term, from
/// [`LeaderGuard::lease_check`]: the parameters of the stores'
/// `lease_check_sql`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseCheck<'a> {
    /// The election's name.
    pub name: &'a str,
    /// The elector's identity, as the lease row holds it.
    pub identity: &'a str,
    /// The term's fence.
    pub fence: u64,
}

/// Whether a timed wait ran out of time, as from
/// [`LeaderGuard::wait_lost_timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True when the wait ended because time ran out, not because the term
    /// ended.
    pub fn timed_out(self) -> bool {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A group routes its guards' commands by the term they name; the
    // driver's own shutdown names none.
    #[test]
    fn a_guards_command_names_its_term_and_a_shutdown_none() {
        let (tx, _rx) = crossbeam_channel::bounded(1);
        assert_eq!(Command::GuardsGone(TermId(3)).term(), Some(TermId(3)));
        assert_eq!(Command::Expired(TermId(4)).term(), Some(TermId(4)));
        assert_eq!(Command::Resign(TermId(5), 9, tx).term(), Some(TermId(5)));
        assert_eq!(Command::Shutdown { release: true }.term(), None);
    }

    #[test]
    fn once_seen_expired_a_late_extension_cannot_revive_the_term() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let term = Arc::new(TermShared::new(TermId(7), 3, Instant::now(), Duration::ZERO, Some(crate::sync::link(tx))));
        let guard = term.guard();
        assert!(!guard.is_valid(), "deadline already passed");
        // A renewal answer taken just before the deadline lands just after.
        assert_eq!(term.extend(Duration::from_secs(3600)), Some(EndReason::ExpiredLocally));
        assert!(!guard.is_valid(), "once false, false forever");
        assert!(term.is_ended());
        assert!(matches!(rx.try_recv(), Ok(Command::Expired(TermId(7)))), "the elector is told");
        assert!(!guard.is_valid());
        assert!(rx.try_recv().is_err(), "told once");
        assert!(guard.lost().try_recv().is_err_and(|e| e.is_disconnected()));
        std::mem::forget(guard); // its drop would send GuardsGone; not under test here
    }

    #[test]
    fn an_extension_before_anyone_saw_the_deadline_keeps_the_term() {
        let term = Arc::new(TermShared::new(TermId(1), 1, Instant::now(), Duration::from_secs(3600), None));
        let guard = term.guard();
        assert_eq!(term.extend(Duration::from_secs(7200)), None);
        assert!(guard.is_valid());
        assert!(guard.valid_until() > Instant::now() + Duration::from_secs(7000));
    }
}

/// Model tests of the hand-off between a term's guards, the renewal thread
/// and the watchdog, over every interleaving loom can find. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --release --lib loom`.
///
/// Each model ends with what the elector's renewal thread would do next:
/// read the commands the term sent and the answer of its own extension, and
/// settle its state machine with the reason they report. The first reason
/// the machine is told must be the reason that won the term's one
/// compare-and-swap; a resignation can never turn into an expiry.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    const DEADLINE: Duration = Duration::from_nanos(100);
    const BEFORE: Duration = Duration::from_nanos(50);
    const AFTER: Duration = Duration::from_nanos(150);
    const EXTENDED: Duration = Duration::from_nanos(1_000);

    fn term() -> (Arc<TermShared>, Receiver<Command>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (Arc::new(TermShared::new(TermId(1), 7, Instant::now(), DEADLINE, Some(crate::sync::link(tx)))), rx)
    }

    /// The state machine as the driver settles it: it takes the first end
    /// it is told of a live term and ignores the rest.
    #[derive(Default)]
    struct MachineSeen {
        first: Option<EndReason>,
        told: usize,
    }

    impl MachineSeen {
        fn settle(&mut self, reason: EndReason) {
            self.told += 1;
            self.first.get_or_insert(reason);
        }

        /// What the driver does with the term's commands, as elector.rs
        /// does: a guards-gone notice of a resigned term resigns it; an
        /// expiry notice expires it. Returns how many expiry notices came.
        fn read(&mut self, term: &TermShared, commands: &Receiver<Command>) -> usize {
            let mut expired = 0;
            for cmd in commands.try_iter() {
                match cmd {
                    Command::GuardsGone(_) if term.was_resigned() => self.settle(EndReason::Resigned),
                    Command::Resign(..) => self.settle(EndReason::Resigned),
                    Command::Expired(_) => {
                        expired += 1;
                        self.settle(EndReason::ExpiredLocally);
                    }
                    _ => {}
                }
            }
            expired
        }
    }

    /// How the driver reads a late extension's answer.
    #[derive(Clone, Copy)]
    enum Driver {
        /// As elector.rs does: settle with the reason the term reports.
        Settles,
        /// The bug this replaced: a late extension always meant "expired".
        AssumesExpired,
    }

    /// The invariants every model checks once its threads are done.
    fn check(term: &TermShared, extension: Option<EndReason>, commands: &Receiver<Command>, answer_first: bool) {
        check_with(Driver::Settles, term, extension, commands, answer_first);
    }

    fn check_with(
        driver: Driver, term: &TermShared, extension: Option<EndReason>, commands: &Receiver<Command>,
        answer_first: bool,
    ) {
        let won = term.end_reason().expect("every model ends the term");
        let mut machine = MachineSeen::default();
        let late = |r: EndReason| match driver {
            Driver::Settles => r,
            Driver::AssumesExpired => EndReason::ExpiredLocally,
        };
        // The driver meets its extension's answer and the commands in
        // either order.
        let expiries;
        if answer_first {
            if let Some(r) = extension {
                machine.settle(late(r));
            }
            expiries = machine.read(term, commands);
        } else {
            expiries = machine.read(term, commands);
            if let Some(r) = extension {
                machine.settle(late(r));
            }
        }
        assert_eq!(machine.first, Some(won), "the machine must be told the reason that won");
        assert!(machine.told >= 1);
        assert_eq!(expiries, usize::from(won == EndReason::ExpiredLocally), "one expiry notice, from its winner");
        if let Some(r) = extension {
            assert_eq!(r, won, "an extension that lands late reports the winner");
        }
        // Once false, false forever, whatever the clock or the deadline say.
        assert!(!term.is_valid_at(Duration::ZERO));
        assert!(!term.is_valid_at(BEFORE));
    }

    #[test]
    fn loom_last_guard_dropped_while_an_extension_lands_and_the_deadline_passes() {
        for answer_first in [true, false] {
            loom::model(move || {
                let (term, commands) = term();
                let guard = term.guard();
                let user = thread::spawn(move || drop(guard));
                let dog = {
                    let term = Arc::clone(&term);
                    thread::spawn(move || term.is_valid_at(AFTER))
                };
                let extension = term.extend(EXTENDED);
                user.join().unwrap();
                let dog_saw_valid = dog.join().unwrap();
                if dog_saw_valid {
                    // Past the first deadline only because the extension was
                    // in before the watchdog looked; then the drop ended it.
                    assert_eq!(term.end_reason(), Some(EndReason::Resigned));
                }
                check(&term, extension, &commands, answer_first);
                assert_eq!(term.guards(), 0);
            });
        }
    }

    /// The negative control: the driver this replaced, which took a late
    /// extension for an expiry, is caught turning a resignation into one.
    #[test]
    #[should_panic(expected = "the machine must be told the reason that won")]
    fn loom_the_old_driver_that_took_a_late_extension_for_an_expiry_is_caught() {
        loom::model(|| {
            let (term, commands) = term();
            let guard = term.guard();
            let user = thread::spawn(move || drop(guard));
            let extension = term.extend(EXTENDED);
            user.join().unwrap();
            check_with(Driver::AssumesExpired, &term, extension, &commands, true);
        });
    }

    #[test]
    fn loom_resign_races_an_extension_and_the_deadline() {
        for answer_first in [true, false] {
            loom::model(move || {
                let (term, commands) = term();
                let guard = term.guard();
                let user = thread::spawn(move || {
                    // `resign()` without its wait: nothing answers in a model.
                    let waiting = guard.begin_resign().is_some();
                    drop(guard);
                    waiting
                });
                let dog = {
                    let term = Arc::clone(&term);
                    thread::spawn(move || {
                        term.is_valid_at(AFTER);
                    })
                };
                let extension = term.extend(EXTENDED);
                let waiting = user.join().unwrap();
                dog.join().unwrap();
                let won = term.end_reason();
                assert_eq!(waiting, won == Some(EndReason::Resigned), "resign() waits for a release only if it won");
                check(&term, extension, &commands, answer_first);
            });
        }
    }

    #[test]
    fn loom_a_new_guard_taken_as_the_last_one_drops_and_an_extension_lands() {
        for answer_first in [true, false] {
            loom::model(move || {
                let (term, commands) = term();
                let guard = term.guard();
                let user = thread::spawn(move || drop(guard));
                let renewal = {
                    let term = Arc::clone(&term);
                    thread::spawn(move || term.extend(EXTENDED))
                };
                // `Elector::guard` / `wait_leader`: a guard of a term that
                // looks valid, under the elector's state lock (one taker here).
                let taken = if term.is_valid_at(BEFORE) { Some(term.guard()) } else { None };
                user.join().unwrap();
                match &taken {
                    // Taken before the drop: the term lives on in the new guard.
                    Some(g) if !term.is_ended() => assert!(g.is_valid_at_for_test(BEFORE)),
                    // Taken as the drop ended it: invalid from the start.
                    Some(g) => assert!(!g.is_valid_at_for_test(BEFORE)),
                    None => assert!(term.was_resigned()),
                }
                let extension = renewal.join().unwrap();
                drop(taken);
                assert_eq!(term.guards(), 0);
                assert!(term.was_resigned(), "the last guard to go resigns");
                check(&term, extension, &commands, answer_first);
            });
        }
    }
}
