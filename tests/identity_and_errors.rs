//! Small documented contracts whose only other checks are doctests (which
//! run but are not measured): `base_identity` strips a generated instance
//! tag and nothing else, and the lease check of an ended term is
//! `ElectionError::NotLeading`, read as the documented phrase.

use std::time::Duration;

use leaderelection::{base_identity, generate_identity, Config, ElectionError, Elector, MemStore};

#[test]
fn base_identity_strips_only_a_generated_tag() {
    // A generated identity is a base one: the tag is added per run.
    let generated = generate_identity().unwrap();
    assert_eq!(base_identity(&generated), generated);
    assert_eq!(base_identity("web-1#0123456789abcdef"), "web-1");
    assert_eq!(base_identity("web-1"), "web-1", "no tag");
    for kept in ["web#not-a-tag", "web#0123456789abcde", "web#0123456789abcdefa", "web#0123456789abcdeg"] {
        assert_eq!(base_identity(kept), kept, "not a generated tag: kept whole");
    }
    assert_eq!(base_identity("a#b#0123456789ABCDEF"), "a#b", "only the last tag");
}

#[test]
fn the_lease_check_of_an_ended_term_is_not_leading() {
    let e = Elector::start(Config::new(MemStore::new(), "e").identity("a")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(5)).expect("the only participant leads");
    assert!(guard.lease_check().is_ok());
    e.shutdown().unwrap();
    let err = guard.lease_check().unwrap_err();
    assert!(matches!(err, ElectionError::NotLeading), "{err:?}");
    assert_eq!(err.to_string(), "the term has ended");
}
