//! A replicated PostgreSQL owned by one scenario: a primary and a streaming
//! standby ([`PgPair`]), for the database failing over underneath a fleet
//! (issue 18).
//!
//! Both nodes are [`PgServer`]s (a copy of the chaos template each, as user
//! `postgres`, a free port of 127.0.0.1, a directory under /dev/shm, gone
//! when dropped). The standby is the second server stopped, emptied and
//! refilled with `pg_basebackup` from the running primary, which also
//! creates the standby's physical replication slot, so the primary keeps
//! every WAL segment the standby has not confirmed however far it falls
//! behind. Then it starts again with `standby.signal` and streams from the
//! primary through a [`FaultProxy`] (the replication link), which is how
//! [`PgPair::cut_replication`] stops WAL from reaching it while both servers
//! stay up, as a network partition between them would.
//!
//! [`PgMode::Sync`] names the standby in the primary's
//! `synchronous_standby_names` (with `synchronous_commit = on`, the chaos
//! template's setting): a commit is acknowledged once the standby has flushed
//! it, so a promotion after a crash loses nothing a client was told. Under
//! [`PgMode::Async`] (PostgreSQL's default, and Patroni's) it may lose the
//! last commits, and certainly does when the link was cut first.
//!
//! Clients follow the primary with [`PgPair::dsn`], a multi-host DSN with
//! `target_session_attrs=read-write`: tokio-postgres tries each host in
//! turn and keeps the first that accepts writes.
//!
//! A primary killed or stopped here stays down. Restarting it (with
//! `node(i).start_again()`) after the standby was promoted would give two
//! writable primaries with diverged histories: that is what an operator must
//! never let happen (fencing, STONITH, Patroni's leader key), and nothing in
//! an election on top can make it safe.

use std::fs;
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::faults::{Fault, FaultProxy};
use super::pg_server::PgServer;
use super::replicated::Nodes;
use super::wait_for;

/// How long the standby may take to stream, to become synchronous, to catch
/// up, or to accept writes once promoted.
const REPLICA_WAIT: Duration = Duration::from_secs(30);

/// Whether the primary waits for the standby before acknowledging a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgMode {
    /// Commits return once flushed on the primary; the standby follows as
    /// fast as it can (PostgreSQL's default).
    Async,
    /// `synchronous_standby_names` names the standby and
    /// `synchronous_commit = on`: a commit returns once the standby flushed
    /// its WAL.
    Sync,
}

/// A primary and a streaming standby. Node 0 starts as the primary, node 1
/// as its standby (application name and slot `node1`). Dropping the pair
/// stops both servers and removes their directories.
pub struct PgPair {
    nodes: Nodes<PgServer, PgMode>,
    /// The standby's replication connection goes through this proxy to the
    /// first primary.
    link: FaultProxy,
}

impl Deref for PgPair {
    type Target = Nodes<PgServer, PgMode>;

    fn deref(&self) -> &Nodes<PgServer, PgMode> {
        &self.nodes
    }
}

impl PgPair {
    /// Starts a primary and a standby streaming from it, in `mode`. On
    /// return the standby streams (and, in [`PgMode::Sync`], is the
    /// synchronous one) and has replayed everything the primary wrote.
    ///
    /// # Panics
    ///
    /// Without root, PostgreSQL's server binaries or `runuser` (run `bash
    /// scripts/test.sh`), or when a step does not finish within 30 s.
    pub fn start(mode: PgMode) -> PgPair {
        preflight();
        let began = Instant::now();
        let (primary, standby) = thread::scope(|s| {
            let other = s.spawn(PgServer::start);
            (PgServer::start(), other.join().unwrap())
        });
        let link = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], primary.port())));
        standby.stop();
        empty_dir(standby.dir());
        base_backup(&primary, standby.dir(), "node1");
        // The backup copies the primary's log and socket lock files too.
        for entry in fs::read_dir(standby.dir()).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "postgres.log" || name.starts_with(".s.PGSQL.") {
                fs::remove_file(entry.path()).ok();
            }
        }
        // Later lines of postgresql.auto.conf win. The standby never waits
        // for a standby of its own, also once promoted.
        let conf = format!(
            "\n# PgPair: a standby of node 0 through the replication link\n\
             primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=node1 connect_timeout=2'\n\
             primary_slot_name = 'node1'\n\
             wal_retrieve_retry_interval = '100ms'\n\
             wal_receiver_status_interval = '1s'\n\
             synchronous_standby_names = ''\n",
            link.port()
        );
        append(&standby.dir().join("postgresql.auto.conf"), &conf);
        fs::write(standby.dir().join("standby.signal"), "").unwrap();
        chown_postgres(standby.dir());
        standby.start_again();
        let pair = PgPair { nodes: Nodes::new(primary, standby, mode), link };
        pair.wait_replication("state", "streaming");
        if mode == PgMode::Sync {
            let p = pair.primary();
            p.sql("ALTER SYSTEM SET synchronous_standby_names = 'node1'");
            p.sql("SELECT pg_reload_conf()");
            pair.wait_replication("sync_state", "sync");
        }
        if !pair.wait_caught_up(REPLICA_WAIT) {
            pair.fail(&format!("the standby did not catch up within {REPLICA_WAIT:?}"));
        }
        PgPair { nodes: pair.nodes.started(began), ..pair }
    }

    /// The other node: the standby (after a promotion, the old primary).
    /// The primary, after [`PgPair::kill_primary`], is the dead one until
    /// [`PgPair::promote_standby`].
    pub fn standby(&self) -> &PgServer {
        self.other()
    }

    /// Both nodes in one DSN, the way a client follows the primary:
    /// `postgres://postgres@127.0.0.1:P0,127.0.0.1:P1/test?target_session_attrs=read-write`.
    pub fn dsn(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/test?target_session_attrs=read-write",
            self.node(0).port(),
            self.node(1).port()
        )
    }

    /// The standby's path to the first primary, for faults other than a cut.
    pub fn replication_link(&self) -> &FaultProxy {
        &self.link
    }

    /// SIGKILLs the primary's postmaster and every child (a machine losing
    /// power, without the kernel losing what it had been given); returns
    /// once they are gone. It stays down.
    pub fn kill_primary(&self) {
        self.primary().crash();
    }

    /// Promotes the standby (`pg_promote`, waiting for it) and returns once
    /// a fresh session on it accepts writes (what `target_session_attrs=
    /// read-write` checks), with how long that took. From then on it is
    /// [`PgPair::primary`]. Whatever it had not received is lost.
    pub fn promote_standby(&self) -> Duration {
        let began = Instant::now();
        let s = self.standby();
        if s.sql("SELECT pg_is_in_recovery()::text") != ["true"] {
            self.fail("promote_standby: the standby is not in recovery (already promoted?)");
        }
        if s.sql("SELECT pg_promote(true, 30)::text") != ["true"] {
            self.fail("promote_standby: pg_promote() did not finish within 30 s");
        }
        let writable = wait_for(REPLICA_WAIT, || {
            s.sql("SELECT (NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off')::text")
                == ["true"]
        });
        if !writable {
            self.fail("promote_standby: the promoted standby does not accept writes within 30 s");
        }
        // A write that needs a transaction id: refused during recovery.
        s.sql("SELECT txid_current()");
        self.promoted();
        began.elapsed()
    }

    /// Stops WAL from reaching the standby while both servers stay up: the
    /// replication link swallows everything from now on (held, as a
    /// partition holds it, and delivered if restored). On a
    /// [`PgMode::Sync`] pair every commit then waits until the link is
    /// restored: use an async pair for a standby that lags.
    pub fn cut_replication(&self) {
        self.link.set(Fault::Blackhole);
    }

    /// Lets WAL flow to the standby again.
    pub fn restore_replication(&self) {
        self.link.set(Fault::Pass);
    }

    /// The standby's `sync_state` in the primary's `pg_stat_replication`
    /// (`sync` for a synchronous standby that is connected, `async`), or
    /// `""` while it is not streaming.
    pub fn sync_state(&self) -> String {
        let q = "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'node1'";
        self.primary().sql(q).into_iter().next().unwrap_or_default()
    }

    /// Bytes of WAL the primary has flushed and the standby not yet
    /// replayed (0: caught up).
    pub fn lag(&self) -> u64 {
        let flushed = self.primary().sql("SELECT pg_current_wal_flush_lsn()::text");
        let behind = self
            .standby()
            .sql(&format!("SELECT greatest(pg_wal_lsn_diff('{}', pg_last_wal_replay_lsn()), 0)::bigint", flushed[0]));
        behind[0].parse().unwrap_or_else(|e| self.fail(&format!("lag: {behind:?}: {e}")))
    }

    /// Waits until the standby has replayed everything the primary had
    /// flushed when asked; false after `within`.
    pub fn wait_caught_up(&self, within: Duration) -> bool {
        wait_for(within, || self.lag() == 0)
    }

    /// A clean switchover: a fast shutdown of the primary (its walsender
    /// sends all WAL, the shutdown checkpoint included, and waits for the
    /// standby to confirm it before the postmaster exits), a check that the
    /// standby received up to that checkpoint, then [`PgPair::promote_standby`].
    /// Returns how long the whole took (no primary for that long). The old
    /// primary stays stopped.
    pub fn switchover(&self) -> Duration {
        let began = Instant::now();
        let old = self.primary();
        old.stop();
        let checkpoint = controldata(old.dir(), "Latest checkpoint location:");
        let s = self.standby();
        let received = wait_for(REPLICA_WAIT, || {
            s.sql(&format!("SELECT (pg_last_wal_receive_lsn() >= '{checkpoint}'::pg_lsn)::text")) == ["true"]
        });
        if !received {
            self.fail(&format!("switchover: the standby never received the shutdown checkpoint {checkpoint}"));
        }
        self.promote_standby();
        began.elapsed()
    }

    /// Waits until the primary's `pg_stat_replication` row of `node1` has
    /// `column = want`.
    fn wait_replication(&self, column: &str, want: &str) {
        let q = format!("SELECT {column} FROM pg_stat_replication WHERE application_name = 'node1'");
        if !wait_for(REPLICA_WAIT, || self.primary().sql(&q) == [want]) {
            self.fail(&format!("the standby's {column} is not {want} within {REPLICA_WAIT:?}"));
        }
    }

    fn fail(&self, what: &str) -> ! {
        self.nodes.fail("PgPair", what, |n| (n.port(), n.log_tail()))
    }
}

/// `pg_basebackup` of the running `primary` into the empty `dir`, creating
/// the physical slot `slot` on the primary (its WAL is streamed through it
/// during the backup, so none can go missing in between).
fn base_backup(primary: &PgServer, dir: &Path, slot: &str) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(pg_bin().join("pg_basebackup"))
        .args(["-h", "127.0.0.1", "-U", "postgres", "-w", "-X", "stream", "-c", "fast", "--no-sync", "--no-manifest"])
        .arg("-p")
        .arg(primary.port().to_string())
        .args(["-C", "-S", slot, "-D"])
        .arg(dir)
        .current_dir("/tmp")
        .output()
        .unwrap_or_else(|e| panic!("runuser pg_basebackup: {e}: run `bash scripts/test.sh`"));
    assert!(
        out.status.success(),
        "pg_basebackup from port {} into {}: {}\n--- primary's log ---\n{}",
        primary.port(),
        dir.display(),
        String::from_utf8_lossy(&out.stderr),
        primary.log_tail()
    );
}

/// One line of `pg_controldata` of the stopped cluster `dir`, the value after
/// `key`.
fn controldata(dir: &Path, key: &str) -> String {
    let out = Command::new(pg_bin().join("pg_controldata")).arg(dir).output().expect("pg_controldata");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix(key));
    line.map(|v| v.trim().to_owned()).unwrap_or_else(|| panic!("pg_controldata {}: no {key:?}\n{text}", dir.display()))
}

/// Removes everything inside `dir`, keeping `dir` (its owner and mode).
fn empty_dir(dir: &Path) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        let r = if entry.file_type().is_ok_and(|t| t.is_dir()) { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
        r.unwrap_or_else(|e| panic!("remove {}: {e}", p.display()));
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new().append(true).open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes()).unwrap();
}

fn chown_postgres(dir: &Path) {
    let out = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).output().expect("chown");
    assert!(out.status.success(), "chown {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
}

/// The newest installed PostgreSQL's binaries.
fn pg_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let newest = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .max();
        let Some(v) = newest else {
            panic!("no PostgreSQL server in /usr/lib/postgresql: run `bash scripts/test.sh`, which installs it")
        };
        PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"))
    })
}

/// Fails at once, saying what to run, when this machine cannot run a pair.
fn preflight() {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().next());
    assert!(
        uid == Some("0"),
        "PgPair needs root (to run servers as user postgres): run `bash scripts/test.sh` as root"
    );
    for tool in ["pg_basebackup", "pg_controldata", "postgres"] {
        let path = pg_bin().join(tool);
        assert!(path.exists(), "{} is missing: run `bash scripts/test.sh`, which installs PostgreSQL", path.display());
    }
    assert!(
        Command::new("runuser").arg("--help").output().is_ok(),
        "runuser is missing (util-linux): run `bash scripts/test.sh` on a Debian-like machine"
    );
}
