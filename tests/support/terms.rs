//! The `terms` column's scenario, which both SQL stores' suites run
//! (tests/storetest_postgres.rs, tests/storetest_mysql.rs) with their own
//! way of reading the column.

use std::time::Duration;

use leaderelection::Store;

use super::wait_for;

const T: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(60);

/// `terms` counts claims: 1 for an absent row; unchanged by a renewal, the
/// holder's re-acquire of its valid lease, a losing claim, an inspect and a
/// release by another identity; one more for a takeover of an expired lease
/// and for a claim after a release. `terms(name)` reads the column.
pub fn counts_claims_only(s: &impl Store, terms: impl Fn(&str) -> i64) {
    let ttl = Duration::from_secs(1);
    let a = s.acquire("e", "a", ttl, b"", T).unwrap();
    assert_eq!(terms("e"), 1, "absent row claimed");
    s.renew("e", "a", a.fence, ttl, b"", T).unwrap();
    let again = s.acquire("e", "a", ttl, b"", T).unwrap();
    assert_eq!(again.fence, a.fence, "the holder's re-acquire ran after its lease expired: {a:?} {again:?}");
    assert!(!s.acquire("e", "b", LONG, b"", T).unwrap().held_by("b"), "b claimed a valid lease");
    s.inspect("e", T).unwrap();
    assert_eq!(terms("e"), 1, "renew, the holder's re-acquire, a losing claim or inspect counted a term");
    assert!(wait_for(Duration::from_secs(5), || s.inspect("e", T).unwrap().expired()), "the lease expires");
    let b = s.acquire("e", "b", LONG, b"", T).unwrap();
    assert!(b.held_by("b") && b.fence > a.fence, "{b:?}");
    assert_eq!(terms("e"), 2, "takeover of an expired lease");
    s.release("e", "a", a.fence, T).unwrap();
    s.release("e", "b", b.fence, T).unwrap();
    assert_eq!(terms("e"), 2, "a release counted a term");
    assert!(s.acquire("e", "a", LONG, b"", T).unwrap().held_by("a"));
    assert_eq!(terms("e"), 3, "claim after a release");
}
