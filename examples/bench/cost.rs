//! Row 4: what one election costs the database per minute at the default
//! timings (lease 15 s, renew 5 s, retry period 3 s), with a leader and two
//! followers, each with a store of its own, over a window without elections.
//!
//! Each store call is one round trip carrying one query; on PostgreSQL that
//! query is `SET LOCAL lock_timeout; SET LOCAL statement_timeout; <statement>`
//! (3 statements), on MySQL/MariaDB `SET SESSION …; START TRANSACTION; …;
//! COMMIT; SET SESSION …` (inspect and release 5 statements, renew and
//! acquire 6). The leader alone goes through a [`FaultProxy`] left at
//! `Pass`, whose byte counters give the bytes on the wire (TCP payload, both
//! directions) per renewal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, Store};

use crate::common::{pg_client, poll, sample, url_port, via_port, violation, Calls, Counting, Table, Verdict};
use crate::faults::FaultProxy;

/// Which server, and how to make a store on it for a table.
#[derive(Clone, Copy)]
pub enum Kind {
    Postgres,
    MariaDb,
}

/// What a worker process of the benchmark is told through its
/// environment: the server, the table, the election or group, and its own
/// identity, in `{prefix}_KIND`, `_URL`, `_TABLE`, `_NAME` and `_ID`.
pub struct WorkerEnv {
    pub kind: Kind,
    pub url: String,
    pub table: String,
    pub name: String,
    pub id: String,
}

impl WorkerEnv {
    /// Sets the variables on `cmd`, the worker about to start.
    fn set(&self, prefix: &str, cmd: &mut std::process::Command) {
        for (key, value) in [
            ("KIND", self.kind.label()),
            ("URL", &self.url),
            ("TABLE", &self.table),
            ("NAME", &self.name),
            ("ID", &self.id),
        ] {
            cmd.env(format!("{prefix}_{key}"), value);
        }
    }

    /// Starts this executable as a worker with these orders, `marker` set
    /// (what makes it a worker) and the `extra` variables; its stdin and
    /// stdout piped, its stderr the benchmark's. Returns it and its stdout.
    pub fn start(
        &self, prefix: &str, marker: &str, extra: &[(String, String)],
    ) -> Result<(std::process::Child, std::process::ChildStdout), String> {
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = Command::new(exe);
        self.set(prefix, &mut cmd);
        let mut child = cmd
            .env(marker, "1")
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start worker {}: {e}", self.id))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok((child, stdout))
    }

    /// Reads them, in the worker.
    pub fn read(prefix: &str) -> Result<WorkerEnv, String> {
        let var = |k: &str| std::env::var(format!("{prefix}_{k}")).map_err(|_| format!("{prefix}_{k} is not set"));
        let named = var("KIND")?;
        let kind = [Kind::Postgres, Kind::MariaDb]
            .into_iter()
            .find(|k| k.label() == named)
            .ok_or(format!("unknown kind {named:?}"))?;
        Ok(WorkerEnv { kind, url: var("URL")?, table: var("TABLE")?, name: var("NAME")?, id: var("ID")? })
    }
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Postgres => "PostgreSQL",
            Kind::MariaDb => "MariaDB",
        }
    }
    /// Statements in one inspect query and one renew query.
    fn statements(self) -> (u64, u64) {
        match self {
            Kind::Postgres => (3, 3),
            Kind::MariaDb => (5, 6),
        }
    }
    pub fn store(self, url: &str, table: &str) -> Result<Arc<dyn Store>, String> {
        self.store_with_feed(url, table, true)
    }

    /// A store whose feed of releases is on or off (PostgreSQL: LISTEN;
    /// MariaDB: named locks).
    pub fn store_with_feed(self, url: &str, table: &str, feed: bool) -> Result<Arc<dyn Store>, String> {
        self.build(url, table, feed, None, true)
    }

    /// A store on `table` with its feed on or off, a pool of `pool`
    /// connections (`None`: the driver's default), and the schema made if
    /// `schema`.
    pub fn build(
        self, url: &str, table: &str, feed: bool, pool: Option<u32>, schema: bool,
    ) -> Result<Arc<dyn Store>, String> {
        let made = |e: leaderelection::StoreError| format!("ensure_schema: {e}");
        let s: Arc<dyn Store> = match self {
            Kind::Postgres => {
                let b = leaderelection::PostgresStore::builder(url).table("public", table).release_feed(feed);
                let b = match pool {
                    Some(n) => b.pool_size(n),
                    None => b,
                };
                let s = b.build().map_err(|e| e.to_string())?;
                if schema {
                    s.ensure_schema().map_err(made)?;
                }
                Arc::new(s)
            }
            Kind::MariaDb => {
                let b = leaderelection::MySqlStore::builder(url).table(table).release_feed(feed);
                let b = match pool {
                    Some(n) => b.pool_size(n as usize),
                    None => b,
                };
                let s = b.build().map_err(|e| e.to_string())?;
                if schema {
                    s.ensure_schema().map_err(made)?;
                }
                Arc::new(s)
            }
        };
        Ok(s)
    }
}

/// What one backend measured.
pub struct Cost {
    kind: Kind,
    minutes: f64,
    leader: Calls,
    followers: [Calls; 2],
    bytes_per_renewal: f64,
    /// `(n_tup_hot_upd, n_tup_upd)` of the table, PostgreSQL only.
    hot: Option<(i64, i64)>,
}

pub fn measure(kind: Kind, url: &str, window: Duration) -> Result<Cost, String> {
    let table = crate::common::OwnTable::new(url, "cost");
    let proxy = FaultProxy::start(([127, 0, 0, 1], url_port(url)).into());
    let leader_store = Counting::new(kind.store(&via_port(url, proxy.port()), &table.name)?, false);
    let stores =
        [Counting::new(kind.store(url, &table.name)?, false), Counting::new(kind.store(url, &table.name)?, false)];
    let name = "cost";
    let leader =
        Elector::start(Config::new(Arc::clone(&leader_store), name).identity("leader")).map_err(|e| e.to_string())?;
    let guard = leader.wait_leader_timeout(Duration::from_secs(20)).map_err(|e| format!("leader: {e}"))?;
    let followers = stores
        .iter()
        .enumerate()
        .map(|(i, s)| Elector::start(Config::new(Arc::clone(s), name).identity(format!("follower-{i}"))))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    poll(Duration::from_secs(10), Duration::from_millis(10), || {
        followers.iter().all(|f| f.status().leader.is_some()).then_some(())
    })
    .ok_or("the followers never saw the lease")?;

    let (l0, f0, b0) = (leader_store.calls(), stores.each_ref().map(|s| s.calls()), proxy.stats());
    let t0 = Instant::now();
    let all = [&leader, &followers[0], &followers[1]];
    while t0.elapsed() < window {
        let s = sample(&all);
        if s.overlap {
            violation(&format!("{}: two leaders at once", kind.label()));
        }
        if s.fences[0] != Some(guard.fence()) || s.leaders != 1 {
            return Err(format!("{}: the election changed during the window", kind.label()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let (l1, f1, b1) = (leader_store.calls(), stores.each_ref().map(|s| s.calls()), proxy.stats());
    let leader_calls = l1.since(&l0);
    let bytes = (b1.bytes_up - b0.bytes_up) + (b1.bytes_down - b0.bytes_down);
    let bytes_per_renewal = bytes as f64 / leader_calls.renew.max(1) as f64;

    let hot = match kind {
        Kind::Postgres => Some(hot_updates(url, &table.name, l1.renew)?),
        Kind::MariaDb => None,
    };
    drop(guard);
    for e in followers.iter().chain([&leader]) {
        let _ = e.shutdown();
    }
    Ok(Cost {
        kind,
        minutes,
        leader: leader_calls,
        followers: [f1[0].since(&f0[0]), f1[1].since(&f0[1])],
        bytes_per_renewal,
        hot,
    })
}

/// `(n_tup_hot_upd, n_tup_upd)` of the table since it was created, once the
/// statistics show at least `renewals` updates (backends flush them lazily).
fn hot_updates(url: &str, table: &str, renewals: u64) -> Result<(i64, i64), String> {
    let mut c = pg_client(url)?;
    let q = "SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relname = $1";
    let mut last = (0, 0);
    poll(Duration::from_secs(20), Duration::from_millis(200), || {
        let row = c.query_opt(q, &[&table]).ok().flatten()?;
        last = (row.get(0), row.get(1));
        (last.1 >= renewals as i64).then_some(())
    })
    .ok_or_else(|| format!("pg_stat_user_tables shows {} updates of {table}, not {renewals}", last.1))?;
    Ok(last)
}

pub fn report(c: &Cost, table: &mut Table) {
    let label = c.kind.label();
    let per_min = |n: u64| n as f64 / c.minutes;
    let (si, sr) = c.kind.statements();
    table.add(
        format!("4. calls per minute, {label}: leader / each follower"),
        format!(
            "{:.1} / {:.1} and {:.1} ({:.0} / {:.0} and {:.0} statements; window {:.1} min)",
            per_min(c.leader.total()),
            per_min(c.followers[0].total()),
            per_min(c.followers[1].total()),
            per_min(c.leader.renew * sr + c.leader.inspect * si),
            per_min(c.followers[0].inspect * si + c.followers[0].writes() * sr),
            per_min(c.followers[1].inspect * si + c.followers[1].writes() * sr),
            c.minutes
        ),
        "—",
        Verdict::Info,
    );
    let writes = c.followers[0].writes() + c.followers[1].writes();
    table.add(format!("4. writes by followers, {label}"), format!("{writes}"), "0", Verdict::of(writes == 0));
    if let Some((hot, upd)) = c.hot {
        let share = if upd > 0 { hot as f64 / upd as f64 } else { 0.0 };
        table.add(
            format!("4. renewals that were HOT updates, {label}"),
            format!("{:.1} % ({hot} of {upd})", share * 100.0),
            "≥ 95 %",
            Verdict::of(share >= 0.95),
        );
    }
    table.add(
        format!("4. bytes on the wire per renewal, {label}"),
        format!("{:.0} B ({} renewals)", c.bytes_per_renewal, c.leader.renew),
        "—",
        Verdict::Info,
    );
}
