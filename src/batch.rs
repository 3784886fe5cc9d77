//! Batched store calls and group membership: the optional [`Store`] methods
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
//! The [`Store`] trait gives every batched method a default that calls the
//! single-lease method once per item, within the batch's timeout, so a
//! store written before batches existed keeps working in a group (with one
//! round trip per item). The built-in stores send each batch as one
//! statement or one short transaction.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::Human;
use crate::lease::{DbTime, Lease};
use crate::store::{Store, StoreError};

/// One election's part of a batched call: [`Store::acquire_many`],
/// [`Store::renew_many`] and [`Store::release_many`].
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
/// ([`Store::renew_many_with_heartbeat`]): the member is the renewing
/// identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat<'a> {
    /// The group, as [`Store::heartbeat`]'s `group`.
    pub group: &'a str,
    /// The elections the member leads, as [`Store::heartbeat`]'s `leading`.
    pub leading: u32,
    /// How long the heartbeat keeps the member counted, as
    /// [`Store::heartbeat`]'s `ttl`.
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
/// default of every batched [`Store`] method.
pub(crate) fn one_by_one<I, T>(
    items: &[I],
    timeout: Duration,
    mut one: impl FnMut(&I, Duration) -> Result<T, StoreError>,
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

/// The default of [`Store::acquire_many`].
pub(crate) fn acquire_each<S: Store + ?Sized>(
    s: &S,
    identity: &str,
    ttl: Duration,
    items: &[BatchItem<'_>],
    timeout: Duration,
) -> Vec<Result<Lease, StoreError>> {
    one_by_one(items, timeout, |i, t| s.acquire(i.name, identity, ttl, i.payload, t))
}

/// The default of [`Store::renew_many`].
pub(crate) fn renew_each<S: Store + ?Sized>(
    s: &S,
    identity: &str,
    ttl: Duration,
    items: &[BatchItem<'_>],
    timeout: Duration,
) -> Vec<Result<Lease, StoreError>> {
    one_by_one(items, timeout, |i, t| s.renew(i.name, identity, i.fence, ttl, i.payload, t))
}

/// The default of [`Store::renew_many_with_heartbeat`]: the heartbeat,
/// then the renewals in what is left of `timeout`.
pub(crate) fn renew_with_heartbeat<S: Store + ?Sized>(
    s: &S,
    identity: &str,
    ttl: Duration,
    items: &[BatchItem<'_>],
    beat: Heartbeat<'_>,
    timeout: Duration,
) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
    let start = Instant::now();
    let members = s.heartbeat(beat.group, identity, beat.leading, beat.ttl, timeout);
    let left = timeout.saturating_sub(start.elapsed());
    (s.renew_many(identity, ttl, items, left), members)
}

/// The default of [`Store::release_many`].
pub(crate) fn release_each<S: Store + ?Sized>(
    s: &S,
    identity: &str,
    items: &[BatchItem<'_>],
    timeout: Duration,
) -> Vec<Result<(), StoreError>> {
    one_by_one(items, timeout, |i, t| s.release(i.name, identity, i.fence, t))
}

/// The default of [`Store::inspect_many`].
pub(crate) fn inspect_each<S: Store + ?Sized>(
    s: &S,
    names: &[&str],
    timeout: Duration,
) -> Vec<Result<Lease, StoreError>> {
    one_by_one(names, timeout, |n, t| s.inspect(n, t))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn debug_never_shows_the_payload() {
        let item = BatchItem { name: "shard-1", fence: 7, payload: b"secret-token" };
        let dbg = format!("{item:?}");
        assert!(dbg.contains("shard-1") && dbg.contains("payload_len: 12") && !dbg.contains("secret"), "{dbg}");
    }
}
