//! The contract between the elector and a database: four operations, each
//! one statement that also returns the server's current time.

use std::sync::Arc;
use std::time::Duration;

use crate::batch::{one_by_one, BatchItem, Heartbeat, Members};
pub use crate::error::{ErrorKind, StoreError};
use crate::lease::Lease;
use crate::slot::SlotClaim;

/// A release seen by a store's feed ([`Store::releases`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// The election's name.
    pub name: String,
    /// The fence of the term released, when the store knows it. A follower
    /// that has already seen a later term ignores the hint
    /// ([`Machine::handle_wake`](crate::machine::Machine::handle_wake)); with
    /// `None` every follower that may claim does.
    pub fence: Option<u64>,
}

/// Where an election's lease lives.
///
/// Each method is one statement (or one short transaction) that reads every
/// instant it returns, including [`Lease::now`], from the database server.
/// Implementations hold no session state (no advisory locks, no
/// `LISTEN`/`NOTIFY`, no temporary tables, no `SET`, no named prepared
/// statements), so they keep working behind a transaction-mode pooler. The
/// one exception is optional and outside the calls: [`Store::releases`],
/// a feed of releases that a store may keep on a connection of its own.
///
/// # Blocking
///
/// Every method blocks the calling thread for one round trip to the database.
/// `timeout` is how long the caller will wait: the elector runs each call on a
/// worker thread and treats a call that has not answered by then as failed
/// with an unknown outcome, whatever the store does. A store should give up by
/// then too (close the connection, free what the call holds) so abandoned
/// calls do not pile up; a store that cannot interrupt a call may keep
/// blocking, and the elector bounds how many such calls it leaves behind.
///
/// Every method must be safe to call from several threads at once.
///
/// # Failovers
///
/// A store whose database can fail over to a replica that lacks writes the
/// old server acknowledged (asynchronous replication) must keep one leader
/// across it, as the built-in stores and [`MemStore`](crate::MemStore) do:
/// every write records which server history wrote the row (PostgreSQL's
/// timeline, MySQL's `server_id`), and a row *inherited* from another
/// history is never claimed as it stands. `acquire` leaves an unexpired
/// one alone and, once it has expired, holds it for nobody (empty holder,
/// same fence, expiry a whole lease after the call's `now`) instead of
/// claiming it; `renew` applies to an inherited row of the holder's
/// whether or not it has expired; `release` leaves an inherited row alone.
/// A leader can only have been told of a deadline reckoned from a send
/// before the failover, at most a lease long, so a lease after the first
/// claim attempt on the new server no such deadline is left.
pub trait Store: Send + Sync {
    /// Claims the lease for `identity` if the row is absent or expired (a new
    /// term), or already held by `identity` and still valid (same fence, new
    /// expiry) and not written after this call's `now` (see
    /// [`Store::renew`]). Otherwise leaves the row untouched. In every case
    /// returns the row as it stands after the statement, with the server's
    /// `now`.
    ///
    /// Losing the race is not an error: check [`Lease::held_by`].
    ///
    /// A new term's fence must be higher than every fence the election has
    /// had, also after its row was deleted, its table re-created, or an older
    /// copy of the row came back with a failover, as long as the server clock
    /// did not go back across the event. The built-in stores compute it in
    /// the claiming statement as `max(previous fence + 1, now in microseconds
    /// since the epoch)`, and 1 at least. A new term's expiry is the server's
    /// `now + ttl`; the holder re-acquiring writes the later of the current
    /// expiry and `now + ttl`, never an earlier one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`]; the outcome is then
    /// unknown (the claim may have landed).
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError>;

    /// Extends the lease that `identity` holds under `fence` to the later of
    /// its current expiry and the server's `now + ttl`, and replaces the
    /// payload. Applies only while the row has that holder and fence, has
    /// not expired on the server's clock, and was last written no later than
    /// this call's `now` (`renewed_at <= now < expires_at`). Never moving the
    /// expiry back matters: a renewal the server delayed (behind a row lock,
    /// or frozen with the server) can commit after a newer one with an older
    /// `now`, and must not shorten the lease under the newer one's deadline.
    /// And a renewal whose `now` was read before the holder's release (it
    /// waited behind the release's lock) must not extend the released lease:
    /// the release stamps `renewed_at` (see [`Store::release`]), so such a
    /// renewal finds the row written after its `now` and changes nothing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`] when no row matched the guard: the caller no
    /// longer leads. [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`] when the
    /// outcome is unknown.
    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError>;

    /// Ends the term `identity` holds under `fence` by setting its expiry to
    /// the server's `now`, and `renewed_at` to the later of itself and that
    /// `now`. The row and its fence stay, so the next claim gets a higher
    /// fence. Releasing a lease the caller does not hold changes nothing and
    /// is not an error.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`] when the outcome is
    /// unknown.
    fn release(&self, name: &str, identity: &str, fence: u64, timeout: Duration) -> Result<(), StoreError>;

    /// Reads the row without writing anything. Followers poll with it, so a
    /// fleet of followers generates no writes.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NoLease`] when the election has no row yet;
    /// [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`] on failure.
    fn inspect(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError>;

    /// Claims `slot` of election `name` for the term `identity` holds under
    /// `fence` (see [`crate::slot`]), in one statement or short transaction
    /// that also checks the term: the row must have that holder and fence
    /// and be valid on the server's clock, else [`ErrorKind::LeaseLost`] and
    /// nothing is recorded.
    ///
    /// A slot no term has claimed is recorded with this fence:
    /// [`SlotClaim::Claimed`]. A slot claimed before stays with its term:
    /// [`SlotClaim::Taken`] with that term's fence and recorded outcome,
    /// unless `retry_failed` is set, the earlier term's fence is lower, and
    /// its run did not record success (outcome 0); then this term takes the
    /// slot over (outcome cleared): `Claimed`. Claims of one slot are
    /// serialised by the database, so a slot is claimed once, or once more
    /// per retry of a run that did not succeed.
    ///
    /// The default refuses, with a fatal error: a store that keeps no slots.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`] as above; [`ErrorKind::Retryable`] or
    /// [`ErrorKind::Fatal`] when the outcome is unknown (the claim may have
    /// landed).
    fn claim_slot(
        &self, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, timeout: Duration,
    ) -> Result<SlotClaim, StoreError> {
        let _ = (name, identity, fence, slot, retry_failed, timeout);
        Err(StoreError::fatal("this store keeps no slots (it does not implement Store::claim_slot)"))
    }

    /// Records `outcome` (0 for success) for the run of `slot` that the
    /// term with `fence` claimed; returns whether the slot was still that
    /// term's (false when a later term took it over, or it was never
    /// claimed). Needs no valid lease: a run records how it ended even
    /// after its term did.
    ///
    /// The default refuses, with a fatal error, as [`Store::claim_slot`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`]; the outcome may
    /// then be recorded or not.
    fn finish_slot(
        &self, name: &str, fence: u64, slot: &str, outcome: i32, timeout: Duration,
    ) -> Result<bool, StoreError> {
        let _ = (name, fence, slot, outcome, timeout);
        Err(StoreError::fatal("this store keeps no slots (it does not implement Store::finish_slot)"))
    }

    /// Claims several elections for `identity` in one call (see
    /// [`crate::batch`]): for each item, exactly what [`Store::acquire`]
    /// does with `ttl` and the item's payload, decided by that election's
    /// own row on the database's clock. Returns one answer per item, in
    /// order.
    ///
    /// A store may skip an item whose row another transaction holds locked
    /// (a lease check in a program's open transaction holds a claim off
    /// until it ends): that item's answer is then a retryable error, and
    /// the rest of the batch does not wait for it.
    ///
    /// The default calls [`Store::acquire`] once per item within `timeout`.
    ///
    /// # Errors
    ///
    /// Per item, as [`Store::acquire`]. When the batch fails as a whole
    /// (its statement, its connection, its timeout), every item carries
    /// the error, and every claim's outcome is unknown.
    fn acquire_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        one_by_one(items, timeout, |i, t| self.acquire(i.name, identity, ttl, i.payload, t))
    }

    /// Renews several terms of `identity` in one call: for each item,
    /// exactly what [`Store::renew`] does with the item's fence, `ttl` and
    /// payload, decided by that election's own row on the database's clock
    /// (an item whose guard no longer matches is [`ErrorKind::LeaseLost`],
    /// whatever the others do). One answer per item, in order.
    ///
    /// The default calls [`Store::renew`] once per item within `timeout`.
    ///
    /// # Errors
    ///
    /// Per item, as [`Store::renew`]. When the batch fails as a whole,
    /// every item carries the error: a batch that timed out counts against
    /// every lease in it.
    fn renew_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        one_by_one(items, timeout, |i, t| self.renew(i.name, identity, i.fence, ttl, i.payload, t))
    }

    /// [`Store::renew_many`] and [`Store::heartbeat`] of member `identity`
    /// in one call: a group with a fair share and many terms renews them
    /// in two batches per renew interval, and sends its heartbeat with one
    /// of them rather than as a call of its own. Each part is decided and
    /// answered as the separate call would be; the heartbeat's answer
    /// ([`Members::now`] in particular) should be read early in the call,
    /// as the group takes it to fall halfway through.
    ///
    /// The default runs the two at once, the heartbeat on a scoped thread,
    /// each within the whole `timeout`: a slow heartbeat never shortens
    /// the renewals' time.
    ///
    /// # Errors
    ///
    /// Per item and for the heartbeat, as the separate calls.
    fn renew_many_with_heartbeat(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, timeout: Duration,
    ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
        renew_with_heartbeat(self, identity, ttl, items, beat, timeout)
    }

    /// Releases several terms of `identity` in one call: for each item,
    /// what [`Store::release`] does with the item's fence. One answer per
    /// item, in order.
    ///
    /// The default calls [`Store::release`] once per item within `timeout`.
    ///
    /// # Errors
    ///
    /// Per item, as [`Store::release`]; a batch that fails as a whole fails
    /// every item.
    fn release_many(&self, identity: &str, items: &[BatchItem<'_>], timeout: Duration) -> Vec<Result<(), StoreError>> {
        one_by_one(items, timeout, |i, t| self.release(i.name, identity, i.fence, t))
    }

    /// Reads several elections' rows in one call, writing nothing: for each
    /// name, what [`Store::inspect`] returns. One answer per name, in
    /// order.
    ///
    /// The default calls [`Store::inspect`] once per name within `timeout`.
    ///
    /// # Errors
    ///
    /// Per name, as [`Store::inspect`] ([`ErrorKind::NoLease`] for an
    /// election without a row); a batch that fails as a whole fails every
    /// name.
    fn inspect_many(&self, names: &[&str], timeout: Duration) -> Vec<Result<Lease, StoreError>> {
        one_by_one(names, timeout, |n, t| self.inspect(n, t))
    }

    /// Records that `member` of `group` is alive until `ttl` after the
    /// database's `now` and leads `leading` elections, and counts the
    /// group's members alive at that `now` (this one included), in one
    /// statement or short transaction. A group with
    /// a fair share ([`GroupConfig::fair_share`](crate::GroupConfig::fair_share))
    /// sends one every renew interval and leads at most its share of the
    /// elections by the count. A store that can should also answer the
    /// member's rank ([`Members::with_rank`]: the live members whose names
    /// come before `member` byte by byte), by which members spread their
    /// renewals over the interval, and what the live members lead
    /// ([`Members::with_leading`]: the sum and the most of their last
    /// reports), by which they look at others' leases lazily while every
    /// election is led.
    ///
    /// A store may also delete the group's rows that expired long ago
    /// (members that crashed); it must never count an expired row.
    ///
    /// The default refuses, with a fatal error: a store that keeps no
    /// members. Groups without a fair share never call it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`].
    fn heartbeat(
        &self, group: &str, member: &str, leading: u32, ttl: Duration, timeout: Duration,
    ) -> Result<Members, StoreError> {
        let _ = (group, member, leading, ttl, timeout);
        Err(StoreError::fatal("this store keeps no group members (it does not implement Store::heartbeat)"))
    }

    /// A feed of the elections whose lease was just released in this
    /// store's table ([`Released`]: the name, and the released term's fence
    /// when the store knows it), so that a waiting follower claims at once
    /// instead of at its next poll ([`Machine::handle_wake`](crate::machine::Machine::handle_wake)).
    /// Each call subscribes anew; dropping the receiver unsubscribes.
    ///
    /// The feed is a hint and nothing rests on it: a name may come late,
    /// twice, or never (a connection lost, a full channel), and the claim it
    /// prompts is the usual conditional [`Store::acquire`]. Followers keep
    /// polling, so a lost hint costs what the poll costs. A store must send
    /// names only for releases, never for renewals, so that a live leader
    /// wakes nobody.
    ///
    /// The default, `None`, is a store that cannot tell; followers then
    /// learn of a release at their next poll. [`MemStore`](crate::MemStore)
    /// feeds its own releases; `PostgresStore` (feature `postgres`) listens
    /// on a connection of its own (see its `release_feed` for poolers);
    /// `MySqlStore` (feature `mysql`) waits for the leader's named lock (see
    /// its `release_feed`).
    fn releases(&self) -> Option<crossbeam_channel::Receiver<Released>> {
        None
    }

    /// Removes `member` from `group`, so the others count it out at once
    /// rather than when its heartbeat expires, for good: a heartbeat of
    /// `member` that reaches the store after the leave (sent before it,
    /// and slower) must not count it in again. The built-in stores leave a
    /// tombstone that heartbeats do not revive, deleted with the rows of
    /// members gone for an hour; a member name is never used again after
    /// its leave (each group run has an identity of its own).
    ///
    /// The default refuses, with a fatal error, as [`Store::heartbeat`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Retryable`] or [`ErrorKind::Fatal`].
    fn leave_group(&self, group: &str, member: &str, timeout: Duration) -> Result<(), StoreError> {
        let _ = (group, member, timeout);
        Err(StoreError::fatal("this store keeps no group members (it does not implement Store::leave_group)"))
    }
}

/// The default of [`Store::renew_many_with_heartbeat`]: the heartbeat and
/// the renewals at once, each within the whole `timeout` (the heartbeat on
/// a scoped thread of its own), so a slow heartbeat never eats the time of
/// the renewals that keep the terms alive. A store that sends the two
/// together falls back on it when the two cannot go together.
pub(crate) fn renew_with_heartbeat<S: Store + ?Sized>(
    store: &S, identity: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, timeout: Duration,
) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
    // Without a thread (spawning failed), the renewals first, then the
    // heartbeat in what is left.
    let heartbeat = |t| store.heartbeat(beat.group, identity, beat.leading, beat.ttl, t);
    std::thread::scope(|scope| {
        let beating = std::thread::Builder::new()
            .name("leaderelection-heartbeat".into())
            .spawn_scoped(scope, || heartbeat(timeout));
        let start = std::time::Instant::now();
        let renewed = store.renew_many(identity, ttl, items, timeout);
        let members = match beating {
            Ok(h) => h.join().unwrap_or_else(|_| Err(StoreError::fatal("the store's heartbeat panicked"))),
            Err(_) => heartbeat(timeout.saturating_sub(start.elapsed())),
        };
        (renewed, members)
    })
}

/// Implements [`Store`] for `$ty` by handing every call to the store
/// inside: `$via!(self, s => s.call(..))` runs the call with `s` bound
/// to it. One definition serves the smart pointers below and
/// [`AnyStore`](crate::AnyStore), which picks its store at run time.
macro_rules! forward_store {
    ([$($generics:tt)*] $ty:ty, $via:ident) => {
        // In a block of its own so the names below are in scope wherever
        // the macro is used.
        const _: () = {
            use ::std::time::Duration;
            use $crate::{BatchItem, Heartbeat, Lease, Members, Released, SlotClaim, Store, StoreError};
            impl<$($generics)*> Store for $ty {
                fn acquire(
                    &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
                ) -> Result<Lease, StoreError> {
                    $via!(self, s => s.acquire(name, identity, ttl, payload, timeout))
                }
                fn renew(
                    &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
                ) -> Result<Lease, StoreError> {
                    $via!(self, s => s.renew(name, identity, fence, ttl, payload, timeout))
                }
                fn release(&self, name: &str, identity: &str, fence: u64, timeout: Duration) -> Result<(), StoreError> {
                    $via!(self, s => s.release(name, identity, fence, timeout))
                }
                fn inspect(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError> {
                    $via!(self, s => s.inspect(name, timeout))
                }
                fn claim_slot(
                    &self, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, timeout: Duration,
                ) -> Result<SlotClaim, StoreError> {
                    $via!(self, s => s.claim_slot(name, identity, fence, slot, retry_failed, timeout))
                }
                fn finish_slot(
                    &self, name: &str, fence: u64, slot: &str, outcome: i32, timeout: Duration,
                ) -> Result<bool, StoreError> {
                    $via!(self, s => s.finish_slot(name, fence, slot, outcome, timeout))
                }
                fn acquire_many(
                    &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
                ) -> Vec<Result<Lease, StoreError>> {
                    $via!(self, s => s.acquire_many(identity, ttl, items, timeout))
                }
                fn renew_many(
                    &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
                ) -> Vec<Result<Lease, StoreError>> {
                    $via!(self, s => s.renew_many(identity, ttl, items, timeout))
                }
                fn renew_many_with_heartbeat(
                    &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>,
                    timeout: Duration,
                ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
                    $via!(self, s => s.renew_many_with_heartbeat(identity, ttl, items, beat, timeout))
                }
                fn release_many(
                    &self, identity: &str, items: &[BatchItem<'_>], timeout: Duration,
                ) -> Vec<Result<(), StoreError>> {
                    $via!(self, s => s.release_many(identity, items, timeout))
                }
                fn inspect_many(&self, names: &[&str], timeout: Duration) -> Vec<Result<Lease, StoreError>> {
                    $via!(self, s => s.inspect_many(names, timeout))
                }
                fn heartbeat(
                    &self, group: &str, member: &str, leading: u32, ttl: Duration, timeout: Duration,
                ) -> Result<Members, StoreError> {
                    $via!(self, s => s.heartbeat(group, member, leading, ttl, timeout))
                }
                fn leave_group(&self, group: &str, member: &str, timeout: Duration) -> Result<(), StoreError> {
                    $via!(self, s => s.leave_group(group, member, timeout))
                }
                fn releases(&self) -> Option<::crossbeam_channel::Receiver<Released>> {
                    $via!(self, s => s.releases())
                }
            }
        };
    };
}
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use forward_store; // for AnyStore

/// The store behind a smart pointer: `Arc<dyn Store>` to share one among
/// electors, `Box<dyn Store>` to pick one at run time.
macro_rules! deref {
    ($this:ident, $s:ident => $call:expr) => {{
        let $s = &**$this;
        $call
    }};
}
forward_store!([S: Store + ?Sized] Arc<S>, deref);
forward_store!([S: Store + ?Sized] Box<S>, deref);

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as StdError;

    #[test]
    fn display_carries_cause_and_source_is_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer");
        let e = StoreError::retryable("renew failed").with_source(io);
        assert_eq!(e.to_string(), "renew failed: connection reset by peer");
        assert!(e.is_retryable() && !e.is_fatal());
        let src = StdError::source(&e).expect("source kept");
        assert_eq!(src.to_string(), "connection reset by peer");
    }

    #[test]
    fn a_shared_store_is_the_store_it_shares() {
        // `Arc<S>` forwards every call, so electors and the caller that keeps
        // a handle (to inspect, or to break it in tests) see one election.
        use crate::memstore::MemStore;
        let inner = Arc::new(MemStore::with_manual_clock(crate::lease::DbTime::from_unix_micros(5_000_000)));
        let shared: Arc<dyn Store> = inner.clone();
        let (ttl, t) = (Duration::from_secs(10), Duration::from_secs(1));

        assert!(shared.inspect("jobs", t).unwrap_err().is_no_lease());
        let won = shared.acquire("jobs", "a", ttl, b"addr-a", t).unwrap();
        assert!(won.held_by("a"));
        let fence = won.fence;
        assert_eq!(inner.peek("jobs").unwrap().payload, b"addr-a");

        inner.advance(Duration::from_secs(4));
        let renewed = shared.renew("jobs", "a", fence, ttl, b"addr-a2", t).unwrap();
        assert_eq!(renewed.ttl(), ttl);
        assert_eq!(shared.inspect("jobs", t).unwrap().payload, b"addr-a2");
        assert!(shared.renew("jobs", "a", fence + 1, ttl, b"", t).unwrap_err().is_lease_lost());

        shared.release("jobs", "a", fence, t).unwrap();
        let after = inner.peek("jobs").unwrap();
        assert!(after.expired() && after.fence == fence);
        assert!(shared.acquire("jobs", "b", ttl, b"", t).unwrap().fence > fence);
        assert_eq!(inner.stats().writes, 4, "acquire, renew, release, acquire: each reached the inner store once");

        // The group's combined call reaches the inner store's renewals and
        // members, through `Arc` and through `Box`.
        let fence_b = inner.peek("jobs").unwrap().fence;
        let items = [BatchItem { name: "jobs", fence: fence_b, payload: b"addr-b" }];
        let beat = Heartbeat { group: "g", leading: 1, ttl };
        let (out, members) = shared.renew_many_with_heartbeat("b", ttl, &items, beat, t);
        assert!(out[0].as_ref().is_ok_and(|l| l.held_by("b")), "{out:?}");
        assert_eq!(members.unwrap().live, 1);
        let boxed: Box<dyn Store> = Box::new(Arc::clone(&inner));
        let (out, members) = boxed.renew_many_with_heartbeat("b", ttl, &items, beat, t);
        assert!(out[0].is_ok() && members.is_ok_and(|m| m.led == Some(1)), "{out:?}");
    }

    #[test]
    fn message_is_the_store_text_without_the_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let e = StoreError::fatal("relation \"leases\" does not exist").with_source(io);
        assert_eq!(e.message(), "relation \"leases\" does not exist");
        assert_eq!(e.to_string(), "relation \"leases\" does not exist: timed out");
        let plain = StoreError::retryable("too many connections");
        assert_eq!(plain.to_string(), plain.message());
        assert!(StdError::source(&plain).is_none());
        assert_eq!(StoreError::no_lease("jobs").to_string(), "no lease for election \"jobs\"");
        assert_eq!(StoreError::lease_lost().message(), "lease lost");
    }

    #[test]
    fn debug_names_kind_message_and_cause() {
        let e = StoreError::retryable("connect failed")
            .with_source(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
        let dbg = format!("{e:?}");
        assert!(
            dbg.contains("Retryable") && dbg.contains("connect failed") && dbg.contains("connection refused"),
            "{dbg}"
        );
        // Clones share the cause: both still explain themselves.
        assert_eq!(e.clone().to_string(), e.to_string());
    }

    #[test]
    fn kinds_have_their_predicates() {
        assert!(StoreError::lease_lost().is_lease_lost());
        assert!(StoreError::no_lease("x").is_no_lease());
        assert!(StoreError::fatal("relation missing").is_fatal());
        assert_eq!(StoreError::fatal("f").kind(), ErrorKind::Fatal);
        // Exactly one predicate holds for each kind.
        for (e, kind) in [
            (StoreError::lease_lost(), ErrorKind::LeaseLost),
            (StoreError::no_lease("x"), ErrorKind::NoLease),
            (StoreError::retryable("r"), ErrorKind::Retryable),
            (StoreError::fatal("f"), ErrorKind::Fatal),
        ] {
            assert_eq!(e.kind(), kind);
            let hits = [e.is_lease_lost(), e.is_no_lease(), e.is_retryable(), e.is_fatal()];
            assert_eq!(hits.iter().filter(|h| **h).count(), 1, "{kind:?}: {hits:?}");
        }
    }
}
