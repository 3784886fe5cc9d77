//! Shared by the CLI suites: running the real binary, children that log
//! their own timestamps, and the scenarios run on each database.
#![allow(dead_code)] // each suite uses a different part

#[path = "../../../tests/support/poll.rs"]
mod poll;
#[path = "../../../tests/support/proxy.rs"]
pub mod proxy;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The cases both suites run, each a test of its own on `$db` (named as
/// below; the flows are the functions of this module): `mysql.rs` and
/// `postgres.rs` invoke it, then add their server's own cases.
#[allow(unused_macros)] // usage.rs runs none
macro_rules! every_server_case {
    ($db:expr) => {
        every_server_case!(@each $db;
            a_slot_runs_once_across_staggered_runs => slot_runs_once(),
            a_slot_killed_mid_run_stays_run_unless_retried => slot_killed_mid_run(),
            a_failed_slot_is_retried_on_request_and_every_names_the_day => slot_failed_and_every(),
            two_runs_with_one_identity_never_overlap => one_identity(),
            two_tools_contend_and_children_never_overlap => contention(),
            sigkill_of_the_leading_tool_kills_its_child_and_hands_over_after_the_lease => sigkill_handover(),
            swallowed_database_stops_the_child_before_the_deadline_and_exits_79 => swallowed(false),
            sigterm_is_forwarded_and_the_lease_released => sigterm_forwarded(),
            child_environment_and_status => env_and_status(),
            exit_codes_with_a_server => exit_codes(),
            the_sentinel_stays_quiet_while_the_tool_lives => sentinel_quiet(),
            a_waiting_run_has_its_sentinel_ready_and_replaces_a_killed_one => spare_sentinel(),
            loop_campaigns_again_after_losing_leadership => loop_after_loss(),
            loop_leaves_no_zombies => no_zombies_in_loop(),
            the_childs_lease_check_passes_in_the_term_and_fails_after_it => checked_writes(),
            status_of_a_row_held_for_nobody_after_a_failover_is_nobody_leads => held_row_status(),
            wait_0_tries_once_and_quiet_says_nothing_when_losing => try_once_and_quiet(),
            schema_apply_creates_the_table_a_missing_one_says_how => schema_apply(),
            a_forwarded_sigterm_the_child_ignores_is_followed_by_sigkill_after_grace => forwarded_signal_escalates(),
            the_child_gets_neither_the_dsn_nor_ignored_signals => child_env_and_signals(),
            a_waiting_run_leads_at_once_after_a_release => release_feed_handover(true),
            without_the_feed_a_waiting_run_leads_only_at_its_next_poll => release_feed_handover(false),
        );
    };
    (@each $db:expr; $($test:ident => $flow:ident($($arg:expr),*)),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                $flow(&$db $(, $arg)*);
            }
        )+
    };
}
#[allow(unused_imports)]
pub(crate) use every_server_case;

pub const BIN: &str = env!("CARGO_BIN_EXE_leaderelection");
/// The timings of every run: lease 2.5 s, margin 250 ms, renew 400 ms.
pub const TIMING: [&str; 12] = [
    "--lease",
    "2.5s",
    "--renew",
    "400ms",
    "--retry",
    "300ms",
    "--op-timeout",
    "500ms",
    "--margin",
    "250ms",
    "--grace",
    "500ms",
];
pub const LEASE: Duration = Duration::from_millis(2500);
pub const MARGIN: Duration = Duration::from_millis(250);
pub const RENEW: Duration = Duration::from_millis(400);
pub const RETRY: Duration = Duration::from_millis(300);
pub const PASSWORD: &str = "pw-s3cret";

/// An election database: a DSN and the `--table` every run passes.
#[derive(Clone)]
pub struct Db {
    pub dsn: String,
    pub table: String,
    pub label: &'static str,
}

fn env_or_fail(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run `source scripts/db.sh; source scripts/mysql.sh` first (or `bash scripts/test.sh`)"
        )
    })
}

impl Db {
    /// PostgreSQL from `LE_PG_DSN`, table `public.le_cli_pg`, created once.
    pub fn pg() -> Db {
        static ONCE: std::sync::Once = std::sync::Once::new();
        let dsn = env_or_fail("LE_PG_DSN");
        ONCE.call_once(|| {
            let store = leaderelection::PostgresStore::builder(&dsn).table("public", "le_cli_pg").build().unwrap();
            store.ensure_schema().expect("create the CLI test table on PostgreSQL");
        });
        Db { dsn, table: "public.le_cli_pg".into(), label: "pg" }
    }

    /// MariaDB from `LE_MYSQL_URL`, table `le_cli_mysql`, created once.
    pub fn mysql() -> Db {
        static ONCE: std::sync::Once = std::sync::Once::new();
        let dsn = env_or_fail("LE_MYSQL_URL");
        ONCE.call_once(|| {
            let store = leaderelection::MySqlStore::builder(&dsn).table("le_cli_mysql").build().unwrap();
            store.ensure_schema().expect("create the CLI test table on MariaDB");
        });
        Db { dsn, table: "le_cli_mysql".into(), label: "mysql" }
    }

    /// The server's `host:port`.
    pub fn addr(&self) -> String {
        split_dsn(&self.dsn).1.to_string()
    }

    /// The DSN with its port replaced (a proxy's, a closed one).
    pub fn via_port(&self, port: u16) -> String {
        let (head, hostport, tail) = split_dsn(&self.dsn);
        let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
        format!("{head}{host}:{port}{tail}")
    }

    /// A unique election name for one test.
    pub fn name(&self, test: &str) -> String {
        format!("cli-{}-{test}-{}", self.label, std::process::id())
    }

    /// `leaderelection run` against this database; extra flags, then `sh -c script`.
    pub fn run(&self, name: &str, extra: &[&str], script: &str) -> Tool {
        self.run_dsn(&self.dsn, name, extra, script)
    }

    pub fn run_dsn(&self, dsn: &str, name: &str, extra: &[&str], script: &str) -> Tool {
        let dir = TempDir::new();
        let stderr = dir.path().join("stderr");
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--dsn", dsn, "--table", &self.table, "--name", name]).args(TIMING).args(extra);
        cmd.args(["--", "sh", "-c", script]);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(fs::File::create(&stderr).unwrap());
        Tool { child: cmd.spawn().unwrap(), stderr, _dir: dir }
    }

    /// `leaderelection status` against this database.
    pub fn status(&self, name: &str, json: bool) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.args(["status", "--dsn", &self.dsn, "--table", &self.table, "--name", name]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    }
}

/// `(scheme://user@, host:port, /db?params)`.
fn split_dsn(dsn: &str) -> (&str, &str, &str) {
    let start = dsn.find('@').map_or_else(|| dsn.find("://").unwrap() + 3, |i| i + 1);
    let end = dsn[start..].find('/').map_or(dsn.len(), |i| start + i);
    (&dsn[..start], &dsn[start..end], &dsn[end..])
}

/// A running `leaderelection` process; SIGKILLed in `Drop` if still running.
pub struct Tool {
    pub child: Child,
    stderr: PathBuf,
    _dir: TempDir,
}

impl Tool {
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the tool to exit; panics after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let until = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < until, "the tool did not exit within {timeout:?}; stderr: {}", self.stderr());
            thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn code(&mut self, timeout: Duration) -> i32 {
        let status = self.wait(timeout);
        status.code().unwrap_or_else(|| panic!("tool died of a signal: {status:?}; stderr: {}", self.stderr()))
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A directory under the system temp dir, removed in `Drop`.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("le-cli-{}-{n}", std::process::id()));
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// Polls `cond` every 5 ms until it holds; false after `timeout`.
pub fn wait_for(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    poll::poll_until(timeout, Duration::from_millis(5), cond)
}

/// One line a child wrote: `kind ns pid rest…`.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: String,
    pub ns: u128,
    pub pid: u32,
    pub rest: String,
}

/// The events in `file`, in the order written.
pub fn events(file: &Path) -> Vec<Event> {
    let text = fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(4, ' ');
            Some(Event {
                kind: parts.next()?.to_string(),
                ns: parts.next()?.parse().ok()?,
                pid: parts.next()?.parse().ok()?,
                rest: parts.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

pub fn first(file: &Path, kind: &str) -> Option<Event> {
    events(file).into_iter().find(|e| e.kind == kind)
}

/// A child script: logs `start` (with identity and fence), on SIGTERM logs
/// `term` and exits `term_exit`, otherwise works `secs` and logs `end`. The
/// trap is set before `start` is logged, so a test that signals the child
/// once it has seen `start` always meets the trap (it used to race the
/// shell between the two, which then died of the signal: exit 143).
pub fn child(file: &Path, secs: &str, term_exit: i32) -> String {
    let f = file.display();
    format!(
        "trap 'echo \"term $(date +%s%N) $$\" >> {f}; exit {term_exit}' TERM; \
         echo \"start $(date +%s%N) $$ $LEADERELECTION_IDENTITY $LEADERELECTION_FENCE\" >> {f}; \
         sleep {secs} & wait $!; echo \"end $(date +%s%N) $$\" >> {f}"
    )
}

/// A process as /proc/PID/stat shows it.
#[derive(Clone, Copy, Debug)]
pub struct Proc {
    pub pid: u32,
    pub state: char,
    pub ppid: u32,
    pub pgid: u32,
}

/// Process `pid`, unless it was reaped.
pub fn proc_stat(pid: u32) -> Option<Proc> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp …`; comm may hold anything but the last ')'.
    let mut f = stat.rsplit_once(')')?.1.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some(Proc { pid, state, ppid: f.next()?.parse().ok()?, pgid: f.next()?.parse().ok()? })
}

/// Every process on the host.
pub fn procs() -> Vec<Proc> {
    let dir = fs::read_dir("/proc").unwrap();
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter_map(proc_stat).collect()
}

/// The processes of group `pgid` that have not exited (zombies left out).
pub fn live_in_group(pgid: u32) -> Vec<Proc> {
    procs().into_iter().filter(|p| p.pgid == pgid && p.state != 'Z').collect()
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub fn gone(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|p| p.state == 'Z')
}

/// A child's process group, recorded while it runs. Dropped, it SIGKILLs
/// what is left of the group (a failed test leaves nothing running), but
/// only members seen when recorded: never a group whose id was reused.
pub struct Group {
    pub pgid: u32,
    pub members: Vec<Proc>,
}

impl Group {
    /// The group of the running child that logged `ev`, and its members.
    pub fn of(ev: &Event) -> Group {
        let pgid = proc_stat(ev.pid).unwrap_or_else(|| panic!("child {} already reaped", ev.pid)).pgid;
        Group { pgid, members: live_in_group(pgid) }
    }

    /// The group of `ev`'s child once it has `n` members; panics after 2 s.
    pub fn with(ev: &Event, n: usize) -> Group {
        let mut group = Group::of(ev);
        let ok = wait_for(Duration::from_secs(2), || {
            group.members = live_in_group(group.pgid);
            group.members.len() == n
        });
        assert!(ok, "not {n} processes in the child's group: {:?}", group.members);
        group
    }

    /// Recorded members still running.
    pub fn left(&self) -> Vec<Proc> {
        live_in_group(self.pgid).into_iter().filter(|p| self.members.iter().any(|m| m.pid == p.pid)).collect()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for p in self.left() {
            // SAFETY: kill(2) on a process of the group recorded above.
            unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
        }
    }
}

/// The command line of process `pid`, its arguments joined by spaces;
/// empty once it is gone.
pub fn cmdline(pid: u32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).trim_end_matches('\0').replace('\0', " ")
}

/// The signals process `pid` blocks (`SigBlk` of /proc/PID/status), as a mask.
pub fn blocked(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).unwrap();
    u64::from_str_radix(line.trim(), 16).unwrap()
}

/// The mask bit of signal `sig`.
pub fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

fn secs(ns: u128) -> f64 {
    ns as f64 / 1e9
}

// ---------------------------------------------------------------- scenarios

/// The children's `[start, end]` in `file` (`end` is a child's next line
/// after `start`: `term` or `end`), in order of start, with each start's
/// `rest` (identity and fence); panics if two overlap.
pub fn disjoint_spans(file: &Path) -> Vec<(u128, u128, String)> {
    let ev = events(file);
    let mut spans: Vec<(u128, u128, String)> = ev
        .iter()
        .filter(|e| e.kind == "start")
        .map(|s| {
            let end = ev.iter().find(|e| e.kind != "start" && e.pid == s.pid).map_or(u128::MAX, |e| e.ns);
            (s.ns, end, s.rest.clone())
        })
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].1 < w[1].0, "children overlap: {:?} and {:?}", w[0], w[1]);
    }
    spans
}

/// A span's fence: its start's `rest` is `identity fence`.
fn span_fence(span: &(u128, u128, String)) -> u64 {
    span.2.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Stops two looping tools with SIGTERM, then checks what the scenario
/// waited for (`ok`; else fails with `what`, the log and both tools'
/// stderr) and their exits: the leader's child traps TERM and exits 0; the
/// tool waiting to lead exits 128 + SIGTERM.
fn stop_both(a: &mut Tool, b: &mut Tool, file: &Path, ok: bool, what: &str) {
    a.signal(libc::SIGTERM);
    b.signal(libc::SIGTERM);
    let (ca, cb) = (a.code(Duration::from_secs(5)), b.code(Duration::from_secs(5)));
    assert!(ok, "{what}: {:?}\n{}\n{}", events(file), a.stderr(), b.stderr());
    for code in [ca, cb] {
        assert!(code == 0 || code == 143, "exit {code}: {}\n{}", a.stderr(), b.stderr());
    }
}

/// Two looping tools, each child working ~1 s: no two children's
/// [start, end] overlap, and both got to run.
pub fn contention(db: &Db) {
    let name = db.name("contend");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let script = child(&file, "1", 0);
    let mut a = db.run(&name, &["--loop", "--identity", "a"], &script);
    let mut b = db.run(&name, &["--loop", "--identity", "b"], &script);
    let done = wait_for(Duration::from_secs(30), || {
        let ev = events(&file);
        let ends = ev.iter().filter(|e| e.kind == "end").count();
        let who = |id: &str| ev.iter().any(|e| e.kind == "start" && e.rest.starts_with(id));
        ends >= 5 && who("a#") && who("b#")
    });
    stop_both(&mut a, &mut b, &file, done, "not 5 rounds with both tools within 30 s");
    let spans = disjoint_spans(&file);
    let gaps: Vec<f64> = spans.windows(2).map(|w| secs(w[1].0 - w[0].1)).collect();
    let fences: Vec<u64> = spans.iter().map(span_fence).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences increase: {fences:?}");
    println!("cli {} contention: {} children, none overlapping, gaps between them {gaps:.3?} s", db.label, spans.len());
}

/// Two tools started at once with one `--identity` (two hosts given the
/// same name, a cron job overlapping its own previous run on one host):
/// each run is a participant of its own, so their children run one after
/// the other, never at once, under different identities that share the
/// name, with increasing fences. (Before runs had instance tags, the
/// second's claim looked like the first renewing, and both children ran at
/// once on one fence.)
pub fn one_identity(db: &Db) {
    let name = db.name("one-id");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let script = child(&file, "1", 0);
    let mut a = db.run(&name, &["--identity", "web"], &script);
    let mut b = db.run(&name, &["--identity", "web"], &script);
    let done = wait_for(Duration::from_secs(30), || events(&file).iter().filter(|e| e.kind == "end").count() >= 2);
    let (ca, cb) = (a.code(Duration::from_secs(10)), b.code(Duration::from_secs(10)));
    assert!(done, "both children did not run within 30 s: {:?}\n{}\n{}", events(&file), a.stderr(), b.stderr());
    assert_eq!((ca, cb), (0, 0), "{}\n{}", a.stderr(), b.stderr());
    let spans = disjoint_spans(&file);
    assert_eq!(spans.len(), 2, "{spans:?}");
    let ids: Vec<&str> = spans.iter().map(|s| s.2.split(' ').next().unwrap()).collect();
    assert_ne!(ids[0], ids[1], "two runs shared one identity: {spans:?}");
    assert!(ids.iter().all(|id| leaderelection::base_identity(id) == "web"), "{ids:?}");
    let fences: Vec<u64> = spans.iter().map(span_fence).collect();
    assert!(fences[0] < fences[1], "{fences:?}");
    println!(
        "cli {} one identity: {ids:?} ran one after the other, {:.3} s apart",
        db.label,
        secs(spans[1].0 - spans[0].1)
    );
}

/// The sentinel among a group's members, by its command line.
fn sentinel_in(group: &Group) -> Option<Proc> {
    group.members.iter().copied().find(|p| cmdline(p.pid).starts_with("leaderelection __sentinel "))
}

/// A command whose group outlives its shell: a foreground and a
/// background `sleep 30`; it logs `start` to `file` (and `end`, never
/// reached in the tests that use it).
fn group_child(file: &Path) -> String {
    let f = file.display();
    format!("echo \"start $(date +%s%N) $$\" >> {f}; sleep 30 & sleep 30; echo \"end $(date +%s%N) $$\" >> {f}")
}

/// The group of [`group_child`]'s run that logged `start`, once it holds
/// its sentinel, the shell and its two sleeps; the sentinel is the tool's
/// (`tool`) child and leads the group.
fn guarded_group(start: &Event, tool: u32) -> (Group, Proc) {
    let group = Group::with(start, 4);
    let sentinel = sentinel_in(&group).unwrap_or_else(|| panic!("no live sentinel in {:?}", group.members));
    assert_eq!((sentinel.pid, sentinel.ppid), (group.pgid, tool), "the tool's child, leading the group");
    (group, sentinel)
}

/// SIGKILL to `tool`: its child's whole `group` is gone within a second.
fn sigkill_takes_the_group(tool: &mut Tool, group: &Group) {
    tool.signal(libc::SIGKILL);
    tool.wait(Duration::from_secs(2));
    assert!(
        wait_for(Duration::from_secs(1), || group.left().is_empty()),
        "the SIGKILLed tool's group lives on: {:?}",
        group.left()
    );
}

/// A waiting run starts its command's sentinel while it waits (so that
/// winning the lease is followed by one process creation, not two): a
/// child of the tool, leading a group of its own. One killed while the run
/// waits is replaced, not used: the command then runs in a group a live
/// sentinel leads, and the tool's SIGKILL still takes the whole group.
pub fn spare_sentinel(db: &Db) {
    let name = db.name("spare");
    let dir = TempDir::new();
    let (fa, fb) = (dir.path().join("a"), dir.path().join("b"));
    let mut a = db.run(&name, &[], &child(&fa, "30", 0));
    assert!(wait_for(Duration::from_secs(5), || first(&fa, "start").is_some()), "a never led: {}", a.stderr());
    let mut b = db.run(&name, &[], &group_child(&fb));
    let bpid = b.child.id();
    let waiting_sentinel = || {
        procs().into_iter().find(|p| {
            p.ppid == bpid
                && p.state != 'Z'
                && p.pgid == p.pid
                && cmdline(p.pid).starts_with("leaderelection __sentinel ")
        })
    };
    let mut spare = None;
    assert!(
        wait_for(Duration::from_secs(5), || {
            spare = waiting_sentinel();
            spare.is_some()
        }),
        "no sentinel among the waiting run's children: {:?}",
        procs().into_iter().filter(|p| p.ppid == bpid).collect::<Vec<_>>()
    );
    assert!(first(&fb, "start").is_none(), "b ran while a led: {}", b.stderr());
    let spare = spare.unwrap();
    // SAFETY: kill(2) on the waiting run's own sentinel, found above.
    unsafe { libc::kill(spare.pid as i32, libc::SIGKILL) };
    assert!(wait_for(Duration::from_secs(2), || gone(spare.pid)), "the spare sentinel survived SIGKILL");
    a.signal(libc::SIGTERM);
    assert_eq!(a.code(Duration::from_secs(5)), 0, "a: {}", a.stderr());
    assert!(wait_for(Duration::from_secs(5), || first(&fb, "start").is_some()), "b never led: {}", b.stderr());
    let (group, sentinel) = guarded_group(&first(&fb, "start").unwrap(), bpid);
    assert_ne!(sentinel.pid, spare.pid, "the killed sentinel was used");
    sigkill_takes_the_group(&mut b, &group);
    println!("cli {} spare sentinel: ready while waiting; killed, it was replaced and the group guarded", db.label);
}

/// SIGKILL of the leading tool: its child dies with it, and so do the
/// child's own children in its group (a foreground and a background
/// `sleep`: the sentinel's work, PR_SET_PDEATHSIG reaches the direct child
/// only); the waiting tool's child starts after about the lease.
pub fn sigkill_handover(db: &Db) {
    let name = db.name("sigkill");
    let dir = TempDir::new();
    let (fa, fb) = (dir.path().join("a"), dir.path().join("b"));
    let mut a = db.run(&name, &[], &group_child(&fa));
    assert!(
        wait_for(Duration::from_secs(5), || first(&fa, "start").is_some()),
        "a's child never started: {}",
        a.stderr()
    );
    let start = first(&fa, "start").unwrap();
    let (group, _) = guarded_group(&start, a.child.id());
    let mut b = db.run(&name, &[], &child(&fb, "30", 0));
    thread::sleep(Duration::from_millis(300)); // let b campaign (not waiting on an outcome)
    assert!(first(&fb, "start").is_none(), "b ran while a led: {:?} {}", events(&fa), a.stderr());
    let killed = now_ns();
    sigkill_takes_the_group(&mut a, &group);
    let child_gone = now_ns();
    assert!(wait_for(LEASE + Duration::from_secs(3), || first(&fb, "start").is_some()), "b never took over");
    let after = first(&fb, "start").unwrap().ns - killed;
    let low = (LEASE - MARGIN - RENEW).as_nanos();
    let high = (LEASE + Duration::from_secs(2)).as_nanos();
    assert!(after >= low && after <= high, "b's child started {:.3}s after the kill", secs(after));
    println!(
        "cli {} sigkill: a's group (child, 2 grandchildren, sentinel) gone {:.3}s after the kill, \
         b's child started {:.3}s after it",
        db.label,
        secs(child_gone - killed),
        secs(after)
    );
    b.signal(libc::SIGTERM);
    assert_eq!(b.code(Duration::from_secs(5)), 0);
}

/// A proxy that swallows every packet between the leading tool and the
/// database: the child gets SIGTERM (or, ignoring it, SIGKILL) and is gone
/// before the tool's local deadline, which is at most lease - margin after
/// the swallow began; the tool exits 79.
pub fn swallowed(db: &Db, stubborn: bool) {
    let name = db.name(if stubborn { "swallow-stubborn" } else { "swallow" });
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let proxy = proxy::Proxy::start(db.addr());
    let f = file.display();
    let script = if stubborn {
        // Ignores SIGTERM (its sleeps die of it; it starts new ones).
        format!(
            "trap 'echo \"term $(date +%s%N) $$\" >> {f}' TERM; echo \"start $(date +%s%N) $$\" >> {f}; \
             while :; do sleep 0.05; done"
        )
    } else {
        child(&file, "30", 0)
    };
    let mut tool = db.run_dsn(&db.via_port(proxy.port), &name, &[], &script);
    assert!(wait_for(Duration::from_secs(5), || first(&file, "start").is_some()), "no child: {}", tool.stderr());
    let start = first(&file, "start").unwrap();
    let (pid, group) = (start.pid, Group::of(&start));
    thread::sleep(Duration::from_millis(500)); // a few renewals through the proxy
    let began = now_ns();
    proxy.swallow(true);
    let budget = (LEASE - MARGIN).as_nanos();
    assert!(wait_for(Duration::from_secs(4), || gone(pid)), "child still running: {}", tool.stderr());
    let gone_at = now_ns();
    let term = first(&file, "term").expect("the child got SIGTERM").ns;
    assert!(term - began <= budget, "SIGTERM {:.3}s after the swallow began", secs(term - began));
    assert!(gone_at - began <= budget, "child gone {:.3}s after the swallow began", secs(gone_at - began));
    assert_eq!(tool.code(Duration::from_secs(5)), 79, "stderr: {}", tool.stderr());
    // No release is tried for a term lost with its database: the tool
    // exits at once (it used to try, for up to 2.5 operation timeouts).
    let exited_after = Duration::from_nanos((now_ns() - gone_at) as u64);
    assert!(exited_after < Duration::from_millis(400), "the tool exited {exited_after:?} after its child");
    let err = tool.stderr();
    // Lines naming the cause: the database's failure, with the stop and the exit.
    assert!(err.contains("term at risk: no renewal landed in time (last failure: "), "{err}");
    assert!(err.contains("leadership lost; the child was stopped (last failure: "), "{err}");
    let line = err.lines().find(|l| l.contains("before the local deadline")).expect("a `child gone` line");
    // The tool's own measure against its deadline: `child gone 739ms before ...`.
    let ahead = line.split("child gone ").nth(1).and_then(|r| r.split(' ').next()).unwrap();
    let ahead_s: f64 = match ahead.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().unwrap() / 1000.0,
        None => ahead.strip_suffix('s').unwrap().parse().unwrap(),
    };
    assert!(ahead_s >= 0.1, "child gone only {ahead} before the tool's local deadline");
    println!(
        "cli {} swallow{}: SIGTERM {:.3}s and child gone {:.3}s after the swallow began (budget {:.3}s), \
         tool exited {exited_after:?} after the child; tool: {line}",
        db.label,
        if stubborn { " (child ignores SIGTERM)" } else { "" },
        secs(term - began),
        secs(gone_at - began),
        secs(budget)
    );
    if stubborn {
        assert!(err.contains("SIGKILL to the child"), "{err}");
    }
    assert!(wait_for(Duration::from_secs(1), || group.left().is_empty()), "left of the group: {:?}", group.left());
}

/// SIGTERM to the leading tool is forwarded; the child traps it and exits
/// 0, the tool exits 0 and releases, and the waiting tool's child starts
/// within a retry period and a second.
pub fn sigterm_forwarded(db: &Db) {
    let name = db.name("sigterm");
    let dir = TempDir::new();
    let (fa, fb) = (dir.path().join("a"), dir.path().join("b"));
    let mut a = db.run(&name, &[], &child(&fa, "30", 0));
    assert!(
        wait_for(Duration::from_secs(5), || first(&fa, "start").is_some()),
        "a's child never started: {}",
        a.stderr()
    );
    let mut b = db.run(&name, &[], &child(&fb, "30", 0));
    thread::sleep(Duration::from_millis(300)); // let b campaign (not waiting on an outcome)
    let sent = now_ns();
    a.signal(libc::SIGTERM);
    assert_eq!(a.code(Duration::from_secs(3)), 0, "the child's own status; stderr: {}", a.stderr());
    let exited = now_ns();
    let term = first(&fa, "term").expect("SIGTERM was not forwarded").ns;
    assert!(wait_for(RETRY + Duration::from_secs(2), || first(&fb, "start").is_some()), "b never took over");
    let started = first(&fb, "start").unwrap().ns;
    assert!(started > term, "b's child started before a's child was told to stop");
    // a releases before it exits, and the hand-over takes milliseconds:
    // b's child may start before this thread has seen a exit.
    assert!(
        started.saturating_sub(exited) <= (RETRY + Duration::from_secs(1)).as_nanos(),
        "b started {:.3}s after a exited",
        secs(started.saturating_sub(exited))
    );
    println!(
        "cli {} sigterm: a exited {:.3}s after SIGTERM, b's child started {:.3}s after a's child had it",
        db.label,
        secs(exited - sent),
        secs(started - term)
    );
    b.signal(libc::SIGTERM);
    assert_eq!(b.code(Duration::from_secs(5)), 0);
}

/// Crude JSON field reader for the one flat object `status --json` prints.
pub fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let at = json.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key} in {json}")) + key.len() + 3;
    let rest = &json[at..];
    if let Some(s) = rest.strip_prefix('"') {
        let mut end = 0;
        let bytes = s.as_bytes();
        while bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        &s[..end]
    } else {
        &rest[..rest.find([',', '}']).unwrap()]
    }
}

/// The child's LEADERELECTION_* variables match the database; `status`
/// text and JSON while someone leads (exit 0) and after release (exit 1).
pub fn env_and_status(db: &Db) {
    let name = db.name("env");
    let identity = format!("id-{}", db.label);
    let dir = TempDir::new();
    let file = dir.path().join("env");
    let script = format!(
        "trap 'exit 0' TERM; \
         echo \"$LEADERELECTION_FENCE|$LEADERELECTION_NAME|$LEADERELECTION_IDENTITY\" > {f}.tmp; mv {f}.tmp {f}; \
         sleep 30 & wait $!",
        f = file.display()
    );
    let mut tool = db.run(&name, &["--identity", &identity, "--payload", "p \"q\"\tx"], &script);
    assert!(wait_for(Duration::from_secs(5), || file.exists()), "no child: {}", tool.stderr());
    let env = fs::read_to_string(&file).unwrap();
    let parts: Vec<&str> = env.trim_end().split('|').collect();
    assert_eq!(parts[1], name.as_str());
    // The identity given, and this run's instance tag.
    let holder = parts[2];
    assert!(holder.starts_with(&format!("{identity}#")) && holder.len() == identity.len() + 17, "{holder}");
    assert_eq!(leaderelection::base_identity(holder), identity);
    let identity = holder.to_owned();

    let out = db.status(&name, true);
    assert_eq!(out.status.code(), Some(0), "someone leads");
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json_field(&json, "fence"), parts[0], "LEADERELECTION_FENCE is the database's fence: {json}");
    assert_eq!(json_field(&json, "leader"), identity);
    assert_eq!(json_field(&json, "name"), name);
    assert_eq!(json_field(&json, "payload"), r#"p \"q\"\tx"#);
    let left: u64 = json_field(&json, "time_left_ms").parse().unwrap();
    assert!(left > 0 && left <= LEASE.as_millis() as u64, "time left {left} ms");

    let out = db.status(&name, false);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        format!("leader: {identity}\n"),
        format!("fence: {}\n", parts[0]),
        "time left: ".into(),
        "payload: p \"q\"?x".into(),
    ] {
        assert!(text.contains(&want), "{want:?} not in {text:?}");
    }

    tool.signal(libc::SIGTERM);
    assert_eq!(tool.code(Duration::from_secs(5)), 0);
    let out = db.status(&name, false);
    assert_eq!(out.status.code(), Some(1), "nobody leads after release");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(&format!("nobody leads (last: {identity}")), "{text}");
    let out = db.status(&name, true);
    assert_eq!(out.status.code(), Some(1));
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json_field(&json, "leader"), "null");
    assert_eq!(json_field(&json, "last_leader"), identity);
    let out = db.status(&format!("{name}-never"), true);
    assert_eq!(out.status.code(), Some(1), "an election with no row");
}

/// Runs the binary to completion; returns (exit code, stderr).
pub fn run_once(dsn: &str, table: &str, name: &str, extra: &[&str], script: &str) -> (i32, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--dsn", dsn, "--table", table, "--name", name]).args(TIMING).args(extra);
    let out = cmd.args(["--", "sh", "-c", script]).stdin(Stdio::null()).output().unwrap();
    (out.status.code().expect("exited"), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Exit codes that need a server: the child's status, 128+signal, 75 and
/// `-E`, 143 for a child killed by the forwarded SIGTERM, 77 for a missing
/// table, 69 for a closed port (no password in the line).
pub fn exit_codes(db: &Db) {
    let name = db.name("codes");
    let run = |extra: &[&str], script: &str| run_once(&db.dsn, &db.table, &name, extra, script);
    assert_eq!(run(&[], "exit 3").0, 3);
    assert_eq!(run(&[], "kill -USR1 $$").0, 138);

    let mut holder = db.run(&name, &[], "exec sleep 30");
    assert!(wait_for(Duration::from_secs(5), || db.status(&name, false).status.code() == Some(0)), "no holder");
    let (code, err) = run(&["--wait", "500ms"], "exit 0");
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("not leader within 500ms"), "{err}");
    assert_eq!(run(&["--wait", "300ms", "-E", "9"], "exit 0").0, 9);
    holder.signal(libc::SIGTERM);
    assert_eq!(holder.code(Duration::from_secs(5)), 143, "sleep died of the forwarded SIGTERM");

    let (code, err) = run_once(&db.dsn, "le_cli_no_such_table", &name, &[], "exit 0");
    assert_eq!(code, 77, "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dsn = db.via_port(closed).replacen("root@", &format!("root:{PASSWORD}@"), 1);
    let (code, err) = run_once(&dsn, &db.table, &name, &[], "exit 0");
    assert_eq!(code, 69, "{err}");
    assert!(err.starts_with("leaderelection: database unreachable: ") && err.lines().count() == 1, "{err}");
    assert!(!err.contains(PASSWORD), "password echoed: {err}");
}

/// A fatal login error with a password in the DSN: exit 77, one line, no password.
pub fn fatal_login(db: &Db, dsn: &str) {
    assert!(dsn.contains(PASSWORD));
    let (code, err) = run_once(dsn, &db.table, &db.name("login"), &[], "exit 0");
    assert_eq!(code, 77, "{err}");
    assert!(err.starts_with("leaderelection: fatal database error: ") && err.lines().count() == 1, "{err}");
    assert!(!err.contains(PASSWORD), "password echoed: {err}");
}

/// The sentinel never fires while the tool lives. A child whose work is a
/// grandchild (a foreground `sleep 1`) runs to its end and its status (5)
/// comes back; the sentinel is the tool's child and leads the group, and it
/// blocks the forwarded signals while the child blocks none. Then a
/// forwarded SIGTERM reaches a grandchild: the shell traps it, its `sleep`
/// dies of it (143), and the shell's own status (3) comes back.
pub fn sentinel_quiet(db: &Db) {
    let name = db.name("quiet");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let f = file.display();
    let script =
        format!("echo \"start $(date +%s%N) $$\" >> {f}; sleep 1; echo \"end $(date +%s%N) $$\" >> {f}; exit 5");
    let mut tool = db.run(&name, &[], &script);
    assert!(wait_for(Duration::from_secs(5), || first(&file, "start").is_some()), "no child: {}", tool.stderr());
    let start = first(&file, "start").unwrap();
    let group = Group::with(&start, 3);
    let sentinel = sentinel_in(&group).unwrap_or_else(|| panic!("no sentinel in {:?}", group.members));
    assert_eq!((sentinel.pid, sentinel.ppid), (group.pgid, tool.child.id()));
    assert_eq!(cmdline(sentinel.pid), format!("leaderelection __sentinel {}", tool.child.id()));
    let forwarded = bit(libc::SIGINT) | bit(libc::SIGTERM) | bit(libc::SIGHUP);
    assert_eq!(blocked(sentinel.pid) & forwarded, forwarded, "the sentinel blocks the forwarded signals");
    assert_eq!(blocked(start.pid) & (forwarded | bit(libc::SIGUSR1)), 0, "the child blocks none of them");
    assert_eq!(tool.code(Duration::from_secs(5)), 5, "the child's status; stderr: {}", tool.stderr());
    let end = first(&file, "end").expect("the grandchild ran to its end");
    assert!(end.ns - start.ns >= 1_000_000_000, "the child ran {:.3}s", secs(end.ns - start.ns));
    assert!(wait_for(Duration::from_secs(1), || group.left().is_empty()), "left: {:?}", group.left());

    let file = dir.path().join("term");
    let f = file.display();
    let script = format!(
        "trap 'echo \"term $(date +%s%N) $$\" >> {f}' TERM; echo \"start $(date +%s%N) $$\" >> {f}; \
         sleep 30; st=$?; echo \"slept $(date +%s%N) $$ $st\" >> {f}; exit 3"
    );
    let mut tool = db.run(&name, &[], &script);
    assert!(wait_for(Duration::from_secs(5), || first(&file, "start").is_some()), "no child: {}", tool.stderr());
    let group = Group::with(&first(&file, "start").unwrap(), 3);
    tool.signal(libc::SIGTERM);
    assert_eq!(tool.code(Duration::from_secs(5)), 3, "the shell's status; stderr: {}", tool.stderr());
    assert!(first(&file, "term").is_some(), "the shell got SIGTERM: {:?}", events(&file));
    let slept = first(&file, "slept").unwrap_or_else(|| panic!("the shell went on: {:?}", events(&file)));
    assert_eq!(slept.rest, "143", "the grandchild died of the forwarded SIGTERM");
    assert!(wait_for(Duration::from_secs(1), || group.left().is_empty()), "left: {:?}", group.left());
}

/// `--loop` after losing leadership: a proxy swallows the leader's (a's)
/// packets until its child is stopped and b leads, then heals; a campaigns again and
/// runs its child again at a later term (higher fence) while b, direct,
/// takes its turns; no two children ever overlap.
pub fn loop_after_loss(db: &Db) {
    let name = db.name("loop-loss");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let proxy = proxy::Proxy::start(db.addr());
    // a's child works long, so only the cut stops it; b's briefly, so that a
    // gets a turn again.
    let mut a = db.run_dsn(&db.via_port(proxy.port), &name, &["--loop", "--identity", "a"], &child(&file, "4", 0));
    assert!(wait_for(Duration::from_secs(5), || first(&file, "start").is_some()), "no child: {}", a.stderr());
    let first_a = first(&file, "start").unwrap();
    let mut b = db.run(&name, &["--loop", "--identity", "b"], &child(&file, "1", 0));
    thread::sleep(Duration::from_millis(300)); // let b campaign (not waiting on an outcome)
    let cut = Instant::now();
    proxy.swallow(true);
    let stopped = wait_for(Duration::from_secs(4), || gone(first_a.pid));
    let stopped_after = cut.elapsed();
    assert!(stopped, "a's child was not stopped: {}", a.stderr());
    // The cut lasts until b leads: a's release cannot land, its lease runs
    // out, and b takes its turn while a is cut off.
    let b_led = wait_for(LEASE + Duration::from_secs(3), || {
        events(&file).iter().any(|e| e.kind == "start" && e.rest.starts_with("b#"))
    });
    proxy.swallow(false);
    assert!(b_led, "b never led while a was cut off: {:?}\n{}\n{}", events(&file), a.stderr(), b.stderr());
    assert!(a.child.try_wait().unwrap().is_none(), "a exited instead of campaigning again: {}", a.stderr());
    let a_starts = || events(&file).into_iter().filter(|e| e.kind == "start" && e.rest.starts_with("a#")).count();
    let again = wait_for(Duration::from_secs(25), || a_starts() >= 2);
    stop_both(&mut a, &mut b, &file, again, "a never led again");
    let spans = disjoint_spans(&file);
    let a_fences: Vec<u64> = spans.iter().filter(|s| s.2.starts_with("a#")).map(span_fence).collect();
    assert!(a_fences[1] > a_fences[0], "a's second term has a higher fence: {a_fences:?}");
    let b_runs = spans.iter().filter(|s| s.2.starts_with("b#")).count();
    assert!(b_runs >= 1, "b ran while a was cut off: {spans:?}");
    println!(
        "cli {} loop after loss: a's child stopped {:.3}s after the cut; {} children, none overlapping, \
         a ran again at fence {} (first {}), b ran {b_runs} times",
        db.label,
        stopped_after.as_secs_f64(),
        spans.len(),
        a_fences[1],
        a_fences[0]
    );
}

/// `--loop` reaps what it starts: after several terms of a short child
/// (with a grandchild), the tool has no zombie children, and never more
/// than the two of one term (the child and its sentinel).
pub fn no_zombies_in_loop(db: &Db) {
    let name = db.name("zombies");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let script = format!("echo \"start $(date +%s%N) $$\" >> {}; sleep 0.05; true", file.display());
    let mut tool = db.run(&name, &["--loop"], &script);
    let pid = tool.child.id();
    let children = || procs().into_iter().filter(|p| p.ppid == pid).collect::<Vec<_>>();
    let mut most = 0;
    let terms = wait_for(Duration::from_secs(15), || {
        most = most.max(children().len());
        events(&file).len() >= 4
    });
    let clean = terms && wait_for(Duration::from_secs(3), || children().iter().all(|p| p.state != 'Z'));
    let left = children();
    tool.signal(libc::SIGTERM);
    let code = tool.code(Duration::from_secs(5));
    assert!(terms, "not 4 terms within 15 s: {:?}\n{}", events(&file), tool.stderr());
    assert!(clean, "zombie children after {} terms: {left:?}", events(&file).len());
    assert!(most <= 2, "{most} children at once");
    assert!(code == 0 || code == 143, "exit {code}: {}", tool.stderr());
    println!(
        "cli {} zombies: {} terms, at most {most} children at once, none left a zombie",
        db.label,
        events(&file).len()
    );
}

// ---------------------------------------------------------------- slots

/// The runs' children in `file`: how many started.
fn starts(file: &Path) -> usize {
    events(file).iter().filter(|e| e.kind == "start").count()
}

/// Cron's habit on four hosts, one slot: runs start staggered across it
/// (at once, 0.3 s later while the first one's child works, and after it
/// has finished), three waiting to lead and one with `-E 0`. The child
/// runs once; every other run exits 76, or 0 with `-E 0`, without running
/// it. (Before slots, every run that led ran the child again: measured at
/// :00 and :04 with two runs 0.5 s apart.)
pub fn slot_runs_once(db: &Db) {
    let name = db.name("slot-once");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let script = child(&file, "1", 0);
    let slot = ["--slot", "2026-12-01", "--wait", "20s"];
    let mut runs = vec![db.run(&name, &slot, &script)];
    thread::sleep(Duration::from_millis(300)); // staggered starts (not a wait for an outcome)
    runs.push(db.run(&name, &slot, &script));
    assert!(wait_for(Duration::from_secs(10), || events(&file).iter().any(|e| e.kind == "end")), "no child ran");
    runs.push(db.run(&name, &slot, &script));
    runs.push(db.run(&name, &[&slot[..], &["-E", "0"]].concat(), &script));
    let codes: Vec<i32> = runs.iter_mut().map(|r| r.code(Duration::from_secs(30))).collect();
    let stderrs: Vec<String> = runs.iter().map(Tool::stderr).collect();
    assert_eq!(starts(&file), 1, "the slot's child ran more than once: {:?}\n{stderrs:#?}", events(&file));
    let mut sorted = codes.clone();
    sorted.sort();
    assert_eq!(sorted, [0, 0, 76, 76], "exit codes {codes:?}: {stderrs:#?}");
    assert!(stderrs.iter().filter(|e| e.contains("slot \"2026-12-01\" was already run")).count() == 3, "{stderrs:#?}");
    println!("cli {} slot: 4 staggered runs, the child ran once; exit codes {codes:?}", db.label);

    // The negative control: the same runs without a slot run the child
    // whenever they lead, one after the other.
    let name = db.name("slot-none");
    let file = dir.path().join("none");
    let script = child(&file, "1", 0);
    let plain = ["--wait", "20s"];
    let mut runs = vec![db.run(&name, &plain, &script)];
    thread::sleep(Duration::from_millis(300));
    runs.push(db.run(&name, &plain, &script));
    let codes: Vec<i32> = runs.iter_mut().map(|r| r.code(Duration::from_secs(30))).collect();
    assert_eq!(codes, [0, 0]);
    assert_eq!(starts(&file), 2, "without a slot the second run should have run the job again: {:?}", events(&file));
}

/// A run killed in the middle of its slot (SIGKILL of the tool: its child
/// dies with it and nothing is recorded). At most once by default: a later
/// run exits 76. With `--retry-failed` a later run takes the slot over
/// (its term is a new one, so the killed run no longer leads) and runs
/// the child; once that run exited 0, a retrying run exits 76 too.
pub fn slot_killed_mid_run(db: &Db) {
    let name = db.name("slot-killed");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let slot = ["--slot", "nightly", "--wait", "20s"];
    let mut killed = db.run(&name, &slot, &child(&file, "30", 0));
    assert!(wait_for(Duration::from_secs(10), || starts(&file) == 1), "no child: {}", killed.stderr());
    killed.signal(libc::SIGKILL);
    killed.wait(Duration::from_secs(2));
    let mut later = db.run(&name, &slot, &child(&file, "0", 0));
    assert_eq!(later.code(Duration::from_secs(30)), 76, "{}", later.stderr());
    assert!(later.stderr().contains("recorded no exit status"), "{}", later.stderr());
    assert_eq!(starts(&file), 1, "a later run ran the killed slot again: {:?}", events(&file));
    let retry = [&slot[..], &["--retry-failed"]].concat();
    let mut retrying = db.run(&name, &retry, &child(&file, "0", 0));
    assert_eq!(retrying.code(Duration::from_secs(30)), 0, "{}", retrying.stderr());
    assert_eq!(starts(&file), 2, "the retrying run did not run the child: {:?}", events(&file));
    let mut again = db.run(&name, &retry, &child(&file, "0", 0));
    assert_eq!(again.code(Duration::from_secs(30)), 76, "{}", again.stderr());
    assert!(again.stderr().contains("exited 0"), "{}", again.stderr());
    assert_eq!(starts(&file), 2);
}

/// A run whose child fails records its status: a later run exits 76 and
/// says so; a retrying one runs the slot again, and its success sticks.
/// `--every 1d` names the slot from the database's clock (today's UTC
/// midnight), so two runs of the same day run the child once.
pub fn slot_failed_and_every(db: &Db) {
    let name = db.name("slot-failed");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let slot = ["--slot", "hourly-13", "--wait", "20s"];
    let fails = format!("{}; exit 3", child(&file, "0", 0));
    assert_eq!(db.run(&name, &slot, &fails).code(Duration::from_secs(30)), 3);
    let mut later = db.run(&name, &slot, &child(&file, "0", 0));
    assert_eq!(later.code(Duration::from_secs(30)), 76);
    assert!(later.stderr().contains("exited 3"), "{}", later.stderr());
    let retry = [&slot[..], &["--retry-failed"]].concat();
    assert_eq!(db.run(&name, &retry, &child(&file, "0", 0)).code(Duration::from_secs(30)), 0);
    assert_eq!(db.run(&name, &retry, &child(&file, "0", 0)).code(Duration::from_secs(30)), 76);
    assert_eq!(starts(&file), 2, "{:?}", events(&file));

    let name = db.name("slot-every");
    let every = ["--every", "1d", "--wait", "20s"];
    let file = dir.path().join("every");
    let mut first = db.run(&name, &every, &child(&file, "0", 0));
    assert_eq!(first.code(Duration::from_secs(30)), 0, "{}", first.stderr());
    let day = first.stderr();
    let named = day.split("slot \"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_else(|| panic!("{day}"));
    assert!(named.len() == 20 && named.ends_with("T00:00:00Z"), "not a UTC day: {named:?}");
    let mut second = db.run(&name, &every, &child(&file, "0", 0));
    assert_eq!(second.code(Duration::from_secs(30)), 76, "{}", second.stderr());
    assert!(second.stderr().contains(named), "{}", second.stderr());
    assert_eq!(starts(&file), 1);
}

impl Db {
    /// The database's own command-line client, reading SQL on stdin and
    /// stopping at the first error: `psql` or `mariadb`, as the README's
    /// shell examples call them.
    pub fn client(&self) -> String {
        if self.label == "pg" {
            return format!("psql '{}' -q -X -v ON_ERROR_STOP=1", self.dsn);
        }
        let (head, hostport, tail) = split_dsn(&self.dsn);
        let user = head.trim_start_matches("mysql://").trim_end_matches('@');
        let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "3306"));
        let db = tail.trim_start_matches('/').split('?').next().unwrap_or("test");
        format!("mariadb -h {host} -P {port} -u {user} {db}")
    }

    /// Runs `sql` through [`Db::client`]; (success, stdout, stderr).
    pub fn sql(&self, sql: &str) -> (bool, String, String) {
        let flags = if self.label == "pg" { "-At" } else { "-N -B" };
        let mut child = Command::new("sh")
            .args(["-c", &format!("{} {flags}", self.client())])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(sql.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The child's lease check (`LEADERELECTION_CHECK_SQL`) in its own
/// transaction through `psql` or `mariadb`, as the README shows: inside the
/// term it passes and the write commits; run again once the term has ended
/// (the tool exited and released), the same statement fails by itself, the
/// client stops, and the write after it never commits.
pub fn checked_writes(db: &Db) {
    let ledger = format!("le_cli_ledger_{}_{}", db.label, std::process::id());
    let (ok, _, err) =
        db.sql(&format!("DROP TABLE IF EXISTS {ledger}; CREATE TABLE {ledger} (fence BIGINT NOT NULL);"));
    assert!(ok, "create the ledger: {err}");
    let dir = TempDir::new();
    let saved = dir.path().join("check.sql");
    let script = format!(
        "set -e; printf '%s' \"$LEADERELECTION_CHECK_SQL\" > {saved}; \
         {client} <<SQL\nSTART TRANSACTION;\n${{LEADERELECTION_CHECK_SQL:?}}\n\
         INSERT INTO {ledger} (fence) VALUES ($LEADERELECTION_FENCE);\nCOMMIT;\nSQL\n",
        saved = saved.display(),
        client = db.client(),
    );
    let name = db.name("checked");
    let (code, err) = run_once(&db.dsn, &db.table, &name, &[], &script);
    assert_eq!(code, 0, "the checked write inside the term: {err}");
    let check = fs::read_to_string(&saved).unwrap();
    assert!(check.trim_end().ends_with(';'), "one complete statement: {check}");
    let (ok, rows, err) = db.sql(&format!("SELECT fence FROM {ledger};"));
    assert!(ok, "{err}");
    let fences: Vec<&str> = rows.lines().collect();
    assert_eq!(fences.len(), 1, "one row written in the term: {rows:?}");
    let fence = fences[0];

    // The term has ended: the same statement now fails, and stops the
    // client before the write.
    let (ok, _, err) =
        db.sql(&format!("START TRANSACTION;\n{check}\nINSERT INTO {ledger} (fence) VALUES (-1);\nCOMMIT;\n"));
    assert!(!ok, "the check of an ended term passed");
    let want = if db.label == "pg" { "no longer holds the lease" } else { "ERROR 1242" };
    assert!(err.contains(want), "{want:?} not in {err:?}");
    let (_, rows, _) = db.sql(&format!("SELECT fence FROM {ledger};"));
    assert_eq!(rows.lines().collect::<Vec<_>>(), [fence], "a write after a failed check committed");
    let _ = db.sql(&format!("DROP TABLE {ledger};"));
}

/// A row held for nobody after a database failover (empty holder, not yet
/// expired): `status` says nobody leads (exit 1, JSON leader null), and
/// why.
pub fn held_row_status(db: &Db) {
    let name = db.name("held");
    let insert = if db.label == "pg" {
        format!(
            "INSERT INTO {} (name, holder, fence, acquired_at, renewed_at, expires_at) \
             VALUES ('{name}', '', 5, now(), now(), now() + interval '60 seconds');",
            db.table
        )
    } else {
        let now = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";
        format!(
            "INSERT INTO {} (name, holder, fence, acquired_at, renewed_at, expires_at, payload) \
             VALUES ('{name}', '', 5, {now}, {now}, {now} + 60000000, '');",
            db.table
        )
    };
    let (ok, _, err) = db.sql(&insert);
    assert!(ok, "{err}");
    let out = db.status(&name, false);
    assert_eq!(out.status.code(), Some(1), "a held row is nobody leading");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("nobody leads (held for nobody after a database failover, fence 5, for "), "{text}");
    let out = db.status(&name, true);
    assert_eq!(out.status.code(), Some(1));
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json_field(&json, "leader"), "null", "{json}");
    let _ = db.sql(&format!("DELETE FROM {} WHERE name = '{name}';", db.table));
}

// ---------------------------------------------------------------- first contact (issue 19)

impl Db {
    /// `leaderelection run` to completion with `extra` flags; (exit code, stderr).
    pub fn run_to_end(&self, name: &str, extra: &[&str], script: &str) -> (i32, String) {
        run_once(&self.dsn, &self.table, name, extra, script)
    }
}

/// A holder that runs until dropped (SIGKILLed), once `status` sees it lead.
fn holder(db: &Db, name: &str) -> Tool {
    let tool = db.run(name, &[], "exec sleep 30");
    assert!(wait_for(Duration::from_secs(5), || db.status(name, false).status.code() == Some(0)), "no holder");
    tool
}

/// `--wait 0` (and `0s`) tries once, as `flock -n`: with nobody leading it
/// runs the command; with another run leading it exits 75 (or `-E`) at
/// once, saying who leads. `--quiet` says nothing when it wins, nor when it
/// loses (75, `-E 0`, a slot already run); `status` prints no empty
/// `payload:` line.
pub fn try_once_and_quiet(db: &Db) {
    let name = db.name("once");
    for wait in ["0", "0s"] {
        let (code, err) = db.run_to_end(&name, &["--wait", wait], "exit 4");
        assert_eq!(code, 4, "--wait {wait} with nobody leading runs the command: {err}");
    }
    let (code, err) = db.run_to_end(&name, &["-q", "--wait", "0"], "echo out; exit 0");
    assert_eq!((code, err.as_str()), (0, ""), "a quiet winner prints nothing");

    let _holder = holder(db, &name);
    let text = String::from_utf8(db.status(&name, false).stdout).unwrap();
    assert!(!text.contains("payload"), "no payload line without a payload: {text:?}");
    let began = Instant::now();
    let (code, err) = db.run_to_end(&name, &["--wait", "0"], "exit 0");
    let took = began.elapsed();
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("not leader: ") && err.contains(" leads (fence "), "{err}");
    assert!(took < Duration::from_secs(2), "one try took {took:?}");
    assert_eq!(db.run_to_end(&name, &["--wait", "0", "-E", "0"], "exit 3").0, 0);
    for extra in [&["-q", "--wait", "0"][..], &["-q", "--wait", "0", "-E", "0"], &["--quiet", "--wait", "300ms"]] {
        let (code, err) = db.run_to_end(&name, extra, "exit 3");
        assert_eq!(err, "", "{extra:?} printed on stderr");
        assert_eq!(code, if extra.contains(&"-E") { 0 } else { 75 }, "{extra:?}");
    }
    println!("cli {} try once: lost in {took:?}", db.label);

    let name = db.name("once-slot");
    let slot = ["-q", "--slot", "s1", "--wait", "5s"];
    assert_eq!(db.run_to_end(&name, &slot, "exit 0"), (0, String::new()));
    assert_eq!(db.run_to_end(&name, &slot, "exit 0"), (76, String::new()), "a slot already run, quietly");
}

/// `schema --apply` creates the table over the DSN and says so in one
/// line (none with `-q`); before, `run` and `status` on the missing table
/// exit 77 saying how to create it.
pub fn schema_apply(db: &Db) {
    let table = format!("le_cli_apply_{}_{}", db.label, std::process::id());
    let other = Db { table: table.clone(), ..db.clone() };
    let name = other.name("apply");
    let want = format!("create it with `leaderelection schema --apply --dsn URL --table {table}`");
    let (code, err) = other.run_to_end(&name, &[], "exit 0");
    assert_eq!(code, 77, "{err}");
    assert!(err.contains(&want) && err.lines().count() == 1, "{err}");
    let out = other.status(&name, false);
    assert_eq!(out.status.code(), Some(77));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&want), "{out:?}");

    let apply = |extra: &[&str]| {
        Command::new(BIN).args(["schema", "--apply", "--dsn", &db.dsn, "--table", &table]).args(extra).output().unwrap()
    };
    let out = apply(&[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().count() == 1 && text.contains(" is ready (created if it did not exist)"), "{text:?}");
    let out = apply(&["-q"]);
    assert_eq!((out.status.code(), out.stdout.len(), out.stderr.len()), (Some(0), 0, 0), "again, quietly");
    assert_eq!(other.run_to_end(&name, &[], "exit 0").0, 0, "run on the table made");
    // The step after a restore marks the one row the run left inherited,
    // once; again it marks nothing; -q says nothing.
    let restore = |extra: &[&str]| {
        Command::new(BIN).args(["after-restore", "--dsn", &db.dsn, "--table", &table]).args(extra).output().unwrap()
    };
    for want in ["marked 1 election row as inherited", "marked 0 election rows as inherited"] {
        let out = restore(&[]);
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.lines().count() == 1 && text.contains(want), "{text:?}");
    }
    let out = restore(&["-q"]);
    assert_eq!((out.status.code(), out.stdout.len(), out.stderr.len()), (Some(0), 0, 0), "after-restore -q");
    let missing = Command::new(BIN)
        .args(["after-restore", "--dsn", &db.dsn, "--table", &format!("{table}_none")])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(77), "after-restore on a missing table: {missing:?}");
    let drop = if db.label == "pg" { format!("DROP TABLE public.{table};") } else { format!("DROP TABLE {table};") };
    let (ok, _, err) = db.sql(&drop);
    assert!(ok, "{err}");
}

/// A forwarded SIGTERM that the child ignores: SIGKILL follows `--grace`
/// (500 ms) later; the tool exits 137 and nothing of the group is left.
pub fn forwarded_signal_escalates(db: &Db) {
    let name = db.name("escalate");
    let dir = TempDir::new();
    let file = dir.path().join("log");
    let f = file.display();
    let script = format!(
        "trap 'echo \"term $(date +%s%N) $$\" >> {f}' TERM; echo \"start $(date +%s%N) $$\" >> {f}; \
         while :; do sleep 0.05; done"
    );
    let mut tool = db.run(&name, &[], &script);
    assert!(wait_for(Duration::from_secs(5), || first(&file, "start").is_some()), "no child: {}", tool.stderr());
    let group = Group::of(&first(&file, "start").unwrap());
    let sent = Instant::now();
    tool.signal(libc::SIGTERM);
    let code = tool.code(Duration::from_secs(3));
    let took = sent.elapsed();
    assert_eq!(code, 137, "the child was SIGKILLed: {}", tool.stderr());
    assert!(first(&file, "term").is_some(), "SIGTERM was forwarded first");
    assert!(took >= Duration::from_millis(450) && took < Duration::from_millis(1500), "exit {took:?} after SIGTERM");
    assert!(tool.stderr().contains("signal 15 forwarded to the child; SIGKILL in 500ms"), "{}", tool.stderr());
    assert!(wait_for(Duration::from_secs(1), || group.left().is_empty()), "left: {:?}", group.left());
    println!("cli {} forwarded SIGTERM ignored: SIGKILL, exit {took:?} after it", db.label);
}

/// The child's environment and signals: the DSN's variable is not passed
/// on (`LEADERELECTION_DSN`, or `DATABASE_URL` when it was the DSN) unless
/// `--keep-dsn-env`; SIGINT and SIGQUIT, ignored by the shell that started
/// the tool (a script's background job), are at their defaults in the child.
pub fn child_env_and_signals(db: &Db) {
    let dir = TempDir::new();
    let file = dir.path().join("env");
    let script = format!(
        "echo \"dsn=${{LEADERELECTION_DSN:-unset}} url=${{DATABASE_URL:-unset}}\" > {f}; \
         grep SigIgn /proc/$$/status >> {f}",
        f = file.display()
    );
    let name = db.name("childenv");
    let run = |var: &str, extra: &[&str]| -> String {
        let _ = fs::remove_file(&file);
        let mut cmd = Command::new("sh");
        // A background job's shell ignores SIGINT and SIGQUIT; so does `trap ''`.
        cmd.args(["-c", "trap '' INT QUIT; exec \"$@\"", "sh", BIN, "run", "--table", &db.table, "--name", &name]);
        cmd.args(TIMING).args(extra).args(["--", "sh", "-c", &script]);
        cmd.env_remove("LEADERELECTION_DSN").env_remove("DATABASE_URL").env(var, &db.dsn);
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        fs::read_to_string(&file).unwrap()
    };
    let env = run("LEADERELECTION_DSN", &[]);
    assert!(env.starts_with("dsn=unset url=unset\n"), "{env}");
    let ign = u64::from_str_radix(env.lines().nth(1).unwrap().trim_start_matches("SigIgn:").trim(), 16).unwrap();
    assert_eq!(ign & (bit(libc::SIGINT) | bit(libc::SIGQUIT)), 0, "the child ignores SIGINT or SIGQUIT: {env}");
    assert!(run("DATABASE_URL", &[]).starts_with("dsn=unset url=unset\n"), "DATABASE_URL as the DSN is removed");
    let kept = run("LEADERELECTION_DSN", &["--keep-dsn-env"]);
    assert!(kept.starts_with(&format!("dsn={} url=unset\n", db.dsn)), "{kept}");
}

/// Interactive use: the tool on a terminal (a pseudo-terminal, its
/// controlling terminal, the tool's group in the foreground), its child
/// reading a line from it. The child's group gets the terminal, so the read
/// is not stopped by SIGTTIN; Ctrl-Z at the terminal stops the child, and
/// the tool continues it (no job control under it); the tool exits with
/// the child's status, the terminal back with the tool's group.
pub fn terminal_child(db: &Db) {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (mut master, slave) = {
        let (mut m, mut s) = (0, 0);
        // SAFETY: openpty fills two fds we then own; the other pointers may be null.
        let rc = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
        assert_eq!(rc, 0, "openpty");
        // SAFETY: fresh fds from openpty, owned here only.
        unsafe { (fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
    };
    let dir = TempDir::new();
    let (file, stderr) = (dir.path().join("got"), dir.path().join("stderr"));
    let name = db.name("tty");
    let script = format!("echo ready > {f}.r; read line; echo \"got $line\" > {f}; exit 6", f = file.display());
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--dsn", &db.dsn, "--table", &db.table, "--name", &name]).args(TIMING);
    cmd.args(["--", "sh", "-c", &script]);
    cmd.stdin(slave.try_clone().unwrap()).stdout(slave).stderr(fs::File::create(&stderr).unwrap());
    // SAFETY: setsid and ioctl(TIOCSCTTY) are async-signal-safe; fd 0 is
    // the pty's slave by then: it becomes the controlling terminal, with
    // the tool's group (the new session's) in the foreground.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let mut tool = Tool { child, stderr, _dir: dir };
    let ready = file.with_extension("r");
    assert!(wait_for(Duration::from_secs(5), || ready.exists()), "no child: {}", tool.stderr());
    // Ctrl-Z (the terminal's VSUSP) while the child reads, then the line.
    master.write_all(b"\x1a").unwrap();
    assert!(
        wait_for(Duration::from_secs(3), || tool.stderr().contains("job control is not supported")),
        "the stop was not seen: {}",
        tool.stderr()
    );
    master.write_all(b"hello\n").unwrap();
    let code = tool.code(Duration::from_secs(5));
    let got = fs::read_to_string(&file).unwrap_or_default();
    assert_eq!((code, got.as_str()), (6, "got hello\n"), "stderr: {}", tool.stderr());
}

/// A clean hand-over between two runs that poll once a minute (`--retry
/// 60s`, `--lease 10s`): with the feed of releases the waiting run's child starts within
/// 3 s of the leader's child ending (printed, child to child); with
/// `--no-release-feed` on both, the control, it does not, since only the
/// poll could tell the waiting run.
pub fn release_feed_handover(db: &Db, feed: bool) {
    let name = db.name(if feed { "feed" } else { "poll-only" });
    let dir = TempDir::new();
    let (file, go) = (dir.path().join("log"), dir.path().join("go"));
    // A follower looks again at the lease's expiry as it saw it, so the
    // lease is long too: within 3 s of the release only the feed can tell.
    let slow = ["--retry", "60s", "--lease", "10s"];
    let extra: &[&str] = if feed { &slow } else { &[slow[0], slow[1], slow[2], slow[3], "--no-release-feed"] };
    let script = format!(
        "echo \"start $(date +%s%N) $$\" >> {f}; while [ ! -e {g} ]; do sleep 0.01; done; \
         echo \"end $(date +%s%N) $$\" >> {f}",
        f = file.display(),
        g = go.display()
    );
    let mut a = db.run(&name, extra, &script);
    assert!(wait_for(Duration::from_secs(5), || first(&file, "start").is_some()), "a never led: {}", a.stderr());
    let mut b = db.run(&name, extra, &script);
    // b has looked once and seen a lead; its next poll is a minute away.
    assert!(wait_for(Duration::from_secs(5), || b.stderr().contains("leader is")), "b never looked: {}", b.stderr());
    // MySQL: b's store opens the session that waits on a's lock after that
    // look; a release before it waits is heard only by the poll.
    thread::sleep(Duration::from_millis(500)); // not waiting on an outcome
    fs::write(&go, "").unwrap();
    assert_eq!(a.code(Duration::from_secs(5)), 0, "{}", a.stderr());
    let starts = || events(&file).into_iter().filter(|e| e.kind == "start").count();
    let led = wait_for(Duration::from_secs(3), || starts() == 2);
    let ev = events(&file);
    if feed {
        assert!(led, "b did not lead within 3 s of a's release: {ev:?}\n{}\n{}", a.stderr(), b.stderr());
        let end = ev.iter().find(|e| e.kind == "end").unwrap().ns;
        let next = ev.iter().filter(|e| e.kind == "start").nth(1).unwrap().ns;
        assert!(next > end, "b's child started before a's ended: {ev:?}");
        println!("cli {} release feed: child to child {:.1} ms", db.label, (next - end) as f64 / 1e6);
        assert_eq!(b.code(Duration::from_secs(5)), 0, "{}", b.stderr());
    } else {
        assert!(!led, "b led within 3 s without the feed, so the check cannot tell the feed from the poll: {ev:?}");
    }
}
