//! The failover rule at the SQL level (issue 18), for both SQL stores: a
//! row written under another server history (as a replica promoted by a
//! failover holds it) is never claimed as it stands. The suites play the
//! failover with plain SQL on one server: `mark` stamps the row with a
//! history no server has, `expire` moves its expiry into the past (the
//! renewals the replica lacks).

use std::time::Duration;

use leaderelection::Store;

const T: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(30);

/// Runs the rule's cases on `s`, with election names from `name(case)`.
pub fn rows_inherited_across_a_failover_are_never_claimed_as_they_stand<S: Store>(
    s: &S, name: impl Fn(&str) -> String, mark: impl Fn(&str), expire: impl Fn(&str),
) {
    // Election `case`, held by a, its row then stamped as inherited.
    let inherited = |case: &str| {
        let n = name(case);
        let a = s.acquire(&n, "a", TTL, b"", T).unwrap();
        mark(&n);
        (n, a)
    };
    // Unexpired and inherited: a follower's claim changes nothing; the
    // holder renews it, and it is this server's again (a later expiry then
    // behaves as ever: a claim takes it).
    let (n, a) = inherited("live");
    let seen = s.acquire(&n, "b", TTL, b"", T).unwrap();
    assert!(seen.held_by("a") && seen.fence == a.fence, "an unexpired inherited row was taken: {seen:?}");
    assert!(s.renew(&n, "a", a.fence, TTL, b"", T).unwrap().held_by("a"), "the holder could not renew");
    expire(&n);
    let b = s.acquire(&n, "b", TTL, b"", T).unwrap();
    assert!(b.held_by("b") && b.fence > a.fence, "a renewed row stays inherited: {b:?}");

    // Expired and inherited: the holder's renewals may be lost, so its
    // holder renews it all the same.
    let (n, a) = inherited("renew");
    expire(&n);
    let r = s.renew(&n, "a", a.fence, TTL, b"", T).expect("the holder renews its expired inherited row");
    assert!(r.held_by("a") && r.fence == a.fence && !r.expired(), "{r:?}");

    // Expired and inherited, and someone asks for it first: held for
    // nobody for a whole lease, same fence; nobody renews, releases or
    // claims it meanwhile.
    let (n, a) = inherited("held");
    expire(&n);
    let held = s.acquire(&n, "b", TTL, b"", T).unwrap();
    assert!(held.holder.is_empty() && held.fence == a.fence, "an expired inherited row was claimed: {held:?}");
    let left = held.ttl();
    assert!(left > TTL - Duration::from_secs(2) && left <= TTL, "held for {left:?}, not a lease");
    assert!(s.renew(&n, "a", a.fence, TTL, b"", T).is_err(), "the old holder renewed a held row");
    s.release(&n, "a", a.fence, T).unwrap();
    let again = s.acquire(&n, "c", TTL, b"", T).unwrap();
    assert!(again.holder.is_empty() && !again.expired(), "a held row was released or claimed: {again:?}");
    expire(&n);
    let c = s.acquire(&n, "c", TTL, b"", T).unwrap();
    assert!(c.held_by("c") && c.fence > a.fence, "the held row, expired, was not claimable: {c:?}");

    // Its release changes nothing: the writes the replica lacks may hold
    // a newer term's claim.
    let (n, a) = inherited("release");
    s.release(&n, "a", a.fence, T).unwrap();
    let after = s.inspect(&n, T).unwrap();
    assert!(after.held_by("a") && !after.expired(), "the release of an inherited row applied: {after:?}");
}

/// The step after a restore (issue 34, item 6) on a table of its own:
/// `after_restore` marks every row inherited, so a stale expired row (the
/// restore lost its renewals; `expire` plays that) is held for nobody
/// instead of claimed, while a live holder renews its own as before. The
/// control: the same stale row before the step is claimed at once.
/// `after_restore` returns how many rows it marked.
pub fn a_restore_marks_every_row_inherited<S: Store>(s: &S, after_restore: impl Fn() -> u64, expire: impl Fn(&str)) {
    let live = s.acquire("restored-live", "a", TTL, b"", T).unwrap();
    s.acquire("restored-stale", "a", TTL, b"", T).unwrap();
    s.acquire("restored-control", "a", TTL, b"", T).unwrap();
    // The control, before the step: a stale row looks native and is
    // claimed at once.
    expire("restored-control");
    let taken = s.acquire("restored-control", "b", TTL, b"", T).unwrap();
    assert!(taken.held_by("b"), "the control: a stale native row should be claimed at once: {taken:?}");
    let marked = after_restore();
    assert_eq!(marked, 3, "rows marked (three elections in the table)");
    assert_eq!(after_restore(), 0, "a second run marks nothing more");
    // The restore lost this row's last renewals: held for nobody, not claimed.
    expire("restored-stale");
    let held = s.acquire("restored-stale", "b", TTL, b"", T).unwrap();
    assert!(held.holder.is_empty() && !held.held_by("b"), "a stale row was claimed after the step: {held:?}");
    // The live holder renews its own, which stamps it this server's again.
    assert!(s.renew("restored-live", "a", live.fence, TTL, b"", T).unwrap().held_by("a"));
    // The renewal and the hold stamped their rows this server's again.
    assert_eq!(after_restore(), 2, "the renewed and the held row are this server's again; the control's is not");
}
