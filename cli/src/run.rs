//! `leaderelection run`: campaign, run the command while leading, and stop
//! it before the term can end under it.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{period_slot, Config, ElectionError, Elector, LeaderGuard, SlotClaim, Store, WaitLeaderError};

use crate::args::{config_fail, Fail, Human, RunArgs, Slot};
use crate::{db, sys, EX_LOST, EX_NOPERM, EX_SLOT_DONE, EX_TEMPFAIL};

/// How long before the term's local deadline the child is SIGKILLed at the
/// latest, so that it is gone (signal delivered, process torn down) before
/// the deadline even on a loaded host. The local deadline itself already
/// lies a safety margin before the database lets anyone else in.
pub const KILL_AHEAD: Duration = Duration::from_millis(250);

/// The supervisor's longest sleep: how late it may notice a term that ended
/// early (the child's exit wakes it at once). Deadlines it knows of are
/// slept to exactly.
const STEP: Duration = Duration::from_millis(10);

/// What the signal thread and the main thread share: the running child's
/// process group and the signal received, if any. One lock, so a signal
/// can never fall between spawning a child and recording its group.
#[derive(Default)]
struct Signals {
    state: Mutex<SigState>,
}

#[derive(Default)]
struct SigState {
    pgid: Option<i32>,
    received: Option<i32>,
}

impl Signals {
    fn lock(&self) -> MutexGuard<'_, SigState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn received(&self) -> Option<i32> {
        self.lock().received
    }

    /// Takes each forwarded signal as it arrives, passes it to the child's
    /// group if one runs, and remembers it: it ends the campaign.
    fn forward_forever(&self) {
        loop {
            let sig = sys::wait_forwarded();
            let mut st = self.lock();
            st.received = Some(sig);
            if let Some(pgid) = st.pgid {
                sys::kill_group(pgid, sig);
            }
        }
    }
}

/// A running command and its sentinel. The sentinel leads the process
/// group (`pgid` is its pid) and CMD joins it, so the group exists, guarded,
/// before CMD or anything CMD starts. The kernel wakes the sentinel when
/// the tool dies, even by SIGKILL, and it SIGKILLs the group: CMD and its
/// descendants that stayed in the group (a shell's pipeline), which
/// `PR_SET_PDEATHSIG` on CMD alone would leave running without the lease.
struct Job {
    child: Child,
    sentinel: Child,
    pgid: i32,
    /// The terminal, given to the group while it runs (interactive use);
    /// dropped, the tool takes it back.
    tty: Option<sys::Terminal>,
}

/// How one child's run ended.
struct Ended {
    status: ExitStatus,
    /// The supervisor stopped it: the term was at risk or over.
    stopped: bool,
}

/// Exit status of a child: its code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

struct Runner {
    /// stdin is the terminal and the tool its foreground: CMD's group gets it.
    tty: bool,
    /// The tool was started with SIGHUP ignored (nohup): so is CMD.
    hup_ignored: bool,
    /// The last term was lost or at risk and its child stopped.
    lost: Cell<bool>,
    /// A sentinel started while campaigning, so that the term's command
    /// starts one process creation after the lease is won, not two (the
    /// hand-over's latency, issue 36). Idle, it leads a group of its own
    /// and nothing else; dropped unused, it is killed and reaped.
    spare: RefCell<Option<Child>>,
    args: RunArgs,
    signals: Arc<Signals>,
    store: Arc<dyn Store>,
    opened: leaderelection::AnyStore,
}

impl Runner {
    fn say(&self, msg: impl AsRef<str>) {
        if !self.args.quiet {
            sys::say(msg.as_ref());
        }
    }

    /// The elector's last failure, as a cause to name: `" (last failure:
    /// …)"`, or nothing.
    fn cause(&self, elector: &Elector) -> String {
        elector.status().last_error.map(|e| format!(" (last failure: {e})")).unwrap_or_default()
    }

    /// `--wait 0`: one attempt, as `flock -n` makes one. Waits until the
    /// elector has made its first attempt: it leads; or it saw another run's
    /// valid lease (exit 75 or `-E`); or the attempt failed (75, 77 for a
    /// fatal error); bounded by two operation timeouts and a little more.
    fn try_once(&self, elector: &Elector) -> Result<LeaderGuard, Fail> {
        let timeout = self.args.timing.operation_timeout;
        let bound = timeout * 2 + Duration::from_millis(250);
        let until = Instant::now() + bound;
        let code = self.args.wait_code.unwrap_or(EX_TEMPFAIL);
        loop {
            if let Some(sig) = self.signals.received() {
                return Err(Fail::losing(128 + sig, format!("signal {sig} received while waiting to lead")));
            }
            if let Some(guard) = elector.guard() {
                return Ok(guard);
            }
            let status = elector.status();
            if let Some(e) = status.last_error {
                let exit = if e.is_fatal() { EX_NOPERM } else { code };
                return Err(Fail::new(exit, format!("not leader: the attempt to lead failed: {e}")));
            }
            if let Some(l) = status.leader.filter(|l| l.valid && l.identity != elector.identity()) {
                let who = match l.identity.as_str() {
                    "" => "the lease is held for nobody after a database failover".to_owned(),
                    id => format!("{id} leads"),
                };
                return Err(Fail::losing(
                    code,
                    format!("not leader: {who} (fence {}); tried once (--wait 0)", l.fence),
                ));
            }
            if Instant::now() >= until {
                return Err(Fail::new(
                    code,
                    format!("not leader: no answer from the database within {}; tried once (--wait 0)", Human(bound)),
                ));
            }
            // The term's start wakes this at once; the observed lease and
            // errors are polled. (A guard dropped here would resign.)
            if let Ok(guard) = elector.wait_leader_deadline(Instant::now() + Duration::from_millis(5)) {
                return Ok(guard);
            }
        }
    }

    /// Waits for a term; `Err` is the exit: `--wait` ran out, a signal came,
    /// or the database reports a fatal error.
    fn campaign(&self, elector: &Elector) -> Result<LeaderGuard, Fail> {
        if self.args.wait == Some(Duration::ZERO) {
            return self.try_once(elector);
        }
        let until = self.args.wait.and_then(|w| Instant::now().checked_add(w));
        loop {
            if let Some(sig) = self.signals.received() {
                return Err(Fail::losing(128 + sig, format!("signal {sig} received while waiting to lead")));
            }
            if let Some(e) = elector.status().last_error.filter(|e| e.is_fatal()) {
                return Err(Fail::new(EX_NOPERM, format!("fatal database error: {e}")));
            }
            let step = Instant::now() + Duration::from_millis(50);
            match elector.wait_leader_deadline(until.map_or(step, |u| u.min(step))) {
                Ok(guard) => return Ok(guard),
                Err(WaitLeaderError::Timeout) if until.is_some_and(|u| Instant::now() >= u) => {
                    let wait = self.args.wait.unwrap_or_default();
                    let code = self.args.wait_code.unwrap_or(EX_TEMPFAIL);
                    return Err(Fail::losing(code, format!("not leader within {}", Human(wait))));
                }
                Err(WaitLeaderError::Timeout) => {}
                Err(WaitLeaderError::Stopped) => return Err(Fail::new(1, "the elector stopped")),
            }
        }
    }

    /// The run's slot, claimed for the term: `Ok(None)` without a slot,
    /// `Ok(Some(slot))` when this term claimed it (run CMD), `Err` to exit
    /// without running CMD: 76 (or `-E`) when an earlier run claimed it,
    /// 79 when the term ended on the way, 77 for a fatal store error, 75
    /// when the claim's outcome is unknown (it may have landed: with
    /// `--retry-failed` a later run takes it over).
    fn claim_slot(&self, guard: &LeaderGuard) -> Result<Option<String>, Fail> {
        let Some(how) = &self.args.slot else { return Ok(None) };
        let slot = match how {
            Slot::Named(name) => name.clone(),
            // The database's clock, read now, inside the term.
            Slot::Every(period) => match self.store.inspect(&self.args.name, self.args.timing.operation_timeout) {
                Ok(lease) => period_slot(lease.now.as_unix_micros(), *period),
                Err(e) => return Err(Fail::new(EX_TEMPFAIL, format!("reading the database clock for --every: {e}"))),
            },
        };
        let claim =
            if self.args.retry_failed { guard.claim_slot_retrying_failed(&slot) } else { guard.claim_slot(&slot) };
        match claim {
            Ok(SlotClaim::Taken { fence, outcome }) => {
                let how = match outcome {
                    Some(code) => format!("exited {code}"),
                    None => "recorded no exit status (it runs, or was killed)".to_owned(),
                };
                let code = self.args.wait_code.unwrap_or(EX_SLOT_DONE);
                Err(Fail::losing(
                    code,
                    format!("slot {slot:?} was already run (fence {fence}, {how}); not running the command"),
                ))
            }
            Ok(_) => {
                self.say(format!("slot {slot:?} claimed"));
                Ok(Some(slot))
            }
            Err(ElectionError::NotLeading) => Err(Fail::new(
                EX_LOST,
                format!("leadership lost while claiming slot {slot:?}; not running the command"),
            )),
            Err(e) if e.is_fatal() => Err(Fail::new(EX_NOPERM, format!("claiming slot {slot:?}: {e}"))),
            Err(e) => Err(Fail::new(EX_TEMPFAIL, format!("claiming slot {slot:?}: {e}; not running the command"))),
        }
    }

    /// Spawns the sentinel in a new group, then the command in that group
    /// (see [`Job`]), unless a signal already asked to stop. No sentinel, no
    /// command: exit 1. Spawn failures exit like a shell's: 127 not found,
    /// else 126.
    fn spawn(&self, elector: &Elector, guard: &LeaderGuard) -> Result<Option<Job>, Fail> {
        let mut st = self.signals.lock();
        if st.received.is_some() {
            return Ok(None);
        }
        // The spare, if it still runs (one that was killed is reaped here
        // and replaced: CMD never joins a group nobody guards).
        let spare = self.spare.take().and_then(|mut s| match s.try_wait() {
            Ok(None) => Some(s),
            _ => None,
        });
        let mut sentinel = match spare {
            Some(s) => s,
            None => start_sentinel()
                .map_err(|e| Fail::new(1, format!("cannot start the sentinel, so not running the command: {e}")))?,
        };
        let pgid = sentinel.id() as i32;
        // Interactive: the group gets the terminal before CMD joins it, so
        // CMD can read it from its first instruction on.
        let tty = self.tty.then(|| sys::Terminal::give(pgid));
        let mut cmd = Command::new(&self.args.cmd[0]);
        cmd.args(&self.args.cmd[1..])
            .env("LEADERELECTION_FENCE", guard.fence().to_string())
            .env("LEADERELECTION_NAME", &self.args.name)
            .env("LEADERELECTION_IDENTITY", elector.identity())
            .process_group(pgid);
        // The DSN, with its password, stays with the tool.
        if !self.args.keep_dsn_env {
            for var in db::dsn_vars(&self.args.db) {
                cmd.env_remove(var);
            }
        }
        // The lease check for the child's own transactions. When it cannot
        // be written, the variable is unset (and said so), never empty, so
        // `${LEADERELECTION_CHECK_SQL:?}` stops a script rather than run
        // its writes unchecked.
        match guard
            .lease_check()
            .map_err(|e| e.to_string())
            .and_then(|c| db::check_sql(&self.opened, &c).map_err(|e| e.to_string()))
        {
            Ok(q) => {
                cmd.env("LEADERELECTION_CHECK_SQL", q);
            }
            Err(e) => {
                cmd.env_remove("LEADERELECTION_CHECK_SQL");
                sys::say(&format!("LEADERELECTION_CHECK_SQL is not set for the command: {e}"));
            }
        }
        sys::prepare_child(&mut cmd, self.hup_ignored);
        match cmd.spawn() {
            Ok(child) => {
                st.pgid = Some(pgid);
                Ok(Some(Job { child, sentinel, pgid, tty }))
            }
            Err(e) => {
                sys::kill_group(pgid, libc::SIGKILL);
                let _ = sentinel.wait();
                drop(tty);
                let code = if e.kind() == io::ErrorKind::NotFound { 127 } else { 126 };
                Err(Fail::new(code, format!("cannot run {:?}: {e}", self.args.cmd[0])))
            }
        }
    }

    /// Watches the term while the child runs. SIGTERM to the group once no
    /// renewal has landed by `deadline - grace - KILL_AHEAD`, or at once
    /// when the term ends; SIGKILL at `deadline - KILL_AHEAD`, or `grace`
    /// after a SIGTERM for an ended term if that comes first. A forwarded
    /// signal (the signal thread passes it on) is followed by SIGKILL
    /// `grace` later, or at `deadline - KILL_AHEAD`. Once stopping, a
    /// renewal that lands late changes nothing.
    fn supervise(&self, elector: &Elector, job: Job, guard: &LeaderGuard) -> io::Result<Ended> {
        let Job { mut child, mut sentinel, pgid, tty } = job;
        let pid = child.id() as i32;
        let grace = self.args.grace;
        let mut deadline = guard.valid_until();
        let mut kill_at: Option<Instant> = None;
        // Stopping for the term (not for a forwarded signal).
        let mut for_term = false;
        let mut killed = false;
        // The exit is told at once by a thread blocked in waitid; the loop
        // below still looks every STEP for the term and signals, and falls
        // back to looking alone if that thread cannot start or fails.
        let (exit_tx, exit_rx) = mpsc::sync_channel::<()>(1);
        let mut exit_rx = thread::Builder::new()
            .name("child-exit".into())
            .spawn(move || {
                let _ = sys::wait_exited_unreaped(pid);
                let _ = exit_tx.send(());
            })
            .is_ok()
            .then_some(exit_rx);
        loop {
            if sys::exited_unreaped(pid)? {
                // Whatever else of its group is left goes too, the sentinel
                // with it. The group id is the sentinel's pid, which cannot
                // be reused before the sentinel is reaped, below.
                sys::kill_group(pgid, libc::SIGKILL);
                drop(tty);
                let status = {
                    let mut st = self.signals.lock();
                    st.pgid = None;
                    child.wait()?
                };
                sentinel.wait()?;
                if for_term {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.say(format!("child gone {} before the local deadline", Human(left)));
                }
                return Ok(Ended { status, stopped: for_term });
            }
            // Stopped (Ctrl-Z at the terminal, or SIGSTOP): a stopped CMD
            // would keep the terminal and the tool would lead on for
            // nothing, so it is continued.
            if let Some(sig) = sys::stopped(pid)? {
                self.say(format!(
                    "the command was stopped (signal {sig}); job control is not supported under \
                     `leaderelection run`: continuing it"
                ));
                if let Some(t) = &tty {
                    t.give_again();
                }
                sys::kill_group(pgid, libc::SIGCONT);
            }
            let now = Instant::now();
            if kill_at.is_none() {
                let why = if !guard.is_valid() {
                    Some(("term ended", (now + grace).min(deadline.checked_sub(KILL_AHEAD).unwrap_or(now))))
                } else {
                    deadline = guard.valid_until();
                    let kill = deadline.checked_sub(KILL_AHEAD).unwrap_or(now);
                    (now + grace >= kill).then_some(("term at risk: no renewal landed in time", kill))
                };
                if let Some((why, at)) = why {
                    let cause = self.cause(elector);
                    self.say(format!("{why}{cause}; SIGTERM to the child, SIGKILL in {}", Human(at - now.min(at))));
                    sys::kill_group(pgid, libc::SIGTERM);
                    kill_at = Some(at);
                    for_term = true;
                } else if let Some(sig) = self.signals.received() {
                    // The signal thread has passed it on already.
                    let at = (now + grace).min(deadline.checked_sub(KILL_AHEAD).unwrap_or(now));
                    self.say(format!(
                        "signal {sig} forwarded to the child; SIGKILL in {} if it is still running",
                        Human(at - now.min(at))
                    ));
                    kill_at = Some(at);
                }
            }
            let mut wake = now + STEP;
            match kill_at {
                Some(at) if !killed && now >= at => {
                    self.say("SIGKILL to the child");
                    sys::kill_group(pgid, libc::SIGKILL);
                    killed = true;
                }
                Some(at) if !killed => wake = wake.min(at),
                Some(_) => {}
                None => wake = wake.min(deadline.checked_sub(grace + KILL_AHEAD).unwrap_or(now)),
            }
            let left = wake.saturating_duration_since(Instant::now());
            match &exit_rx {
                Some(rx) => {
                    if let Err(mpsc::RecvTimeoutError::Disconnected) = rx.recv_timeout(left) {
                        exit_rx = None;
                    }
                }
                None => thread::sleep(left),
            }
        }
    }

    /// Sleeps one retry period between terms in loop mode; false when a
    /// signal asked to stop.
    fn pause(&self) -> bool {
        let until = Instant::now() + self.args.timing.retry_period;
        while Instant::now() < until {
            if self.signals.received().is_some() {
                return false;
            }
            thread::sleep(Duration::from_millis(20).min(until.saturating_duration_since(Instant::now())));
        }
        self.signals.received().is_none()
    }

    /// Starts the spare sentinel if there is none. A failure is left for
    /// [`Runner::spawn`] to meet and report.
    fn ready_sentinel(&self) {
        let mut spare = self.spare.borrow_mut();
        if spare.is_none() {
            *spare = start_sentinel().ok();
        }
    }

    fn terms(&self, elector: &Elector) -> Result<i32, Fail> {
        loop {
            self.ready_sentinel();
            // The library logs the term's start (and the leader it sees).
            let guard = self.campaign(elector)?;
            let slot = match self.claim_slot(&guard) {
                Ok(slot) => slot,
                Err(fail) => {
                    let _ = guard.resign();
                    return Err(fail);
                }
            };
            let Some(job) = self.spawn(elector, &guard)? else {
                let _ = guard.resign();
                let sig = self.signals.received().unwrap_or(libc::SIGTERM);
                return Err(Fail::losing(128 + sig, format!("signal {sig} received before the child started")));
            };
            let ended =
                self.supervise(elector, job, &guard).map_err(|e| Fail::new(1, format!("watching the child: {e}")))?;
            let code = exit_code(ended.status);
            self.lost.set(ended.stopped);
            // Before the release: a retrying run that leads next must find
            // how this one ended. Only while the term lasts: once it has
            // ended, the call cannot land, and would only delay the exit.
            if let Some(slot) = slot.as_ref().filter(|_| guard.is_valid()) {
                match guard.finish_slot(slot, code) {
                    Ok(true) => {}
                    Ok(false) => self.say(format!("slot {slot:?} was taken over by a later run; status not recorded")),
                    Err(e) => self.say(format!("could not record the exit status for slot {slot:?}: {e}")),
                }
            }
            let cause = self.cause(elector);
            // Hands the lease over at once if the term is still ours (at
            // most about one operation timeout). Not for a term stopped as
            // lost or at risk: its database is failing, so the attempt
            // would most likely only delay the exit, and the lease runs
            // out on its own within about grace + margin.
            if guard.is_valid() && !ended.stopped {
                let _ = guard.resign();
            } else {
                drop(guard);
            }
            let signalled = self.signals.received().is_some();
            if !self.args.looping {
                return match ended.stopped && !signalled {
                    true => Err(Fail::new(EX_LOST, format!("leadership lost; the child was stopped{cause}"))),
                    false => Ok(code),
                };
            }
            if signalled {
                return Ok(code);
            }
            if !ended.stopped {
                self.say(format!("child exited with status {code}; released, campaigning again"));
                if !self.pause() {
                    return Ok(code);
                }
            }
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut spare) = self.spare.take() {
            // Its group holds nothing but itself.
            sys::kill_group(spare.id() as i32, libc::SIGKILL);
            let _ = spare.wait();
        }
    }
}

/// Starts a sentinel (see [`Job`]): the running executable itself, even if
/// its file was replaced or removed since (an upgrade under a `--loop`
/// service), leading a new process group.
fn start_sentinel() -> io::Result<Child> {
    let mut sentinel = Command::new("/proc/self/exe");
    sentinel.arg0("leaderelection").arg(sys::SENTINEL_ARG).arg(std::process::id().to_string());
    sentinel.stdin(Stdio::null()).stdout(Stdio::null()).process_group(0);
    sys::prepare_sentinel(&mut sentinel);
    sentinel.spawn()
}

/// Runs `leaderelection run`; returns the exit status. Under `--quiet`, a
/// run that did not run CMD because another run leads or ran its slot
/// says nothing.
pub fn run(args: RunArgs) -> Result<i32, Fail> {
    let quiet = args.quiet;
    run_inner(args).map_err(|f| if quiet && f.losing { Fail { msg: String::new(), ..f } } else { f })
}

fn run_inner(args: RunArgs) -> Result<i32, Fail> {
    let t = args.timing;
    let floor = t.lease_duration.saturating_sub(t.safety_margin + t.renew_interval + t.operation_timeout);
    if args.grace + KILL_AHEAD >= floor {
        return Err(Fail::usage(format!(
            "--grace {} does not fit: grace + {} must be below lease - margin - renew - op-timeout \
             ({} - {} - {} - {} = {}), the least time a term has left between renewals",
            Human(args.grace),
            Human(KILL_AHEAD),
            Human(t.lease_duration),
            Human(t.safety_margin),
            Human(t.renew_interval),
            Human(t.operation_timeout),
            Human(floor)
        )));
    }
    let opened = db::open_as(&args.db)?.release_feed(!args.no_release_feed);
    let store: Arc<dyn Store> = Arc::new(opened.clone());
    db::inspect(&*store, &args.db, &args.name, t.operation_timeout)?;

    let mut config = Config::new(Arc::clone(&store), args.name.clone()).timing(t);
    if let Some(id) = &args.identity {
        config = config.identity(id.as_str());
    }
    if let Some(p) = &args.payload {
        config = config.payload(p.as_bytes());
    }
    let elector = Elector::start(config).map_err(|e| match e {
        leaderelection::StartError::Config(c) => config_fail(&c, false),
        other => Fail::new(1, other.to_string()),
    })?;

    let signals = Arc::new(Signals::default());
    let s = Arc::clone(&signals);
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || s.forward_forever())
        .map_err(|e| Fail::new(1, format!("cannot start the signal thread: {e}")))?;
    let tty = sys::foreground_terminal();
    let runner = Runner {
        tty,
        hup_ignored: sys::hup_ignored(),
        lost: Cell::new(false),
        spare: RefCell::new(None),
        args,
        signals,
        store,
        opened,
    };
    let result = runner.terms(&elector);
    if runner.lost.get() {
        // The term was lost or at risk (the database unreachable, most
        // likely): nothing of it is ours to hand over, and trying would
        // only delay the exit by up to two operation timeouts.
        elector.shutdown_without_release();
    } else {
        // Releases anything an attempt in flight may still have won, for
        // at most one operation timeout; the process exits after that
        // even if the call hangs (the lease then runs out on its own).
        let elector = Arc::new(elector);
        let e = Arc::clone(&elector);
        let (tx, rx) = std::sync::mpsc::channel();
        let stopper = thread::Builder::new().name("shutdown".into()).spawn(move || {
            let _ = e.shutdown();
            let _ = tx.send(());
        });
        if stopper.is_ok() {
            let _ = rx.recv_timeout(t.operation_timeout);
        }
    }
    result
}
