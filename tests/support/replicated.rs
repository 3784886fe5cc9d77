//! What the replicated pairs of servers a scenario owns
//! ([`PgPair`](super::pg_replica::PgPair),
//! [`MariaPair`](super::maria_replica::MariaPair)) keep alike: the two
//! nodes, which of them is the primary, the pair's mode and how long it took
//! to start. Each pair derefs to its [`Nodes`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Node 0 starts as the primary, node 1 as its standby or replica.
pub struct Nodes<S, M> {
    nodes: [S; 2],
    /// Index of the node that is (or last was) the primary.
    primary: AtomicUsize,
    mode: M,
    setup: Duration,
}

impl<S, M: Copy> Nodes<S, M> {
    pub fn new(first_primary: S, second: S, mode: M) -> Nodes<S, M> {
        Nodes { nodes: [first_primary, second], primary: AtomicUsize::new(0), mode, setup: Duration::ZERO }
    }

    /// The same, with the time since `began` as its setup time.
    pub fn started(self, began: Instant) -> Nodes<S, M> {
        Nodes { setup: began.elapsed(), ..self }
    }

    pub fn mode(&self) -> M {
        self.mode
    }

    /// How long the pair took to start, both servers and replication
    /// included.
    pub fn setup_time(&self) -> Duration {
        self.setup
    }

    /// Node `i` (0: the first primary, 1: the second), whatever its role now.
    pub fn node(&self, i: usize) -> &S {
        &self.nodes[i]
    }

    /// The node that is (or, killed, last was) the primary.
    pub fn primary(&self) -> &S {
        &self.nodes[self.primary_index()]
    }

    /// The other node (after a promotion, the old primary).
    pub fn other(&self) -> &S {
        &self.nodes[1 - self.primary_index()]
    }

    pub fn primary_index(&self) -> usize {
        self.primary.load(Ordering::SeqCst)
    }

    /// The other node is the primary from now on (it was promoted).
    pub fn promoted(&self) {
        self.primary.store(1 - self.primary_index(), Ordering::SeqCst);
    }

    /// Panics with `what` went wrong in pair `pair`, and each node's port
    /// and the last lines of its log (`port_and_log`).
    pub fn fail(&self, pair: &str, what: &str, port_and_log: impl Fn(&S) -> (u16, String)) -> ! {
        let ((p0, log0), (p1, log1)) = (port_and_log(&self.nodes[0]), port_and_log(&self.nodes[1]));
        panic!(
            "{pair} (primary node {}): {what}\n--- node 0 (port {p0}) ---\n{log0}\n--- node 1 (port {p1}) ---\n{log1}",
            self.primary_index()
        )
    }
}
