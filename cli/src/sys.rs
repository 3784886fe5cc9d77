//! The system calls std does not wrap: signal masks, `sigwait`, signals to a
//! process group, `waitid(WNOWAIT)`, `PR_SET_PDEATHSIG`, the controlling
//! terminal's foreground group, and the sentinel built from them. The only unsafe code of the tool, each block with the
//! reason it is sound.

use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The signals the tool forwards to its child instead of dying of them.
pub const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The signal the kernel sends the sentinel when the tool dies.
const DEATH_SIGNAL: libc::c_int = libc::SIGUSR1;

/// The hidden subcommand that makes the tool's executable a sentinel.
pub const SENTINEL_ARG: &str = "__sentinel";

fn set_of(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before
    // sigaddset reads it, and both only write the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in sigs {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

fn forwarded_set() -> libc::sigset_t {
    set_of(&FORWARDED)
}

/// Blocks [`FORWARDED`] in the calling thread. Called first thing in `main`,
/// before any thread exists, so every thread inherits the mask and the
/// signals stay pending until [`wait_forwarded`] takes them.
pub fn block_forwarded() -> io::Result<()> {
    let set = forwarded_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Waits for the next of [`FORWARDED`] sent to the process; returns its number.
pub fn wait_forwarded() -> libc::c_int {
    let set = forwarded_set();
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: both pointers are to live locals of the right types.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            return sig;
        }
    }
}

/// Sends `sig` to every process of group `pgid`; false when none is left.
/// Never for `pgid` 1 or less: `kill(-1)` would mean every process.
pub fn kill_group(pgid: i32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) takes plain integers; a negative pid names a group.
    pgid > 1 && unsafe { libc::kill(-pgid, sig) } == 0
}

/// Whether child `pid` has exited, without reaping it: while it is a zombie
/// its pid, and so its process group id, cannot be reused, so the group can
/// still be signalled safely.
pub fn exited_unreaped(pid: i32) -> io::Result<bool> {
    // SAFETY: siginfo_t is plain data, zeroed so that si_pid reads 0 when no
    // child changed state (WNOHANG); waitid writes only into it.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(info.si_pid() != 0)
    }
}

/// Blocks until child `pid` has exited, without reaping it (see
/// [`exited_unreaped`]): the supervisor's thread for the exit waits here,
/// so the exit is seen at once rather than at the next look.
pub fn wait_exited_unreaped(pid: i32) -> io::Result<()> {
    loop {
        // SAFETY: as in `exited_unreaped`; without WNOHANG, waitid returns
        // once the child has exited, writing only into `info`.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One line on stderr, `leaderelection: ` first; a closed or full stderr is
/// no reason to fail (`eprintln!` would panic, and take the supervisor down
/// with it).
pub fn say(msg: &str) {
    let _ = writeln!(io::stderr(), "leaderelection: {msg}");
}

/// Whether the tool was started with SIGHUP ignored (`nohup`).
pub fn hup_ignored() -> bool {
    // SAFETY: sigaction with a null new action only reads the current
    // disposition into `old`, plain data we own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Sets `sig` to `SIG_IGN` (or back to `SIG_DFL`).
fn set_ignored(sig: libc::c_int, ignore: bool) {
    // SAFETY: signal(2) with SIG_IGN or SIG_DFL installs no handler.
    unsafe { libc::signal(sig, if ignore { libc::SIG_IGN } else { libc::SIG_DFL }) };
}

/// Whether stdin is the controlling terminal and the tool's process group
/// its foreground group (run interactively, not in the background): then
/// CMD's group gets the terminal while it runs ([`Terminal`]).
pub fn foreground_terminal() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp take plain integers.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// The terminal on stdin, given to a child's process group; dropped, it is
/// given back to the tool's group. SIGTTOU is ignored in the tool from the
/// first give on, so that the tool, then in a background group, may take
/// the terminal back and write to it; CMD gets it at its default again
/// ([`prepare_child`]).
pub struct Terminal {
    pgid: libc::pid_t,
}

impl Terminal {
    pub fn give(pgid: libc::pid_t) -> Terminal {
        set_ignored(libc::SIGTTOU, true);
        let t = Terminal { pgid };
        t.give_again();
        t
    }

    /// Makes the group the terminal's foreground again (after a stop).
    pub fn give_again(&self) {
        // SAFETY: tcsetpgrp takes plain integers; a failure changes nothing.
        if unsafe { libc::tcsetpgrp(0, self.pgid) } != 0 {
            say(&format!("cannot give the terminal to the command: {}", io::Error::last_os_error()));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // SAFETY: as above; getpgrp cannot fail.
        unsafe { libc::tcsetpgrp(0, libc::getpgrp()) };
    }
}

/// The signal that stopped child `pid`, if it stopped since last asked
/// (`waitid(WSTOPPED)`: reports a stop once, and reaps nothing).
pub fn stopped(pid: i32) -> io::Result<Option<i32>> {
    // SAFETY: as in `exited_unreaped`.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WSTOPPED | libc::WNOHANG;
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((info.si_pid() != 0 && info.si_code == libc::CLD_STOPPED).then(|| info.si_status()))
    }
}

/// Sets up the child between fork and exec: unblocks [`FORWARDED`] (the
/// mask is inherited, and std keeps it); sets every signal back to its
/// default disposition (a shell's background job starts with SIGINT and
/// SIGQUIT ignored, and the tool ignores SIGTTOU), except SIGHUP when
/// `keep_hup_ignored` (nohup); and makes the child receive SIGKILL
/// when the thread that spawned it dies (the tool's main thread, so: when
/// the tool dies, even by SIGKILL). The latter covers the direct child only;
/// the rest of its group is the sentinel's job ([`prepare_sentinel`]).
pub fn prepare_child(cmd: &mut Command, keep_hup_ignored: bool) {
    let parent = std::process::id() as libc::pid_t;
    let set = forwarded_set();
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (sigprocmask, signal, prctl, getppid),
    // allocating nothing; `set` is an initialised copy it owns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            for sig in 1..32 {
                if sig == libc::SIGKILL || sig == libc::SIGSTOP || (sig == libc::SIGHUP && keep_hup_ignored) {
                    continue;
                }
                libc::signal(sig, libc::SIG_DFL);
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The tool may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Sets up the sentinel between fork and exec (`leaderelection __sentinel
/// TOOL-PID`, started in a new process group that CMD then joins). It blocks
/// [`DEATH_SIGNAL`] first, so the signal stays pending until the sentinel
/// takes it with `sigwait` and can never kill it before it is ready (the mask
/// survives exec), and [`FORWARDED`], so that the signals the tool forwards
/// to the group stay pending forever instead of killing it. Then it asks for
/// [`DEATH_SIGNAL`] when the thread that spawned it dies (the tool's main
/// thread: so when the tool dies, even by SIGKILL).
pub fn prepare_sentinel(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    let set = set_of(&[DEATH_SIGNAL, libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
    // SAFETY: as in `prepare_child`: only async-signal-safe calls, no
    // allocation, `set` an initialised copy the closure owns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, DEATH_SIGNAL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// The sentinel's whole life: wait for the tool (`tool`, its parent) to die,
/// then SIGKILL the process group it leads, which holds CMD and everything
/// CMD started that stayed in the group, and the sentinel itself. If the
/// tool is gone already, at once. It only ever kills its own group, and
/// only one it leads, so running `__sentinel` by hand cannot kill anything
/// else; the tool ends it with a SIGKILL to the group.
pub fn sentinel(tool: Option<libc::pid_t>) -> i32 {
    // SAFETY: getpid and getpgrp take no arguments and cannot fail.
    let (pid, pgid) = unsafe { (libc::getpid(), libc::getpgrp()) };
    let Some(tool) = tool.filter(|_| pid == pgid) else {
        eprintln!("leaderelection: {SENTINEL_ARG} is internal to `leaderelection run`");
        return 64;
    };
    // Started as /proc/self/exe, it would show as `exe` in top and pgrep.
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"leaderelection".as_ptr(), 0, 0, 0) };
    let set = set_of(&[DEATH_SIGNAL]);
    // The kernel reparents the sentinel before it sends the signal, so a
    // stray SIGUSR1 from anyone else while the tool lives changes nothing.
    // The signal is blocked (`prepare_sentinel`), so it waits, pending,
    // even if it came before this loop.
    // SAFETY: getppid takes no arguments and cannot fail.
    while unsafe { libc::getppid() } == tool {
        let mut sig: libc::c_int = 0;
        // SAFETY: both pointers are to live locals of the right types.
        unsafe { libc::sigwait(&set, &mut sig) };
    }
    kill_group(pgid, libc::SIGKILL);
    1
}

/// SIGPIPE back to its default (Rust starts programs with it ignored), so
/// that writing to a closed pipe ends the process quietly instead of
/// failing `println!` with a panic.
pub fn default_sigpipe() {
    set_ignored(libc::SIGPIPE, false);
}
