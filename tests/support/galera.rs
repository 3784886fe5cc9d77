//! A MariaDB Galera cluster owned by one test: every node a
//! [`MariaServer`] of its own (its data directory, ports and error log)
//! with the `wsrep` options of a multi-primary cluster on 127.0.0.1. The
//! first node forms the cluster (`--wsrep-new-cluster`); each other joins
//! it in turn and takes a copy of its data (state transfer by `rsync`).
//! Dropping the cluster kills every node and removes its directory.
//!
//! Needs Debian's `galera-4` (the provider library) and `rsync`:
//! `bash scripts/test.sh` installs them (`scripts/cluster.sh`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::maria_server::{free_port, MariaServer};
use super::{random_tag, wait_for};

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";
/// How long a node may take to join (a state transfer included) and sync.
const SYNCED_WITHIN: Duration = Duration::from_secs(60);

/// What a node's server runs with, beyond the usual options.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Environment for the node's `mariadbd` (libfaketime's, for a node
    /// whose clock is off).
    pub env: Vec<(String, String)>,
}

impl NodeOptions {
    /// A node whose clock reads `offset` (libfaketime's syntax: `+4s`,
    /// `-4s`) away from the machine's. Only the wall clock moves (what
    /// `UTC_TIMESTAMP()` reads); the monotonic clock Galera's own timers use
    /// stays the machine's.
    pub fn clock(offset: &str) -> NodeOptions {
        assert!(
            Path::new(FAKETIME).exists(),
            "{FAKETIME} is missing: the skewed-clock tests need Debian's faketime (`bash scripts/test.sh` installs it; \
             by hand: `source scripts/cluster.sh`)"
        );
        NodeOptions {
            env: vec![
                ("LD_PRELOAD".into(), FAKETIME.into()),
                ("FAKETIME".into(), offset.into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
                ("FAKETIME_NO_CACHE".into(), "1".into()),
            ],
        }
    }
}

/// libfaketime, from Debian's `faketime`.
pub const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A running cluster of [`MariaServer`]s.
pub struct Galera {
    nodes: Vec<MariaServer>,
    pub started_in: Duration,
}

/// Fails with how to get what is missing.
fn preflight() {
    for (file, package) in
        [(PROVIDER, "galera-4"), ("/usr/bin/rsync", "rsync"), ("/usr/bin/wsrep_sst_rsync", "mariadb-server")]
    {
        assert!(
            Path::new(file).exists(),
            "{file} is missing: the Galera tests need Debian's {package} (`bash scripts/test.sh` installs it; by hand: \
             `source scripts/cluster.sh`)"
        );
    }
}

impl Galera {
    /// Starts `n` nodes, all with default options.
    pub fn start(n: usize) -> Galera {
        Galera::start_with(&vec![NodeOptions::default(); n])
    }

    /// Starts one node per entry of `nodes`, with its options; returns once
    /// every node is synced in one primary component of them all.
    ///
    /// # Panics
    ///
    /// Without Galera or rsync (see [`preflight`]), or when a node does not
    /// come up or sync within [`SYNCED_WITHIN`] (its log's tail is in the
    /// message).
    pub fn start_with(nodes: &[NodeOptions]) -> Galera {
        preflight();
        let began = Instant::now();
        // Group communication, incremental and snapshot transfer: three
        // ports a node, all known before the first starts.
        let ports: Vec<[u16; 3]> = nodes.iter().map(|_| [free_port(), free_port(), free_port()]).collect();
        let address = ports.iter().map(|p| format!("127.0.0.1:{}", p[0])).collect::<Vec<_>>().join(",");
        let cluster = format!("le-{}", random_tag());
        let mut started: Vec<MariaServer> = Vec::new();
        for (k, (opts, [gcomm, ist, sst])) in nodes.iter().zip(&ports).enumerate() {
            let mut o = vec![
                "--binlog-format=ROW".to_owned(),
                "--innodb-autoinc-lock-mode=2".to_owned(),
                "--wsrep-on=ON".to_owned(),
                format!("--wsrep-provider={PROVIDER}"),
                format!("--wsrep-cluster-address=gcomm://{address}"),
                format!("--wsrep-cluster-name={cluster}"),
                format!("--wsrep-node-name=n{}", k + 1),
                format!("--wsrep-node-address=127.0.0.1:{gcomm}"),
                format!(
                    "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{gcomm};ist.recv_addr=127.0.0.1:{ist};\
                     gcache.size=16M;evs.suspect_timeout=PT5S;evs.inactive_timeout=PT10S"
                ),
                format!("--wsrep-sst-receive-address=127.0.0.1:{sst}"),
                "--wsrep-sst-method=rsync".to_owned(),
            ];
            if k == 0 {
                o.push("--wsrep-new-cluster".to_owned());
            }
            let args: Vec<&str> = o.iter().map(String::as_str).collect();
            let node = MariaServer::start_env(&args, &opts.env);
            let synced = wait_for(SYNCED_WITHIN, || {
                status(&node, "wsrep_local_state_comment") == "Synced"
                    && status(&node, "wsrep_cluster_size") == (k + 1).to_string()
            });
            if !synced {
                panic!(
                    "galera node n{} did not sync within {SYNCED_WITHIN:?} (state {:?}, cluster size {:?}); its log ends:\n{}",
                    k + 1,
                    status(&node, "wsrep_local_state_comment"),
                    status(&node, "wsrep_cluster_size"),
                    node.error_log_tail()
                );
            }
            started.push(node);
        }
        Galera { nodes: started, started_in: began.elapsed() }
    }

    pub fn node(&self, k: usize) -> &MariaServer {
        &self.nodes[k]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Root's URL on node `k`, database `test`.
    pub fn url(&self, k: usize) -> String {
        self.nodes[k].admin_url()
    }

    pub fn addr(&self, k: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.nodes[k].port()))
    }

    /// Waits until every node has applied what node `from` has committed
    /// (`wsrep_last_committed` as high everywhere).
    pub fn settle(&self, from: usize) {
        let want: u64 = status(&self.nodes[from], "wsrep_last_committed").parse().unwrap_or(0);
        let all = wait_for(Duration::from_secs(10), || {
            self.nodes.iter().all(|n| status(n, "wsrep_last_committed").parse::<u64>().unwrap_or(0) >= want)
        });
        assert!(all, "the nodes did not apply node {from}'s writes within 10 s");
    }
}

/// A `wsrep` status variable of `node`, as text ("" when the server cannot
/// say yet).
pub fn status(node: &MariaServer, name: &str) -> String {
    node.try_query(&format!("SHOW GLOBAL STATUS LIKE '{name}'"), 1).into_iter().next().unwrap_or_default()
}
