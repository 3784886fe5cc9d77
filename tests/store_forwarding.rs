//! A store behind a `Box<dyn Store>` or an `Arc` is the store: the
//! acceptance suite (members included) passes through both, so every call
//! (batches, heartbeats and leaves too) reaches the store inside. And a
//! store that implements only the four required calls refuses the group
//! calls it does not keep, with a fatal error saying which; one that keeps
//! members without their reports and ranks passes the members suite.

use std::sync::Arc;
use std::time::Duration;

use leaderelection::{ErrorKind, MemStore, Members, Store, StoreError};

mod forward;
use forward::forward_calls;

mod boxed {
    use leaderelection::{MemStore, Store};

    fn make() -> Box<dyn Store> {
        Box::new(MemStore::new())
    }

    leaderelection::storetest_suite!(with members: make());
}

mod arced {
    leaderelection::storetest_suite!(with members: std::sync::Arc::new(leaderelection::MemStore::new()));
}

/// The four calls every store must have, and nothing else.
struct Minimal(MemStore);

impl Store for Minimal {
    forward_calls!(0 => acquire, renew, release, inspect);
}

/// A store that keeps members but tells neither what they lead nor this
/// member's rank (both optional in `Members`): the members suite passes on
/// it, the cases about those answers passing as the suite documents.
struct Plain(MemStore);

impl Store for Plain {
    forward_calls!(0 => acquire, renew, release, inspect, leave_group);
    fn heartbeat(&self, g: &str, m: &str, leading: u32, ttl: Duration, t: Duration) -> Result<Members, StoreError> {
        self.0.heartbeat(g, m, leading, ttl, t).map(|m| Members::new(m.live, m.now))
    }
}

mod plain_members {
    leaderelection::storetest_suite!(members: super::Plain(leaderelection::MemStore::new()));
}

/// Without `heartbeat` and `leave_group` of its own, a store refuses both
/// (fatally, naming the call), directly and through an `Arc`.
#[test]
fn a_store_without_members_refuses_the_group_calls() {
    const T: Duration = Duration::from_secs(1);
    let direct = Minimal(MemStore::new());
    let shared: Arc<dyn Store> = Arc::new(Minimal(MemStore::new()));
    for s in [&direct as &dyn Store, &shared as &dyn Store] {
        let e = s.leave_group("g", "m", T).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
        assert!(e.message().contains("does not implement Store::leave_group"), "{e}");
        let e = s.heartbeat("g", "m", 0, T, T).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
        assert!(e.message().contains("does not implement Store::heartbeat"), "{e}");
        // The required calls work as the store inside does.
        assert!(s.acquire("e", "a", Duration::from_secs(5), b"", T).unwrap().held_by("a"));
    }
}
