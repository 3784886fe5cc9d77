//! The batched calls and group members of [`PostgresStore`] (see
//! [`crate::batch`]): each batch is one simple query, one implicit
//! transaction, pinned as the single calls are (a renewal batch that
//! carries the member's heartbeat too, see
//! [`PostgresStore::renew_batch_with_heartbeat`]); the statements are in
//! [`sql`] (`acquire_many` and the rest).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_postgres::SimpleQueryMessage;

use super::{deadline_after, sql, PostgresStore};
use crate::batch::{BatchItem, Heartbeat, Members};
use crate::lease::{DbTime, Lease};
use crate::store::StoreError;

/// A batch's answers as they come in: one slot per item, in the items'
/// order.
struct Answers<T> {
    out: Vec<Option<Result<T, StoreError>>>,
    /// For an item that repeats an earlier one (the same election, and the
    /// same fence where the call is guarded by one), that earlier item: the
    /// statement carries it once, and both get its answer.
    same_as: Vec<Option<usize>>,
}

impl<T: Clone> Answers<T> {
    /// No answers yet, except for the items whose name no statement can
    /// carry (it holds NUL): each of those fails on its own, fatally, as
    /// the single call would, and the rest go ahead.
    fn new(items: &[BatchItem<'_>], by_fence: bool) -> Answers<T> {
        let mut first = HashMap::new();
        let (mut out, mut same_as) = (Vec::with_capacity(items.len()), Vec::with_capacity(items.len()));
        for (j, it) in items.iter().enumerate() {
            // Only a NUL stops a name being written (see `sql::literal`);
            // the literal is built only then, for its error.
            let bad = if it.name.contains('\0') { sql::literal("election name", it.name).err() } else { None };
            let key = (it.name, if by_fence { it.fence } else { 0 });
            same_as.push(if bad.is_some() { None } else { first.get(&key).copied() });
            if bad.is_none() {
                first.entry(key).or_insert(j);
            }
            out.push(bad.map(Err));
        }
        Answers { out, same_as }
    }

    /// The items still to send: without an answer, and not repeating an
    /// earlier one.
    fn pending(&self) -> Vec<usize> {
        (0..self.out.len()).filter(|&j| self.out[j].is_none() && self.same_as[j].is_none()).collect()
    }

    fn set(&mut self, j: usize, r: Result<T, StoreError>) {
        self.out[j] = Some(r);
    }

    /// Every item still to send gets `e`.
    fn fail_pending(&mut self, e: &StoreError) {
        for j in self.pending() {
            self.out[j] = Some(Err(e.clone()));
        }
    }

    /// The answers, an item repeating an earlier one getting that one's,
    /// and `missing(j)` for each other item that got none.
    fn finish(self, missing: impl Fn(usize) -> Result<T, StoreError>) -> Vec<Result<T, StoreError>> {
        let mut done: Vec<Result<T, StoreError>> = Vec::with_capacity(self.out.len());
        for (j, (r, same)) in self.out.into_iter().zip(self.same_as).enumerate() {
            let r = match (r, same) {
                (Some(r), _) => r,
                (None, Some(first)) => done[first].clone(),
                (None, None) => missing(j),
            };
            done.push(r);
        }
        done
    }
}

impl PostgresStore {
    /// [`Store::acquire_many`](crate::Store::acquire_many): see
    /// [`sql::acquire_many`], which never waits for a row lock. An item
    /// whose row another writer held locked (a concurrent claim or
    /// renewal of it, which ends in milliseconds), or that was deleted
    /// meanwhile, runs again in a new transaction after a short pause that
    /// doubles each time (2 ms to 50 ms); the rest keep their answers. It
    /// does so for at most [`BUSY_RETRIES_FOR`] after the first answer, or
    /// half the time then left, whichever is shorter: a row locked longer
    /// (an operator's open transaction) is then answered with a retryable
    /// error, so it cannot hold the other items' answers back until the
    /// timeout.
    pub(super) fn claim_batch(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        const OP: &str = "acquire_many";
        let deadline = deadline_after(timeout);
        let mut answers = Answers::new(items, false);
        let mut pause = Duration::from_millis(2);
        let mut give_up = None;
        let mut ran_again = false;
        loop {
            let pending = answers.pending();
            if pending.is_empty() {
                break;
            }
            if ran_again {
                let now = Instant::now();
                let until = *give_up
                    .get_or_insert_with(|| now + (deadline.saturating_duration_since(now) / 2).min(BUSY_RETRIES_FOR));
                if now + pause >= until {
                    pending.iter().for_each(|&j| answers.set(j, Err(busy(items[j].name))));
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            let batch: Vec<BatchItem<'_>> = pending.iter().map(|&j| items[j]).collect();
            let sent = sql::acquire_many(&self.qualified, identity, ttl, &batch, self.failover_rule)
                .and_then(|body| self.run(OP, &body, deadline, sql::Pin::Write))
                .and_then(|msgs| {
                    let rows = sql::batch_rows(OP, &msgs, batch.len())?;
                    Ok(rows
                        .into_iter()
                        .map(|(k, row)| match row.get(1) {
                            Some("l") => (pending[k], Err(locked(OP, batch[k].name))),
                            _ => (pending[k], sql::lease_at(OP, row, 2)),
                        })
                        .collect::<Vec<_>>())
                });
            match sent {
                Ok(rows) => rows.into_iter().for_each(|(j, r)| answers.set(j, r)),
                Err(e) => {
                    let e = if ran_again && e.is_retryable() {
                        StoreError::retryable("postgres acquire_many: rows stayed locked by other writers; out of time")
                            .with_source(e)
                    } else {
                        sql::explain_undefined_column(e, OP, &self.qualified)
                    };
                    answers.fail_pending(&e);
                    break;
                }
            }
            ran_again = true;
        }
        answers.finish(|_| Err(StoreError::retryable("postgres acquire_many: no answer")))
    }

    /// [`Store::renew_many`](crate::Store::renew_many): see
    /// [`sql::renew_many`]; an item without an answer row lost its lease,
    /// one with a renewed row gets the lease [`sql::renewed_at`] builds,
    /// and one whose row another transaction held locked runs again as in
    /// [`PostgresStore::settle_locked`].
    pub(super) fn renew_batch(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.settle_renewals(identity, ttl, Answers::new(items, true), items, timeout, None)
            .finish(|_| Err(StoreError::lease_lost()))
    }

    /// The renewals of [`Self::renew_batch`], with the heartbeat's
    /// statement when `with` carries one; an item left without an answer
    /// lost its lease.
    fn settle_renewals(
        &self, identity: &str, ttl: Duration, answers: Answers<Lease>, items: &[BatchItem<'_>], timeout: Duration,
        with: Option<&mut WithBeat>,
    ) -> Answers<Lease> {
        const OP: &str = "renew_many";
        self.settle_locked(
            OP,
            answers,
            items,
            timeout,
            with,
            |batch| sql::renew_many(&self.qualified, identity, ttl, batch),
            |item, row| row.get(1).map(|_| sql::renewed_at(OP, row, identity, item)),
        )
    }

    /// [`Store::renew_many_with_heartbeat`](crate::Store::renew_many_with_heartbeat):
    /// the heartbeat ([`sql::heartbeat`]) and the renewals
    /// ([`sql::renew_many`]) as two statements of one simple query, so one
    /// round trip and one transaction where the two calls took two. Each
    /// statement is the separate call's, with its conditions; both read one
    /// `now()`, the transaction's start (so the heartbeat's answer falls as
    /// early in the call as it can, and a renewal is stamped no later than
    /// it would have been alone). Items whose row another transaction held
    /// locked run again on their own, as in
    /// [`PostgresStore::settle_locked`].
    ///
    /// One statement failing rolls the other back, so a query that fails
    /// as a whole is not the answer of either: both run again as separate
    /// calls at once, in the time left (the default of the trait), and each
    /// answers for itself. So a heartbeat that cannot be written (a members
    /// table missing, its own row locked by an operator) costs the
    /// renewals a round trip, never their terms. Without items to renew,
    /// or with a heartbeat no statement can carry, the separate calls
    /// answer at once.
    pub(super) fn renew_batch_with_heartbeat(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, timeout: Duration,
    ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
        let start = Instant::now();
        let answers = Answers::new(items, true);
        let statement = self.members().and_then(|m| sql::heartbeat(&m, beat.group, identity, beat.leading, beat.ttl));
        let statement = match statement {
            Ok(s) if !answers.pending().is_empty() => s,
            _ => return crate::store::renew_with_heartbeat(self, identity, ttl, items, beat, timeout),
        };
        let mut with = WithBeat { statement, answer: None };
        let answers = self.settle_renewals(identity, ttl, answers, items, timeout, Some(&mut with));
        let failed = match with.answer {
            Some(Ok(members)) => return (answers.finish(|_| Err(StoreError::lease_lost())), members),
            Some(Err(e)) => e,
            None => StoreError::retryable("postgres renew_many: the heartbeat was not sent"),
        };
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return (answers.finish(|_| Err(StoreError::lease_lost())), Err(failed));
        }
        crate::store::renew_with_heartbeat(self, identity, ttl, items, beat, left)
    }

    /// [`Store::release_many`](crate::Store::release_many): see
    /// [`sql::release_many`]. Every item the statement carried is released
    /// or was not held, `Ok` either way, except one whose row another
    /// transaction held locked ([`PostgresStore::settle_locked`]).
    pub(super) fn release_batch(
        &self, identity: &str, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<(), StoreError>> {
        const OP: &str = "release_many";
        let names: Vec<&str> = items.iter().map(|it| it.name).collect();
        let notice = self.notice(identity, &names);
        self.settle_locked(
            OP,
            Answers::new(items, true),
            items,
            timeout,
            None,
            |batch| sql::release_many(&self.qualified, &notice, identity, batch),
            |_, _| None,
        )
        .finish(|_| Ok(()))
    }

    /// Runs a renew or release batch (`build`), whose answer rows are the
    /// items written (`answer` gives `Some`) or skipped because another
    /// transaction held their row locked (`None`). Skipped items run again
    /// in a new statement after a short pause that doubles each time (2 ms
    /// to 50 ms), for at most [`BUSY_RETRIES_FOR`] or half the time left,
    /// as a claim batch does: a claim batch of another member locks the
    /// rows it looks at for milliseconds. A row locked longer (an
    /// operator's open transaction) is then answered alone with a retryable
    /// error; the batch never waits on it, and its other terms keep their
    /// answers. With `beat`, its statement goes first in the first query,
    /// and its answer (or the whole query's failure) goes back in it.
    #[allow(clippy::too_many_arguments)] // the statement's two halves, built and read
    fn settle_locked<T: Clone>(
        &self, op: &'static str, mut answers: Answers<T>, items: &[BatchItem<'_>], timeout: Duration,
        mut beat: Option<&mut WithBeat>, build: impl Fn(&[BatchItem<'_>]) -> Result<String, StoreError>,
        answer: impl Fn(&BatchItem<'_>, &tokio_postgres::SimpleQueryRow) -> Option<Result<T, StoreError>>,
    ) -> Answers<T> {
        let deadline = deadline_after(timeout);
        let (mut pause, mut give_up) = (Duration::from_millis(2), None);
        let mut pending = answers.pending();
        let mut busy: Vec<usize> = Vec::new();
        while !pending.is_empty() {
            let batch: Vec<BatchItem<'_>> = pending.iter().map(|&j| items[j]).collect();
            let rows = build(&batch)
                .and_then(|body| match beat.take() {
                    None => self.run(op, &body, deadline, sql::Pin::Write),
                    Some(b) => {
                        let sent = self.run(op, &format!("{}; {body}", b.statement), deadline, sql::Pin::Write);
                        match sent {
                            Ok(mut msgs) => {
                                let renewed = msgs.split_off(last_statement(&msgs));
                                b.answer = Some(Ok(members_of(&msgs)));
                                Ok(renewed)
                            }
                            Err(e) => {
                                b.answer = Some(Err(e.clone()));
                                Err(e)
                            }
                        }
                    }
                })
                .and_then(|msgs| {
                    let rows = sql::batch_rows(op, &msgs, batch.len())?;
                    Ok(rows.into_iter().map(|(k, row)| (pending[k], answer(&batch[k], row))).collect::<Vec<_>>())
                });
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) => {
                    pending.iter().for_each(|&j| answers.set(j, Err(e.clone())));
                    return answers;
                }
            };
            busy.clear();
            for (j, r) in rows {
                match r {
                    Some(r) => answers.set(j, r),
                    None => busy.push(j),
                }
            }
            if busy.is_empty() {
                break;
            }
            let now = Instant::now();
            let until = *give_up
                .get_or_insert_with(|| now + (deadline.saturating_duration_since(now) / 2).min(BUSY_RETRIES_FOR));
            if now + pause >= until {
                busy.iter().for_each(|&j| answers.set(j, Err(locked(op, items[j].name))));
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
            // Only the skipped run again; an item without an answer row is
            // settled (the caller's `finish` says what it means).
            pending = std::mem::take(&mut busy);
        }
        answers
    }

    /// [`Store::inspect_many`](crate::Store::inspect_many): see
    /// [`sql::inspect_many`]; a name without an answer row has no lease.
    pub(super) fn inspect_batch(&self, names: &[&str], timeout: Duration) -> Vec<Result<Lease, StoreError>> {
        const OP: &str = "inspect_many";
        let items: Vec<BatchItem<'_>> = names.iter().map(|n| BatchItem { name: n, fence: 0, payload: b"" }).collect();
        let answers = Answers::new(&items, false);
        self.one_statement(
            OP,
            sql::Pin::Read,
            answers,
            &items,
            timeout,
            |batch| {
                let names: Vec<&str> = batch.iter().map(|i| i.name).collect();
                sql::inspect_many(&self.qualified, &names)
            },
            |_, row| sql::lease_at(OP, row, 1),
        )
        .finish(|j| Err(StoreError::no_lease(names[j])))
    }

    /// Runs the statement `build` makes of the items still without an
    /// answer, as one call before `timeout` pinned as `pin`, and fills in
    /// the answer of each item that has an answer row (`k, …`) with
    /// `answer(item, row)`. A statement that answers no rows (a release)
    /// fills in nothing. A failure of the whole call fails every item still
    /// waiting.
    #[allow(clippy::too_many_arguments)] // the statement's two halves, built and read
    fn one_statement<T: Clone>(
        &self, op: &'static str, pin: sql::Pin, mut answers: Answers<T>, items: &[BatchItem<'_>], timeout: Duration,
        build: impl FnOnce(&[BatchItem<'_>]) -> Result<String, StoreError>,
        answer: impl Fn(&BatchItem<'_>, &tokio_postgres::SimpleQueryRow) -> Result<T, StoreError>,
    ) -> Answers<T> {
        let pending = answers.pending();
        if pending.is_empty() {
            return answers;
        }
        let batch: Vec<BatchItem<'_>> = pending.iter().map(|&j| items[j]).collect();
        let rows = build(&batch).and_then(|body| self.run(op, &body, deadline_after(timeout), pin)).and_then(|msgs| {
            let rows = sql::batch_rows(op, &msgs, batch.len())?;
            Ok(rows.into_iter().map(|(k, row)| (pending[k], answer(&batch[k], row))).collect::<Vec<_>>())
        });
        match rows {
            Ok(rows) => rows.into_iter().for_each(|(j, r)| answers.set(j, r)),
            Err(e) => answers.fail_pending(&e),
        }
        answers
    }

    /// [`Store::heartbeat`](crate::Store::heartbeat): see [`sql::heartbeat`].
    pub(super) fn beat(
        &self, group: &str, member: &str, leading: u32, ttl: Duration, timeout: Duration,
    ) -> Result<Members, StoreError> {
        const OP: &str = "heartbeat";
        let members = self.members()?;
        let body = sql::heartbeat(&members, group, member, leading, ttl)?;
        let msgs = self
            .run(OP, &body, deadline_after(timeout), sql::Pin::Write)
            .map_err(|e| sql::explain_missing_members(e, OP, &members))?;
        members_of(&msgs)
    }

    /// [`Store::leave_group`](crate::Store::leave_group): see
    /// [`sql::leave_group`].
    pub(super) fn leave(&self, group: &str, member: &str, timeout: Duration) -> Result<(), StoreError> {
        const OP: &str = "leave_group";
        let members = self.members()?;
        let body = sql::leave_group(&members, group, member)?;
        self.run(OP, &body, deadline_after(timeout), sql::Pin::Write)
            .map(drop)
            .map_err(|e| sql::explain_missing_members(e, OP, &members))
    }
}

/// A heartbeat that goes first in a renewal batch's first query (see
/// [`PostgresStore::renew_batch_with_heartbeat`]).
struct WithBeat {
    /// [`sql::heartbeat`]'s statement.
    statement: String,
    /// Once the query ran: the heartbeat's answer, or the error of the
    /// query, which failed as a whole; `None` if it was never sent.
    answer: Option<Result<Result<Members, StoreError>, StoreError>>,
}

/// Where the last statement's messages begin among a simple query's: after
/// the one before it completed (0 if none did).
fn last_statement(msgs: &[SimpleQueryMessage]) -> usize {
    let mut ends = msgs.iter().enumerate().rev().filter(|(_, m)| matches!(m, SimpleQueryMessage::CommandComplete(_)));
    ends.nth(1).map_or(0, |(before, _)| before + 1)
}

/// The members a heartbeat's answer row ([`sql::heartbeat`]) counts: the
/// first row among `msgs`.
fn members_of(msgs: &[SimpleQueryMessage]) -> Result<Members, StoreError> {
    let row = sql::rows(msgs).into_iter().next();
    let bad = || StoreError::fatal("postgres heartbeat: cannot read the count of members");
    let (live, now, rank, led, most) = match row.as_deref() {
        Some([Some(live), Some(now), Some(rank), Some(led), Some(most)]) => (
            live.parse::<u32>().map_err(|_| bad())?,
            now.parse::<i64>().map_err(|_| bad())?,
            rank.parse::<u32>().map_err(|_| bad())?,
            led.parse::<u64>().map_err(|_| bad())?,
            // Reports are u32; a hand-written row beyond that counts as the
            // most there can be.
            most.parse::<i64>().map_err(|_| bad())?.clamp(0, i64::from(u32::MAX)) as u32,
        ),
        _ => return Err(bad()),
    };
    Ok(Members::new(live, DbTime::from_unix_micros(now)).with_rank(rank).with_leading(led, most))
}

/// How long after its first answer a claim batch keeps running again the
/// items whose rows other writers held locked. A claim or renewal holds a
/// row for one statement (milliseconds; a 3,334-row claim batch about 100
/// ms on a loaded two-core machine).
pub(super) const BUSY_RETRIES_FOR: Duration = Duration::from_millis(500);

/// A claim whose row another writer held locked (or that was deleted)
/// each time the batch ran it.
fn busy(name: &str) -> StoreError {
    StoreError::retryable(format!(
        "postgres acquire_many: the row of election {name:?} stayed locked by another writer while the batch ran it \
         again; not claimed"
    ))
}

/// A claim that applies, or a renewal or release, that found the row
/// locked by another transaction (a claim: a lease check, most likely; a
/// renewal or release: a writer, or an operator's `SELECT … FOR UPDATE`).
fn locked(op: &str, name: &str) -> StoreError {
    StoreError::retryable(format!(
        "postgres {op}: the row of election {name:?} is locked by another transaction; not written, not waited for"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // An election named twice in a batch (under one fence) is sent once
    // and both items get its answer; an item the statement left unanswered
    // gets `missing`'s; a name no statement can carry fails on its own.
    #[test]
    fn a_repeated_item_gets_the_first_ones_answer_and_a_nul_name_fails_alone() {
        let item = |name, fence| BatchItem { name, fence, payload: b"" };
        let items = [item("a", 1), item("b", 1), item("a", 1), item("a", 2), item("c\0", 1)];
        let mut answers: Answers<u32> = Answers::new(&items, true);
        assert_eq!(answers.pending(), [0, 1, 3], "the repeat and the NUL name are not sent");
        answers.set(0, Ok(10));
        let out = answers.finish(|j| Err(StoreError::retryable(format!("item {j} not answered"))));
        let texts: Vec<String> =
            out.iter().map(|r| r.as_ref().map_or_else(|e| e.to_string(), |v| v.to_string())).collect();
        assert_eq!(texts[..4], ["10", "item 1 not answered", "10", "item 3 not answered"]);
        assert!(out[4].as_ref().is_err_and(|e| e.is_fatal() && e.message().contains("NUL")), "{:?}", out[4]);
    }
}
