//! A Patroni-managed PostgreSQL pair owned by one test (issue 34, item 7):
//! an etcd of its own, two Patroni processes (each running its PostgreSQL
//! as user `postgres`), every port on 127.0.0.1, everything under one
//! directory. Patroni decides which node is the primary (its leader key in
//! etcd, a TTL of [`TTL`]); asynchronous streaming replication with
//! `pg_rewind`. Participants reach the primary through a multi-host DSN
//! with `target_session_attrs=read-write` ([`Patroni::dsn`]), as libpq
//! users do. Dropping it kills every process and removes the directory.
//!
//! Needs root, PostgreSQL, Debian's `patroni` and `etcd-server`: `bash
//! scripts/test.sh` installs them (`scripts/cluster.sh`).

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::pg_server::{children, free_port, pg_bin, signal, spawn_as_postgres, tail};
use super::{random_tag, wait_for};

/// Patroni's leader-key TTL: a primary that stops answering loses the key
/// this long after its last renewal, and the replica is promoted then.
pub const TTL: Duration = Duration::from_secs(10);
/// How long bootstrap (etcd, initdb, the replica's base backup) may take.
const UP_WITHIN: Duration = Duration::from_secs(60);

pub struct Patroni {
    dir: PathBuf,
    scope: String,
    etcd: Mutex<Option<Child>>,
    nodes: Vec<Node>,
}

struct Node {
    name: String,
    pg_port: u16,
    rest_port: u16,
    child: Mutex<Option<Child>>,
}

fn preflight() {
    for (file, package) in [("/usr/bin/patroni", "patroni"), ("/usr/bin/etcd", "etcd-server")] {
        assert!(
            Path::new(file).exists(),
            "{file} is missing: the Patroni test needs Debian's {package} (`bash scripts/test.sh` installs it; by \
             hand: `source scripts/cluster.sh`)"
        );
    }
}

/// The HTTP status of `GET path` on the REST API at `port`, if it answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    // The whole answer (closing early makes the server log a reset), up to
    // the end of the stream or the read timeout.
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).split_whitespace().nth(1)?.parse().ok()
}

impl Patroni {
    /// Starts etcd and two Patroni nodes; returns once one is the primary,
    /// the other a streaming replica, and the database `test` exists.
    pub fn start() -> Patroni {
        preflight();
        let tag = random_tag();
        let dir = PathBuf::from(format!("/tmp/le-patroni-{}-{tag}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let chown = Command::new("chown").arg("postgres:postgres").arg(&dir).status();
        assert!(chown.is_ok_and(|s| s.success()), "chown {} (needs root)", dir.display());
        let (client, peer) = (free_port(), free_port());
        let nodes = (1..=2)
            .map(|k| Node {
                name: format!("n{k}"),
                pg_port: free_port(),
                rest_port: free_port(),
                child: Mutex::new(None),
            })
            .collect();
        let p = Patroni { dir, scope: format!("le-{tag}"), etcd: Mutex::new(None), nodes };
        let etcd = Command::new("/usr/bin/etcd")
            .args(["--name", "le", "--initial-cluster-state", "new"])
            .arg("--data-dir")
            .arg(p.dir.join("etcd"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-cluster=le=http://127.0.0.1:{peer}"))
            .stdin(Stdio::null())
            .stdout(fs::File::create(p.dir.join("etcd.log")).unwrap())
            .stderr(Stdio::from(fs::File::create(p.dir.join("etcd.err")).unwrap()))
            .spawn()
            .expect("run etcd");
        *p.etcd.lock().unwrap() = Some(etcd);
        assert!(
            wait_for(Duration::from_secs(15), || http_status(client, "/version") == Some(200)),
            "etcd did not answer"
        );
        for (k, n) in p.nodes.iter().enumerate() {
            fs::write(p.config(k), p.yaml(n, client)).unwrap();
        }
        p.launch(0);
        assert!(
            wait_for(UP_WITHIN, || http_status(p.nodes[0].rest_port, "/primary") == Some(200)),
            "n1 never became primary\n{}",
            p.logs()
        );
        p.sql(0, "CREATE DATABASE test");
        p.launch(1);
        assert!(
            wait_for(UP_WITHIN, || http_status(p.nodes[1].rest_port, "/replica") == Some(200)),
            "n2 never became a replica\n{}",
            p.logs()
        );
        p
    }

    fn config(&self, k: usize) -> PathBuf {
        self.dir.join(format!("{}.yml", self.nodes[k].name))
    }

    fn yaml(&self, n: &Node, etcd: u16) -> String {
        let d = self.dir.display();
        format!(
            "scope: {scope}\nname: {name}\nlog:\n  level: INFO\n\
             restapi:\n  listen: 127.0.0.1:{rest}\n  connect_address: 127.0.0.1:{rest}\n\
             etcd3:\n  hosts: 127.0.0.1:{etcd}\n\
             bootstrap:\n  dcs:\n    ttl: {ttl}\n    loop_wait: 1\n    retry_timeout: 4\n\
             \x20   maximum_lag_on_failover: 1073741824\n    postgresql:\n      use_pg_rewind: true\n\
             \x20     parameters:\n        wal_level: replica\n        hot_standby: \"on\"\n\
             \x20       max_wal_senders: 10\n        max_replication_slots: 10\n        wal_log_hints: \"on\"\n\
             \x20       fsync: \"off\"\n        synchronous_commit: \"on\"\n\
             \x20 initdb:\n  - encoding: UTF8\n  - auth: trust\n\
             \x20 pg_hba:\n  - host all all 127.0.0.1/32 trust\n  - host replication all 127.0.0.1/32 trust\n\
             \x20 - local all all trust\n\
             postgresql:\n  listen: 127.0.0.1:{pg}\n  connect_address: 127.0.0.1:{pg}\n\
             \x20 data_dir: {d}/{name}\n  bin_dir: {bin}\n  pgpass: {d}/pgpass-{name}\n\
             \x20 basebackup:\n    - checkpoint: fast\n\
             \x20 authentication:\n    replication:\n      username: postgres\n    superuser:\n      username: postgres\n\
             \x20 parameters:\n    unix_socket_directories: {d}\n",
            scope = self.scope,
            name = n.name,
            rest = n.rest_port,
            pg = n.pg_port,
            ttl = TTL.as_secs(),
            bin = pg_bin().display(),
        )
    }

    fn launch(&self, k: usize) {
        let log = self.dir.join(format!("{}.log", self.nodes[k].name));
        let c = spawn_as_postgres(Command::new("/usr/bin/patroni").arg(self.config(k)), &log);
        *self.nodes[k].child.lock().unwrap() = Some(c);
    }

    /// `postgres://postgres@n1,n2/test?target_session_attrs=read-write`.
    pub fn dsn(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.pg_port)).collect();
        format!("postgres://postgres@{}/test?target_session_attrs=read-write", hosts.join(","))
    }

    /// The node Patroni has made the primary, if one answers so.
    pub fn primary(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&k| http_status(self.nodes[k].rest_port, "/primary") == Some(200))
    }

    /// Waits until node `k` is the primary and the other a running replica.
    pub fn wait_healthy(&self, primary: usize, within: Duration) -> bool {
        let other = 1 - primary;
        wait_for(within, || {
            http_status(self.nodes[primary].rest_port, "/primary") == Some(200)
                && http_status(self.nodes[other].rest_port, "/replica") == Some(200)
        })
    }

    /// Waits until the replica has replayed everything the primary has
    /// written so far (asynchronous replication: a move before that loses
    /// what it lacks, as Patroni's switchover would with a lagging replica).
    pub fn wait_caught_up(&self, within: Duration) -> bool {
        let Some(primary) = self.primary() else { return false };
        let lsn = |k: usize, q: &str| -> Option<String> {
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.nodes[k].pg_port);
            let mut c = postgres::Client::connect(&url, postgres::NoTls).ok()?;
            c.query_one(q, &[]).ok()?.get::<_, Option<String>>(0)
        };
        let Some(target) = lsn(primary, "SELECT pg_current_wal_lsn()::text") else { return false };
        let q = format!("SELECT (pg_last_wal_replay_lsn() >= '{target}'::pg_lsn)::text");
        wait_for(within, || lsn(1 - primary, &q).as_deref() == Some("true"))
    }

    fn patronictl(&self, args: &[&str]) {
        let out = Command::new("/usr/bin/patronictl").arg("-c").arg(self.config(0)).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "patronictl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `patronictl switchover` from the current primary to the other node;
    /// returns the new primary's index.
    pub fn switchover(&self) -> usize {
        let from = self.primary().expect("a primary to switch over from");
        let to = 1 - from;
        self.patronictl(&[
            "switchover",
            "--leader",
            &self.nodes[from].name,
            "--candidate",
            &self.nodes[to].name,
            "--force",
        ]);
        to
    }

    /// `patronictl failover` to the replica; returns its index.
    pub fn failover(&self) -> usize {
        let from = self.primary().expect("a primary to fail over from");
        let to = 1 - from;
        self.patronictl(&["failover", "--candidate", &self.nodes[to].name, "--force"]);
        to
    }

    /// SIGKILLs node `k` whole, Patroni and its PostgreSQL (every process
    /// under it), as a machine losing power; the other node is promoted
    /// once the leader key's TTL runs out.
    pub fn kill(&self, k: usize) {
        let Some(mut c) = self.nodes[k].child.lock().unwrap().take() else { return };
        let patroni = c.id();
        signal("STOP", &[patroni]);
        // Patroni starts the postmaster through a helper that exits, so the
        // postmaster is not its child: it is found by its pid file.
        let pidfile = self.dir.join(&self.nodes[k].name).join("postmaster.pid");
        let postmaster = fs::read_to_string(pidfile).ok().and_then(|t| t.lines().next()?.trim().parse::<u32>().ok());
        signal("STOP", &postmaster.into_iter().collect::<Vec<_>>());
        let mut all = vec![patroni];
        all.extend(postmaster);
        let mut k2 = 0;
        while k2 < all.len() {
            let more = children(all[k2]);
            signal("STOP", &more);
            all.extend(more);
            k2 += 1;
        }
        signal("KILL", &all);
        let _ = c.wait();
        let gone = wait_for(Duration::from_secs(10), || {
            all.iter().all(|p| {
                !Path::new(&format!("/proc/{p}")).exists()
                    || fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| s.contains(") Z"))
            })
        });
        assert!(gone, "node {k}'s processes still alive after SIGKILL");
    }

    /// Runs `q` on node `k` as `postgres` (database `postgres`).
    pub fn sql(&self, k: usize, q: &str) {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.nodes[k].pg_port);
        let mut c =
            postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| panic!("connect to node {k}: {e}"));
        c.batch_execute(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    }

    /// The tails of every log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            out.push_str(&format!("--- {}:\n{}\n", n.name, tail(&self.dir.join(format!("{}.log", n.name)))));
        }
        out
    }
}

impl Drop for Patroni {
    fn drop(&mut self) {
        for k in 0..self.nodes.len() {
            self.kill(k);
        }
        if let Some(mut e) = self.etcd.lock().unwrap().take() {
            let _ = e.kill();
            let _ = e.wait();
        }
        if std::env::var_os("LE_KEEP_PATRONI").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
