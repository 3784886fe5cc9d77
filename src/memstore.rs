//! The in-memory reference store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use crate::batch::{BatchItem, Members};
use crate::lease::{DbTime, Lease};
use crate::slot::SlotClaim;
use crate::store::{ErrorKind, Released, Store, StoreError};

/// A member whose heartbeat expired this long ago is forgotten.
const FORGET_MEMBERS_AFTER: Duration = Duration::from_secs(3600);

/// An in-memory [`Store`]: the reference implementation of the store
/// contract, and a test double for programs that use this crate.
///
/// It elects among threads of one process, so it is no substitute for a real
/// database in production. Clones share the same records.
///
/// It keeps its own "database clock", which tests can put days away from the
/// local clock ([`MemStore::set_offset`]), step forward ([`MemStore::advance`])
/// or drive entirely by hand ([`MemStore::with_manual_clock`]). It can also
/// play an outage: [`MemStore::set_failing`] makes calls fail, and
/// [`MemStore::pause`] makes them hang until [`MemStore::resume`], like a
/// stopped server. And it can play an operator on its rows:
/// [`MemStore::delete_row`], [`MemStore::restore_row`] (with a copy taken by
/// [`MemStore::peek`]) and [`MemStore::clear`]; or a failover to a lagging
/// replica ([`MemStore::fail_over`]), which it survives with one leader.
///
/// # Examples
///
/// ```
/// use leaderelection::{MemStore, Store};
/// use std::time::Duration;
///
/// let store = MemStore::new();
/// let t = Duration::from_secs(1);
/// let lease = store.acquire("jobs", "a", Duration::from_secs(10), b"", t).unwrap();
/// assert!(lease.held_by("a"));
/// // Somebody else loses without an error and learns who leads, and under
/// // which fence.
/// let seen = store.acquire("jobs", "b", Duration::from_secs(10), b"", t).unwrap();
/// assert_eq!((seen.holder.as_str(), seen.fence), ("a", lease.fence));
/// // After a release the next claim is a new term with a higher fence.
/// store.release("jobs", "a", lease.fence, t).unwrap();
/// let next = store.acquire("jobs", "b", Duration::from_secs(10), b"", t).unwrap();
/// assert!(next.held_by("b") && next.fence > lease.fence);
/// ```
///
/// # Fences
///
/// A new term's fence is the larger of the previous fence + 1 and the
/// database clock in microseconds since the epoch (at least 1), so fences
/// keep growing when a row is deleted ([`MemStore::delete_row`]) or an older
/// copy of it comes back ([`MemStore::restore_row`]), as long as the
/// database clock has not been set back across the event.
#[derive(Clone, Default)]
pub struct MemStore {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    unpaused: Condvar,
}

#[derive(Default)]
struct State {
    rows: HashMap<String, Row>,
    /// Claimed slots by (election, slot): the claiming fence and outcome.
    slots: HashMap<(String, String), (u64, Option<i32>)>,
    clock: Clock,
    offset_micros: i64,
    paused: bool,
    failing: Option<ErrorKind>,
    stats: MemStats,
    /// The server history now answering: a failover
    /// ([`MemStore::fail_over`]) moves it on. Every write stamps its row
    /// with it.
    history: u64,
    /// The negative control of the failover rule: claim inherited rows at
    /// once ([`MemStore::set_claims_inherited_rows`]).
    claims_inherited: bool,
    /// Group members' heartbeats: group, member, expiry and the elections
    /// it reported leading, `None` for a member that left (a tombstone no
    /// heartbeat revives).
    members: HashMap<String, HashMap<String, (DbTime, Option<u32>)>>,
    /// Subscribers to the names of released elections ([`Store::releases`]).
    watchers: crate::feed::Subscribers,
}

#[derive(Clone)]
struct Row {
    holder: String,
    fence: u64,
    acquired_at: DbTime,
    renewed_at: DbTime,
    expires_at: DbTime,
    payload: Vec<u8>,
    /// The server history that last wrote the row.
    history: u64,
}

enum Clock {
    /// Wall time read once at creation, then moved by the monotonic clock.
    Real { origin: Instant, origin_micros: i64 },
    /// Moves only through `advance`.
    Manual { now_micros: i64 },
}

impl Default for Clock {
    fn default() -> Clock {
        let origin_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Clock::Real { origin: Instant::now(), origin_micros }
    }
}

/// How many calls of each kind a [`MemStore`] has answered, and how many
/// wrote to a row. Tests use it to show that followers do not write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    /// `acquire` calls answered.
    pub acquires: u64,
    /// `renew` calls answered.
    pub renews: u64,
    /// `release` calls answered.
    pub releases: u64,
    /// `inspect` calls answered.
    pub inspects: u64,
    /// Calls that changed a row (each item of a batch counts).
    pub writes: u64,
    /// Batched calls answered (`acquire_many` and the like); their items
    /// are counted above too, one per item.
    pub batches: u64,
    /// `heartbeat` calls answered.
    pub heartbeats: u64,
}

impl MemStore {
    /// A store whose database clock follows real time.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// A store whose database clock stands at `start` and moves only through
    /// [`MemStore::advance`]: for simulations on virtual time.
    pub fn with_manual_clock(start: DbTime) -> MemStore {
        let store = MemStore::default();
        store.shared.state.lock().clock = Clock::Manual { now_micros: start.as_unix_micros() };
        store
    }

    /// The database clock now.
    pub fn now(&self) -> DbTime {
        self.shared.state.lock().now()
    }

    /// Puts the database clock `offset` away from where it would be (negative
    /// offsets are behind). Moving it forward under a live lease retires that
    /// lease early, exactly as a real server whose clock jumps would.
    pub fn set_offset(&self, offset_micros: i64) {
        self.shared.state.lock().offset_micros = offset_micros;
    }

    /// Moves the database clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let mut st = self.shared.state.lock();
        match &mut st.clock {
            Clock::Manual { now_micros } => *now_micros = now_micros.saturating_add(micros),
            Clock::Real { .. } => st.offset_micros = st.offset_micros.saturating_add(micros),
        }
    }

    /// Makes every call fail with an error of `kind` (pass `None` to heal).
    /// Only [`ErrorKind::Retryable`] and [`ErrorKind::Fatal`] make sense.
    pub fn set_failing(&self, kind: Option<ErrorKind>) {
        self.shared.state.lock().failing = kind;
    }

    /// Makes every call block until [`MemStore::resume`], whatever its
    /// timeout: a server stopped with `SIGSTOP`.
    pub fn pause(&self) {
        self.shared.state.lock().paused = true;
    }

    /// Lets paused calls go on.
    pub fn resume(&self) {
        self.shared.state.lock().paused = false;
        self.shared.unpaused.notify_all();
    }

    /// Counts of the calls answered so far.
    pub fn stats(&self) -> MemStats {
        self.shared.state.lock().stats
    }

    /// The current row of election `name`, read without counting as a call.
    pub fn peek(&self, name: &str) -> Option<Lease> {
        let st = self.shared.state.lock();
        let now = st.now();
        st.rows.get(name).map(|row| row.to_lease(name, now))
    }

    /// Deletes election `name`'s row, as an operator's `DELETE` would; returns
    /// whether there was one. A test and fault-injection tool: it is not a
    /// store call and is not counted in [`MemStore::stats`].
    pub fn delete_row(&self, name: &str) -> bool {
        self.shared.state.lock().rows.remove(name).is_some()
    }

    /// Writes `row` back as the row of election `row.name`, over whatever is
    /// there (its `now` is ignored): an older copy of the row coming back, as
    /// after a failover to a replica that missed the last terms, or a restore
    /// from a backup. Take the copy with [`MemStore::peek`]. A test and
    /// fault-injection tool, not counted in [`MemStore::stats`].
    pub fn restore_row(&self, row: &Lease) {
        let mut st = self.shared.state.lock();
        let restored = Row {
            holder: row.holder.clone(),
            fence: row.fence,
            acquired_at: row.acquired_at,
            renewed_at: row.renewed_at,
            expires_at: row.expires_at,
            payload: row.payload.clone(),
            history: st.history,
        };
        st.rows.insert(row.name.clone(), restored);
    }

    /// Plays a failover to a replica: the server that answers from now on
    /// has a history of its own, and every row it holds was written under
    /// the one before, so it may lack writes the old server acknowledged.
    /// With `lagging`, the replica had only that older copy of its
    /// election's row (take it earlier with [`MemStore::peek`]). A test and
    /// fault-injection tool, not counted in [`MemStore::stats`].
    ///
    /// The store then keeps one leader all the same. A row inherited across
    /// a failover may lack the renewals its holder was told of, or even the
    /// claim of the term that leads now; so it is never claimed as it
    /// stands. The first `acquire` that finds one expired instead holds it
    /// for nobody (an unexpired one it leaves alone): the holder becomes empty (no identity is), the fence stays,
    /// and `expires_at` becomes at least the database clock plus a whole
    /// lease (the longer of the caller's and the row's own), under this
    /// history. Nobody can renew or release it, and it can be claimed only
    /// a lease after the first participant asked for it on the new server,
    /// by which time every deadline the old server's acknowledgements gave
    /// (each reckoned from a send before the failover) has passed. Until
    /// then, the holder it names may renew the inherited row, expired or
    /// not, and carry on; its release changes nothing (the row stays
    /// inherited). A row the replica never had (an election created
    /// moments before the failover) cannot be told from one that never
    /// existed, and is claimed at once.
    pub fn fail_over(&self, lagging: Option<&Lease>) {
        if let Some(row) = lagging {
            self.restore_row(row);
        }
        self.shared.state.lock().history += 1;
    }

    /// Whether election `name`'s row was last written under an earlier
    /// server history than the one answering now (before a
    /// [`MemStore::fail_over`], and not written since).
    pub fn is_inherited(&self, name: &str) -> bool {
        let st = self.shared.state.lock();
        st.rows.get(name).is_some_and(|r| r.history != st.history)
    }

    /// The negative control of the failover rule: with `on`, `acquire`
    /// claims an expired row inherited across a failover at once, as a
    /// store that does not know about failovers would. For the simulation's
    /// control; never use it otherwise.
    #[doc(hidden)]
    pub fn set_claims_inherited_rows(&self, on: bool) {
        self.shared.state.lock().claims_inherited = on;
    }

    /// Deletes every row, as dropping and re-creating the table would. A test
    /// and fault-injection tool, not counted in [`MemStore::stats`].
    pub fn clear(&self) {
        self.shared.state.lock().rows.clear();
    }

    /// Takes the lock, waits out a pause, applies the failure switch, then
    /// runs `f` on the state with the database time.
    fn call<T>(&self, f: impl FnOnce(&mut State, DbTime) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut st = self.shared.state.lock();
        while st.paused {
            self.shared.unpaused.wait(&mut st);
        }
        match st.failing {
            Some(ErrorKind::Fatal) => return Err(StoreError::fatal("memstore: failing on purpose (fatal)")),
            Some(_) => return Err(StoreError::retryable("memstore: failing on purpose (retryable)")),
            None => {}
        }
        let now = st.now();
        f(&mut st, now)
    }

    /// [`MemStore::call`] for a batch of `len` items: a failure of the
    /// whole call (the failure switch) fails every item.
    fn batch<T>(
        &self, len: usize, f: impl FnOnce(&mut State, DbTime) -> Vec<Result<T, StoreError>>,
    ) -> Vec<Result<T, StoreError>> {
        let out = self.call(|st, now| {
            st.stats.batches += 1;
            Ok(f(st, now))
        });
        out.unwrap_or_else(|e| crate::batch::all_failed(len, &e))
    }
}

impl State {
    fn now(&self) -> DbTime {
        let base = match self.clock {
            Clock::Real { origin, origin_micros } => {
                origin_micros.saturating_add(i64::try_from(origin.elapsed().as_micros()).unwrap_or(i64::MAX))
            }
            Clock::Manual { now_micros } => now_micros,
        };
        DbTime::from_unix_micros(base.saturating_add(self.offset_micros))
    }
}

impl Row {
    fn to_lease(&self, name: &str, now: DbTime) -> Lease {
        Lease {
            name: name.to_owned(),
            holder: self.holder.clone(),
            fence: self.fence,
            acquired_at: self.acquired_at,
            renewed_at: self.renewed_at,
            expires_at: self.expires_at,
            now,
            payload: self.payload.clone(),
        }
    }
}

impl State {
    /// [`Store::acquire`] of one row at `now`.
    fn acquire(&mut self, now: DbTime, name: &str, identity: &str, ttl: Duration, payload: &[u8]) -> Lease {
        self.stats.acquires += 1;
        let expires_at = now.saturating_add(ttl);
        // A new term's fence: above the previous one and at least the
        // clock in microseconds, so it survives a deleted or restored row.
        let clock_fence = u64::try_from(now.as_unix_micros()).unwrap_or(0).max(1);
        let history = self.history;
        let fresh = |fence| Row {
            holder: identity.to_owned(),
            fence,
            acquired_at: now,
            renewed_at: now,
            expires_at,
            payload: payload.to_vec(),
            history,
        };
        let claims_inherited = self.claims_inherited;
        let row = match self.rows.get_mut(name) {
            None => {
                self.stats.writes += 1;
                self.rows.entry(name.to_owned()).or_insert(fresh(clock_fence))
            }
            // Inherited across a failover: before it expires, left for
            // its holder to renew (its own acquire, the one of a process
            // that no longer leads under that fence, must not make it a
            // row of this history); once expired, held for nobody for a
            // lease, not claimed (MemStore::fail_over).
            Some(row) if row.history != history && !claims_inherited => {
                if row.expires_at <= now {
                    self.stats.writes += 1;
                    let own = row.expires_at.saturating_duration_since(row.renewed_at);
                    row.expires_at = row.expires_at.max(now.saturating_add(ttl.max(own)));
                    row.renewed_at = row.renewed_at.max(now);
                    row.holder.clear();
                    row.history = history;
                }
                row
            }
            Some(row) if row.expires_at <= now => {
                self.stats.writes += 1;
                *row = fresh(row.fence.saturating_add(1).max(clock_fence));
                row
            }
            // The holder's own lease, unless the row was written after
            // this call's clock reading (a release it must not undo).
            Some(row) if row.holder == identity && row.renewed_at <= now => {
                self.stats.writes += 1;
                row.renewed_at = now;
                row.expires_at = row.expires_at.max(expires_at);
                row.payload = payload.to_vec();
                row.history = history;
                row
            }
            Some(row) => row,
        };
        row.to_lease(name, now)
    }

    /// [`Store::renew`] of one row at `now`.
    fn renew(
        &mut self, now: DbTime, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8],
    ) -> Result<Lease, StoreError> {
        self.stats.renews += 1;
        let history = self.history;
        match self.rows.get_mut(name) {
            // An inherited row may have lost renewals the holder was
            // told of: it renews it, expired or not (nobody else can
            // have claimed it; see MemStore::fail_over).
            Some(row)
                if row.holder == identity
                    && row.fence == fence
                    && (row.expires_at > now || row.history != history)
                    && row.renewed_at <= now =>
            {
                self.stats.writes += 1;
                row.history = history;
                row.renewed_at = now;
                // Never backwards: a renewal computed from an older
                // clock reading must not shorten a newer one's lease.
                row.expires_at = row.expires_at.max(now.saturating_add(ttl));
                row.payload = payload.to_vec();
                Ok(row.to_lease(name, now))
            }
            _ => Err(StoreError::lease_lost()),
        }
    }

    /// [`Store::release`] of one row at `now`.
    fn release(&mut self, now: DbTime, name: &str, identity: &str, fence: u64) {
        self.stats.releases += 1;
        let history = self.history;
        if let Some(row) = self.rows.get_mut(name) {
            // Not an inherited row: its release may be one of the
            // writes the replica lacks, and cutting it short would undo
            // the hold a claim of it starts (MemStore::fail_over).
            if row.holder == identity && row.fence == fence && row.expires_at > now && row.history == history {
                self.stats.writes += 1;
                row.expires_at = now;
                // A renewal whose clock reading is older than this must
                // not land after it (Store::renew).
                row.renewed_at = row.renewed_at.max(now);
                self.watchers.send(name, Some(fence));
            }
        }
    }

    /// [`Store::inspect`] of one row at `now`.
    fn inspect(&mut self, now: DbTime, name: &str) -> Result<Lease, StoreError> {
        self.stats.inspects += 1;
        self.rows.get(name).map(|row| row.to_lease(name, now)).ok_or_else(|| StoreError::no_lease(name))
    }
}

impl Store for MemStore {
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], _timeout: Duration,
    ) -> Result<Lease, StoreError> {
        self.call(|st, now| Ok(st.acquire(now, name, identity, ttl, payload)))
    }

    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], _timeout: Duration,
    ) -> Result<Lease, StoreError> {
        self.call(|st, now| st.renew(now, name, identity, fence, ttl, payload))
    }

    fn release(&self, name: &str, identity: &str, fence: u64, _timeout: Duration) -> Result<(), StoreError> {
        self.call(|st, now| {
            st.release(now, name, identity, fence);
            Ok(())
        })
    }

    fn inspect(&self, name: &str, _timeout: Duration) -> Result<Lease, StoreError> {
        self.call(|st, now| st.inspect(now, name))
    }

    // Each batch is one call: one lock, one clock reading for every item
    // (as one statement reads `now()` once), each row decided on its own.

    fn acquire_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], _timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.batch(items.len(), |st, now| {
            items.iter().map(|i| Ok(st.acquire(now, i.name, identity, ttl, i.payload))).collect()
        })
    }

    fn renew_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], _timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.batch(items.len(), |st, now| {
            items.iter().map(|i| st.renew(now, i.name, identity, i.fence, ttl, i.payload)).collect()
        })
    }

    fn release_many(&self, identity: &str, items: &[BatchItem<'_>], _timeout: Duration) -> Vec<Result<(), StoreError>> {
        self.batch(items.len(), |st, now| {
            items
                .iter()
                .map(|i| {
                    st.release(now, i.name, identity, i.fence);
                    Ok(())
                })
                .collect()
        })
    }

    fn inspect_many(&self, names: &[&str], _timeout: Duration) -> Vec<Result<Lease, StoreError>> {
        self.batch(names.len(), |st, now| names.iter().map(|n| st.inspect(now, n)).collect())
    }

    /// Every release that ends a live term sends its election's name,
    /// whatever the caller (one channel of 1,024 names per subscriber).
    fn releases(&self) -> Option<crossbeam_channel::Receiver<Released>> {
        Some(self.shared.state.lock().watchers.subscribe())
    }

    fn heartbeat(
        &self, group: &str, member: &str, leading: u32, ttl: Duration, _timeout: Duration,
    ) -> Result<Members, StoreError> {
        self.call(|st, now| {
            st.stats.heartbeats += 1;
            let rows = st.members.entry(group.to_owned()).or_default();
            // Rows of members that stopped long ago go, as a database
            // store may delete them; an expired row is never counted.
            rows.retain(|_, (expires, _)| now.saturating_duration_since(*expires) < FORGET_MEMBERS_AFTER);
            let row = rows.entry(member.to_owned()).or_insert((now, Some(0)));
            // A heartbeat that comes after its member's leave does not
            // count it in again.
            if row.1.is_some() {
                *row = (row.0.max(now.saturating_add(ttl)), Some(leading));
            }
            let live: Vec<(&String, u32)> =
                rows.iter().filter_map(|(m, r)| r.1.filter(|_| r.0 > now).map(|n| (m, n))).collect();
            // Names compare byte by byte, as `str` orders them.
            let rank = live.iter().filter(|(m, _)| m.as_str() < member).count();
            let led = live.iter().map(|(_, n)| u64::from(*n)).sum();
            let most = live.iter().map(|(_, n)| *n).max().unwrap_or(0);
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            Ok(Members::new(count(live.len()), now).with_rank(count(rank)).with_leading(led, most))
        })
    }

    fn leave_group(&self, group: &str, member: &str, _timeout: Duration) -> Result<(), StoreError> {
        self.call(|st, now| {
            // A tombstone, expired at once, forgotten with the others.
            let rows = st.members.entry(group.to_owned()).or_default();
            let row = rows.entry(member.to_owned()).or_insert((now, None));
            *row = (row.0.min(now), None);
            Ok(())
        })
    }

    fn claim_slot(
        &self, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, _timeout: Duration,
    ) -> Result<SlotClaim, StoreError> {
        crate::slot::check(slot)?;
        self.call(|st, now| {
            let held = st
                .rows
                .get(name)
                .is_some_and(|r| r.holder == identity && r.fence == fence && r.expires_at > now && r.renewed_at <= now);
            if !held {
                return Err(StoreError::lease_lost());
            }
            let key = (name.to_owned(), slot.to_owned());
            match st.slots.get(&key).copied() {
                Some((f, outcome)) if !(retry_failed && f < fence && outcome != Some(0)) => {
                    Ok(SlotClaim::Taken { fence: f, outcome })
                }
                _ => {
                    st.stats.writes += 1;
                    st.slots.insert(key, (fence, None));
                    Ok(SlotClaim::Claimed)
                }
            }
        })
    }

    fn finish_slot(
        &self, name: &str, fence: u64, slot: &str, outcome: i32, _timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.call(|st, _now| match st.slots.get_mut(&(name.to_owned(), slot.to_owned())) {
            Some(row) if row.0 == fence => {
                st.stats.writes += 1;
                row.1 = Some(outcome);
                Ok(true)
            }
            _ => Ok(false),
        })
    }
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("MemStore").field("elections", &st.rows.len()).field("stats", &st.stats).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);
    const TTL: Duration = Duration::from_secs(10);

    fn store() -> MemStore {
        // Three days after an arbitrary base: nowhere near the local clock.
        MemStore::with_manual_clock(DbTime::from_unix_micros(1_700_000_000_000_000 + 3 * 86_400_000_000))
    }

    /// A failover to a replica that missed the holder's last renewals: the
    /// row there has expired, but the holder was told it runs until later.
    /// A follower's claim holds it for nobody instead of taking it, and can
    /// claim only a whole lease after that; before anybody asked, the
    /// holder renews the inherited row and carries on. Negative control: a store that claims
    /// inherited rows at once hands out a second term inside the holder's
    /// acknowledged lease.
    #[test]
    fn a_row_inherited_across_a_failover_is_re_armed_not_claimed() {
        for claims_inherited in [false, true] {
            let s = store();
            s.set_claims_inherited_rows(claims_inherited);
            let a = s.acquire("e", "a", TTL, b"", T).unwrap();
            let lagging = s.peek("e").unwrap();
            s.advance(Duration::from_secs(8));
            // Acknowledged by the old server: valid until 18 s from the start.
            let told = s.renew("e", "a", a.fence, TTL, b"", T).unwrap();
            s.fail_over(Some(&lagging));
            assert!(s.is_inherited("e"));
            s.advance(Duration::from_secs(3)); // 11 s: expired on the replica's copy
            let b = s.acquire("e", "b", TTL, b"", T).unwrap();
            if claims_inherited {
                assert!(b.held_by("b") && told.expires_at > b.now, "the control should claim inside the told lease");
                continue;
            }
            assert!(b.holder.is_empty() && b.fence == a.fence, "an inherited row was claimed: {b:?}");
            assert_eq!(b.expires_at, b.now.saturating_add(TTL), "held for a whole lease");
            assert!(b.expires_at > told.expires_at && !s.is_inherited("e"));
            // Nobody renews or releases the held row, not its old holder.
            assert!(s.renew("e", "a", a.fence, TTL, b"", T).is_err());
            s.release("e", "a", a.fence, T).unwrap();
            s.advance(TTL - Duration::from_micros(1));
            let early = s.acquire("e", "b", TTL, b"", T).unwrap();
            assert!(early.holder.is_empty() && !early.expired(), "claimed before the held lease ran out: {early:?}");
            s.advance(Duration::from_micros(1));
            assert!(s.acquire("e", "b", TTL, b"", T).unwrap().held_by("b"));
        }
        // The holder renews its inherited row although it expired there.
        let s = store();
        let a = s.acquire("e", "a", TTL, b"", T).unwrap();
        let lagging = s.peek("e").unwrap();
        s.advance(Duration::from_secs(8));
        s.renew("e", "a", a.fence, TTL, b"", T).unwrap();
        s.fail_over(Some(&lagging));
        s.advance(Duration::from_secs(3));
        let renewed = s.renew("e", "a", a.fence, TTL, b"", T).expect("the holder renews an inherited row");
        assert_eq!(renewed.expires_at, renewed.now.saturating_add(TTL));
        assert!(!s.is_inherited("e"));
        s.advance(TTL);
        assert!(s.renew("e", "a", a.fence, TTL, b"", T).is_err(), "a row of this history expires as before");
        // A release of an inherited row changes nothing: the lost writes
        // may hold a claim that leads now.
        let a = s.acquire("e", "a", TTL, b"", T).unwrap();
        s.fail_over(None);
        s.release("e", "a", a.fence, T).unwrap();
        assert!(s.is_inherited("e") && !s.peek("e").unwrap().expired(), "the release of an inherited row applied");
    }

    #[test]
    fn fence_grows_only_when_an_absent_or_expired_lease_is_claimed() {
        let s = store();
        let f1 = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        assert_eq!(f1, s.now().as_unix_micros() as u64, "a first claim's fence is the clock in microseconds");
        assert_eq!(s.acquire("e", "a", TTL, b"", T).unwrap().fence, f1, "holder re-acquiring keeps its term");
        assert_eq!(s.renew("e", "a", f1, TTL, b"", T).unwrap().fence, f1);
        s.advance(TTL);
        let f2 = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        assert!(f2 > f1, "reclaiming its own expired lease is a new term: {f1} -> {f2}");
        s.release("e", "a", f2, T).unwrap();
        // The clock did not move: the next fence is the previous one + 1.
        let l = s.acquire("e", "b", TTL, b"", T).unwrap();
        assert!(l.held_by("b"));
        assert_eq!(l.fence, f2 + 1);
    }

    #[test]
    fn fences_keep_growing_across_a_deleted_or_restored_row() {
        let s = store();
        let f1 = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        s.release("e", "a", f1, T).unwrap();
        let term1 = s.peek("e").unwrap();
        s.advance(Duration::from_millis(1));
        let f2 = s.acquire("e", "b", TTL, b"", T).unwrap().fence;
        s.release("e", "b", f2, T).unwrap();
        s.advance(Duration::from_millis(1));
        assert!(s.delete_row("e") && !s.delete_row("e"));
        s.advance(Duration::from_micros(1));
        let f3 = s.acquire("e", "c", TTL, b"", T).unwrap().fence;
        assert!(f3 > f2, "after a delete: {f2} -> {f3}");
        s.release("e", "c", f3, T).unwrap();
        s.restore_row(&term1);
        assert_eq!(s.peek("e").unwrap().fence, f1);
        s.advance(Duration::from_micros(1));
        let f4 = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        assert!(f4 > f3, "after the term-1 row came back: {f3} -> {f4}");
        s.clear();
        assert!(s.peek("e").is_none());
        s.advance(Duration::from_micros(1));
        let f5 = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        assert!(f5 > f4, "after the table was emptied: {f4} -> {f5}");
        assert_eq!(s.stats().writes, 8, "the operator's hands are not store calls");
    }

    #[test]
    fn a_clock_set_back_across_a_delete_can_repeat_a_fence() {
        // What the fence rule cannot survive, shown so the docs stay honest.
        let s = store();
        let f1 = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        s.release("e", "a", f1, T).unwrap();
        s.delete_row("e");
        s.set_offset(-1);
        let again = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        assert!(again < f1, "{f1} -> {again}");
    }

    #[test]
    fn an_older_renewal_landing_after_a_newer_one_changes_nothing() {
        let s = store();
        let f = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        // Renewal B is sent second but commits first, at a later clock reading.
        s.advance(Duration::from_secs(2));
        let newer = s.renew("e", "a", f, TTL, b"new", T).unwrap();
        // Renewal A commits after it with the older reading it was given:
        // the row was written after that reading, so A changes nothing.
        s.set_offset(-1_000_000);
        assert!(s.renew("e", "a", f, TTL, b"old", T).unwrap_err().is_lease_lost());
        s.set_offset(0);
        assert_eq!(s.peek("e").map(|l| (l.expires_at, l.payload)), Some((newer.expires_at, b"new".to_vec())));
        // The holder's acquire with a shorter TTL does not shorten it.
        let again = s.acquire("e", "a", Duration::from_secs(1), b"", T).unwrap();
        assert_eq!((again.fence, again.expires_at), (f, newer.expires_at));
    }

    #[test]
    fn a_renewal_or_reacquire_older_than_a_release_cannot_extend_it() {
        let s = store();
        let f = s.acquire("e", "a", TTL, b"", T).unwrap().fence;
        s.advance(Duration::from_secs(1));
        s.release("e", "a", f, T).unwrap();
        let released = s.peek("e").unwrap();
        assert!(released.expired() && released.renewed_at == released.expires_at, "{released:?}");
        // A renewal and an acquire that read the clock before the release
        // (they waited behind its lock) land after it.
        s.set_offset(-500_000);
        assert!(s.renew("e", "a", f, TTL, b"", T).unwrap_err().is_lease_lost());
        let seen = s.acquire("e", "a", TTL, b"", T).unwrap();
        assert_eq!(seen.expires_at, released.expires_at, "the stale re-acquire extended the released lease");
        s.set_offset(0);
        assert_eq!(s.peek("e").unwrap(), released);
    }

    /// Only a release that ends a live term is sent, with its fence: not
    /// a claim or a renewal, not someone else's release, not a second one.
    #[test]
    fn a_release_that_ends_a_term_is_sent_once_with_its_fence() {
        let s = store();
        let rx = s.releases().expect("MemStore keeps a feed");
        let l = s.acquire("e", "a", TTL, b"p", T).unwrap();
        s.renew("e", "a", l.fence, TTL, b"p", T).unwrap();
        s.release("e", "b", l.fence, T).unwrap();
        s.release("e", "a", l.fence, T).unwrap();
        s.release("e", "a", l.fence, T).unwrap();
        let sent: Vec<Released> = rx.try_iter().collect();
        assert_eq!(sent, [Released { name: "e".into(), fence: Some(l.fence) }]);
    }

    #[test]
    fn release_of_someone_elses_lease_changes_nothing() {
        let s = store();
        let before = s.acquire("e", "a", TTL, b"p", T).unwrap();
        s.release("e", "b", before.fence, T).unwrap();
        s.release("e", "a", before.fence + 1, T).unwrap();
        assert_eq!(s.peek("e").unwrap(), before);
        assert_eq!(s.stats().writes, 1);
    }

    #[test]
    fn inspect_never_writes_and_reports_missing_rows() {
        let s = store();
        assert!(s.inspect("e", T).unwrap_err().is_no_lease());
        s.acquire("e", "a", TTL, b"addr", T).unwrap();
        let l = s.inspect("e", T).unwrap();
        assert_eq!(l.payload, b"addr");
        assert_eq!(s.stats().writes, 1);
    }

    #[test]
    fn ttl_comes_from_the_store_clock_only() {
        let s = store();
        s.set_offset(-5 * 86_400_000_000);
        let l = s.acquire("e", "a", TTL, b"", T).unwrap();
        assert_eq!(l.ttl(), TTL);
        s.advance(Duration::from_secs(4));
        assert_eq!(s.inspect("e", T).unwrap().ttl(), Duration::from_secs(6));
    }

    #[test]
    fn failing_switch_gives_typed_errors() {
        let s = store();
        s.set_failing(Some(ErrorKind::Fatal));
        assert!(s.inspect("e", T).unwrap_err().is_fatal());
        s.set_failing(Some(ErrorKind::Retryable));
        assert!(s.acquire("e", "a", TTL, b"", T).unwrap_err().is_retryable());
        s.set_failing(None);
        assert!(s.acquire("e", "a", TTL, b"", T).is_ok());
    }
}
