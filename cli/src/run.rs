//! `leaderelection run`: campaign, run the command while leading, and stop
//! it before the term can end under it.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{period_slot, Config, ElectionError, Elector, LeaderGuard, SlotClaim, Store, WaitLeaderError};

use crate::args::{Fail, Human, RunArgs, Slot};
use crate::{db, sys, EX_LOST, EX_NOPERM, EX_SLOT_DONE, EX_TEMPFAIL, EX_USAGE};

/// How long before the term's local deadline the child is SIGKILLed at the
/// latest, so that it is gone (signal delivered, process torn down) before
/// the deadline even on a loaded host. The local deadline itself already
/// lies a safety margin before the database lets anyone else in.
pub const KILL_AHEAD: Duration = Duration::from_millis(250);

/// The supervisor's longest sleep: how late it may notice the child's exit
/// or a term that ended early. Deadlines it knows of are slept to exactly.
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
    args: RunArgs,
    signals: Arc<Signals>,
    store: Arc<dyn Store>,
    opened: db::Opened,
}

impl Runner {
    fn say(&self, msg: impl AsRef<str>) {
        if !self.args.quiet {
            eprintln!("leaderelection: {}", msg.as_ref());
        }
    }

    /// Waits for a term; `Err` is the exit: `--wait` ran out, a signal came,
    /// or the database reports a fatal error.
    fn campaign(&self, elector: &Elector) -> Result<LeaderGuard, Fail> {
        let until = self.args.wait.and_then(|w| Instant::now().checked_add(w));
        loop {
            if let Some(sig) = self.signals.received() {
                return Err(Fail::new(128 + sig, format!("signal {sig} received while waiting to lead")));
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
                    return Err(Fail::new(code, format!("not leader within {}", Human(wait))));
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
                Err(Fail::new(
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
        // The running executable itself, even if its file was replaced or
        // removed since (an upgrade under a `--loop` service).
        let mut sentinel = Command::new("/proc/self/exe");
        sentinel.arg0("leaderelection").arg(sys::SENTINEL_ARG).arg(std::process::id().to_string());
        sentinel.stdin(Stdio::null()).stdout(Stdio::null()).process_group(0);
        sys::prepare_sentinel(&mut sentinel);
        let mut sentinel = sentinel
            .spawn()
            .map_err(|e| Fail::new(1, format!("cannot start the sentinel, so not running the command: {e}")))?;
        let pgid = sentinel.id() as i32;
        let mut cmd = Command::new(&self.args.cmd[0]);
        cmd.args(&self.args.cmd[1..])
            .env("LEADERELECTION_FENCE", guard.fence().to_string())
            .env("LEADERELECTION_NAME", &self.args.name)
            .env("LEADERELECTION_IDENTITY", elector.identity())
            .process_group(pgid);
        // The lease check for the child's own transactions. When it cannot
        // be written, the variable is unset (and said so), never empty, so
        // `${LEADERELECTION_CHECK_SQL:?}` stops a script rather than run
        // its writes unchecked.
        match guard
            .lease_check()
            .map_err(|e| e.to_string())
            .and_then(|c| self.opened.check_sql(&c).map_err(|e| e.to_string()))
        {
            Ok(q) => {
                cmd.env("LEADERELECTION_CHECK_SQL", q);
            }
            Err(e) => {
                cmd.env_remove("LEADERELECTION_CHECK_SQL");
                eprintln!("leaderelection: LEADERELECTION_CHECK_SQL is not set for the command: {e}");
            }
        }
        sys::prepare_child(&mut cmd);
        match cmd.spawn() {
            Ok(child) => {
                st.pgid = Some(pgid);
                Ok(Some(Job { child, sentinel, pgid }))
            }
            Err(e) => {
                sys::kill_group(pgid, libc::SIGKILL);
                let _ = sentinel.wait();
                let code = if e.kind() == io::ErrorKind::NotFound { 127 } else { 126 };
                Err(Fail::new(code, format!("cannot run {:?}: {e}", self.args.cmd[0])))
            }
        }
    }

    /// Watches the term while the child runs. SIGTERM to the group once no
    /// renewal has landed by `deadline - grace - KILL_AHEAD`, or at once
    /// when the term ends; SIGKILL at `deadline - KILL_AHEAD`, or `grace`
    /// after a SIGTERM for an ended term if that comes first. Once stopping,
    /// a renewal that lands late changes nothing.
    fn supervise(&self, job: Job, guard: &LeaderGuard) -> io::Result<Ended> {
        let Job { mut child, mut sentinel, pgid } = job;
        let pid = child.id() as i32;
        let grace = self.args.grace;
        let mut deadline = guard.valid_until();
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        loop {
            if sys::exited_unreaped(pid)? {
                // Whatever else of its group is left goes too, the sentinel
                // with it. The group id is the sentinel's pid, which cannot
                // be reused before the sentinel is reaped, below.
                sys::kill_group(pgid, libc::SIGKILL);
                let status = {
                    let mut st = self.signals.lock();
                    st.pgid = None;
                    child.wait()?
                };
                sentinel.wait()?;
                if kill_at.is_some() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.say(format!("child gone {} before the local deadline", Human(left)));
                }
                return Ok(Ended { status, stopped: kill_at.is_some() });
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
                    self.say(format!("{why}; SIGTERM to the child, SIGKILL in {}", Human(at - now.min(at))));
                    sys::kill_group(pgid, libc::SIGTERM);
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
            thread::sleep(wake.saturating_duration_since(Instant::now()));
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

    fn terms(&self, elector: &Elector) -> Result<i32, Fail> {
        loop {
            let guard = self.campaign(elector)?;
            self.say(format!("leading, fence {}", guard.fence()));
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
                return Err(Fail::new(128 + sig, format!("signal {sig} received before the child started")));
            };
            let ended = self.supervise(job, &guard).map_err(|e| Fail::new(1, format!("watching the child: {e}")))?;
            let code = exit_code(ended.status);
            // Before the release: a retrying run that leads next must find
            // how this one ended.
            if let Some(slot) = &slot {
                match guard.finish_slot(slot, code) {
                    Ok(true) => {}
                    Ok(false) => self.say(format!("slot {slot:?} was taken over by a later run; status not recorded")),
                    Err(e) => self.say(format!("could not record the exit status for slot {slot:?}: {e}")),
                }
            }
            // Hands the lease over at once if the term is still ours.
            let _ = guard.resign();
            let signalled = self.signals.received().is_some();
            if !self.args.looping {
                return match ended.stopped && !signalled {
                    true => Err(Fail::new(EX_LOST, "leadership lost; the child was stopped")),
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

/// Runs `leaderelection run`; returns the exit status.
pub fn run(args: RunArgs) -> Result<i32, Fail> {
    let t = args.timing;
    t.validate().map_err(|e| Fail::usage(e.to_string()))?;
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
    let opened = db::open_as(&args.db)?;
    let store = opened.store();
    db::inspect(&*store, &args.name, t.operation_timeout)?;

    let mut config = Config::new(Arc::clone(&store), args.name.clone()).timing(t);
    if let Some(id) = &args.identity {
        config = config.identity(id.as_str());
    }
    if let Some(p) = &args.payload {
        config = config.payload(p.as_bytes());
    }
    let elector = Elector::start(config).map_err(|e| match e {
        leaderelection::StartError::Config(c) => Fail::new(EX_USAGE, c.to_string()),
        other => Fail::new(1, other.to_string()),
    })?;

    let signals = Arc::new(Signals::default());
    let s = Arc::clone(&signals);
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || s.forward_forever())
        .map_err(|e| Fail::new(1, format!("cannot start the signal thread: {e}")))?;
    let runner = Runner { args, signals, store, opened };
    let result = runner.terms(&elector);
    let _ = elector.shutdown();
    result
}
