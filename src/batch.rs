//! Batched store calls and group membership: the optional [`Store`](crate::Store) methods
//! a [`Group`](crate::Group) uses to drive thousands of elections with a
//! handful of statements.
//!
//! A batch asks the same thing of many elections at once, for one
//! participant: renew these terms, inspect these rows, claim these leases,
//! release these terms. Each election's outcome is still decided by its own
//! row, on the database's clock, exactly as the single-lease call would
//! decide it: a batch is only a way of sending many calls in one round
//! trip. The answer has one entry per item, in the items' order.
//!
//! The [`Store`](crate::Store) trait gives every batched method a default that calls the
//! single-lease method once per item, within the batch's timeout, so a
//! store written before batches existed keeps working in a group (with one
//! round trip per item). The built-in stores send each batch as one
//! statement or one short transaction.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Human, StoreError};
use crate::lease::DbTime;

/// One election's part of a batched call: [`Store::acquire_many`](crate::Store::acquire_many),
/// [`Store::renew_many`](crate::Store::renew_many) and [`Store::release_many`](crate::Store::release_many).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BatchItem<'a> {
    /// The election.
    pub name: &'a str,
    /// The term's fence: what a renewal or release is guarded by. Claims
    /// ignore it (pass 0).
    pub fence: u64,
    /// What a claim or renewal publishes with the lease. Releases ignore it.
    pub payload: &'a [u8],
}

impl fmt::Debug for BatchItem<'_> {
    // Never the payload's bytes, as everywhere else.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchItem")
            .field("name", &self.name)
            .field("fence", &self.fence)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// A member's heartbeat sent along with a renewal batch
/// ([`Store::renew_many_with_heartbeat`](crate::Store::renew_many_with_heartbeat)): the member is the renewing
/// identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat<'a> {
    /// The group, as [`Store::heartbeat`](crate::Store::heartbeat)'s `group`.
    pub group: &'a str,
    /// The elections the member leads, as [`Store::heartbeat`](crate::Store::heartbeat)'s `leading`.
    pub leading: u32,
    /// How long the heartbeat keeps the member counted, as
    /// [`Store::heartbeat`](crate::Store::heartbeat)'s `ttl`.
    pub ttl: Duration,
}

/// What a group member's heartbeat learned: how many members of the group
/// are alive on the database's clock, and where this one stands among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Members {
    /// Members whose heartbeat has not expired at [`Members::now`], the
    /// member that sent this one included.
    pub live: u32,
    /// The database clock when the heartbeat was written.
    pub now: DbTime,
    /// How many of the other live members come before this one when their
    /// names are compared byte by byte; `None` from a store that does not
    /// say. Members spread their renewals over the renew interval by it
    /// (see [`crate::group`]); without it they renew when their terms fall
    /// due, as before.
    pub rank: Option<u32>,
    /// How many elections the live members lead between them, by what each
    /// reported with its last heartbeat (this one's report included);
    /// `None` from a store that does not say.
    pub led: Option<u64>,
    /// The most elections any live member reported leading; `None` with
    /// `led`.
    pub most: Option<u32>,
}

impl Members {
    /// A reading of `live` members at `now`, for stores outside this crate.
    pub fn new(live: u32, now: DbTime) -> Members {
        Members { live, now, rank: None, led: None, most: None }
    }

    /// This reading with this member's `rank` among the live ones.
    #[must_use]
    pub fn with_rank(self, rank: u32) -> Members {
        Members { rank: Some(rank), ..self }
    }

    /// This reading with the elections the live members lead between them
    /// (`led`) and the most any one of them leads (`most`), by their
    /// reports.
    #[must_use]
    pub fn with_leading(self, led: u64, most: u32) -> Members {
        Members { led: Some(led), most: Some(most), ..self }
    }
}

/// Every item's answer is `e`: a batch that failed as a whole (its
/// statement failed, its connection broke, it timed out) counts against
/// every lease in it.
pub fn all_failed<T>(len: usize, e: &StoreError) -> Vec<Result<T, StoreError>> {
    (0..len).map(|_| Err(e.clone())).collect()
}

/// Runs `one` for each item in turn, each with the time left of `timeout`;
/// the items that find no time left fail (retryable) without a call. The
/// default of every batched [`Store`](crate::Store) method.
pub(crate) fn one_by_one<I, T>(
    items: &[I], timeout: Duration, mut one: impl FnMut(&I, Duration) -> Result<T, StoreError>,
) -> Vec<Result<T, StoreError>> {
    let start = Instant::now();
    items
        .iter()
        .map(|item| match timeout.checked_sub(start.elapsed()).filter(|left| !left.is_zero()) {
            Some(left) => one(item, left),
            None => Err(StoreError::retryable(format!(
                "batch gave no answer within {}: not sent, one call at a time",
                Human(timeout)
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;
    use crate::store::Store;

    #[test]
    fn items_without_time_left_fail_without_a_call() {
        let mut calls = 0;
        let out = one_by_one(&[1, 2, 3], Duration::ZERO, |_, _| {
            calls += 1;
            Ok(())
        });
        assert_eq!(calls, 0);
        assert!(out.iter().all(|r| r.as_ref().is_err_and(|e| e.is_retryable())));
        let text = out[0].as_ref().unwrap_err().to_string();
        assert!(text.contains("batch gave no answer within 0s"), "{text}");
    }

    #[test]
    fn each_item_gets_the_time_left() {
        let mut seen = Vec::new();
        let out = one_by_one(&["a", "b"], Duration::from_secs(60), |n, left| {
            seen.push(left);
            if *n == "b" {
                Err(StoreError::lease_lost())
            } else {
                Ok(n.len())
            }
        });
        assert_eq!(out.len(), 2);
        assert_eq!(*out[0].as_ref().unwrap(), 1);
        assert!(out[1].as_ref().unwrap_err().is_lease_lost(), "one item's failure is its own");
        assert!(seen[1] <= seen[0] && seen[0] <= Duration::from_secs(60));
    }

    #[test]
    fn a_whole_batch_failure_counts_against_every_item() {
        let e = StoreError::retryable("connection reset");
        let out: Vec<Result<Lease, StoreError>> = all_failed(3, &e);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|r| r.as_ref().unwrap_err().to_string() == "connection reset"));
    }

    /// A store whose heartbeat waits for the renewals to start (up to 5 s),
    /// and which records the time each part was given.
    struct Slow {
        started: parking_lot::Mutex<Option<Duration>>,
        seen: parking_lot::Condvar,
    }

    impl Store for Slow {
        fn acquire(&self, _: &str, _: &str, _: Duration, _: &[u8], _: Duration) -> Result<Lease, StoreError> {
            Err(StoreError::fatal("no claims here"))
        }
        fn renew(&self, _: &str, _: &str, _: u64, _: Duration, _: &[u8], _: Duration) -> Result<Lease, StoreError> {
            Err(StoreError::lease_lost())
        }
        fn release(&self, _: &str, _: &str, _: u64, _: Duration) -> Result<(), StoreError> {
            Ok(())
        }
        fn inspect(&self, name: &str, _: Duration) -> Result<Lease, StoreError> {
            Err(StoreError::no_lease(name))
        }
        fn renew_many(
            &self, _: &str, _: Duration, items: &[BatchItem<'_>], timeout: Duration,
        ) -> Vec<Result<Lease, StoreError>> {
            *self.started.lock() = Some(timeout);
            self.seen.notify_all();
            items.iter().map(|i| self.renew(i.name, "m", i.fence, Duration::ZERO, i.payload, timeout)).collect()
        }
        fn heartbeat(&self, _: &str, _: &str, _: u32, _: Duration, _: Duration) -> Result<Members, StoreError> {
            let mut started = self.started.lock();
            let deadline = Instant::now() + Duration::from_secs(5);
            while started.is_none() {
                if self.seen.wait_until(&mut started, deadline).timed_out() {
                    return Err(StoreError::retryable("the renewals never started beside the heartbeat"));
                }
            }
            Ok(Members::new(1, crate::DbTime::from_unix_micros(1)))
        }
    }

    // Issue 33: a slow heartbeat sent with a renewal batch ate the batch's
    // timeout (the renewals ran after it, in what was left). Both now run
    // at once, each given the whole timeout.
    #[test]
    fn a_heartbeat_with_renewals_runs_beside_them_and_takes_none_of_their_time() {
        let s = Slow { started: parking_lot::Mutex::new(None), seen: parking_lot::Condvar::new() };
        let items = [BatchItem { name: "a", fence: 1, payload: b"" }];
        let beat = Heartbeat { group: "g", leading: 1, ttl: Duration::from_secs(5) };
        let timeout = Duration::from_secs(2);
        let (renewed, members) = s.renew_many_with_heartbeat("m", Duration::from_secs(5), &items, beat, timeout);
        assert_eq!(renewed.len(), 1);
        assert_eq!(members.map(|m| m.live).map_err(|e| e.to_string()), Ok(1), "the heartbeat waited for the renewals");
        assert_eq!(*s.started.lock(), Some(timeout), "the renewals were given the whole timeout");
    }

    // A store written before batches existed still serves a group: each
    // batched call is its single-lease call once per item, in order, every
    // item keeping its own answer.
    #[test]
    fn a_store_without_batches_answers_each_item_with_its_single_call() {
        let s = Slow { started: parking_lot::Mutex::new(None), seen: parking_lot::Condvar::new() };
        let items = [BatchItem { name: "a", fence: 1, payload: b"" }, BatchItem { name: "b", fence: 2, payload: b"" }];
        let timeout = Duration::from_secs(2);
        let claims = s.acquire_many("m", Duration::from_secs(5), &items, timeout);
        assert_eq!(claims.len(), 2);
        assert!(claims.iter().all(|r| r.as_ref().is_err_and(|e| e.is_fatal() && e.message() == "no claims here")));
        let released = s.release_many("m", &items, timeout);
        assert_eq!(released.iter().map(Result::is_ok).collect::<Vec<_>>(), [true, true]);
        let seen = s.inspect_many(&["a", "b"], timeout);
        let texts: Vec<String> = seen.iter().map(|r| r.as_ref().unwrap_err().to_string()).collect();
        assert_eq!(texts, [StoreError::no_lease("a").to_string(), StoreError::no_lease("b").to_string()]);
        assert!(seen.iter().all(|r| r.as_ref().is_err_and(StoreError::is_no_lease)));
    }

    #[test]
    fn debug_never_shows_the_payload() {
        let item = BatchItem { name: "shard-1", fence: 7, payload: b"secret-token" };
        let dbg = format!("{item:?}");
        assert!(dbg.contains("shard-1") && dbg.contains("payload_len: 12") && !dbg.contains("secret"), "{dbg}");
    }
}
