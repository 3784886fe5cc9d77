//! `leaderelection`: run a command only while this process leads an election
//! held in PostgreSQL or MySQL/MariaDB, and never let it outlive the lease.

mod args;
mod db;
mod logger;
mod run;
mod status;
mod sys;

use args::{Cmd, Fail};

/// Bad usage: flags, durations, timings, DSN or table name (sysexits EX_USAGE).
pub const EX_USAGE: i32 = 64;
/// The database could not be reached at start (EX_UNAVAILABLE).
pub const EX_UNAVAILABLE: i32 = 69;
/// Not leader within `--wait` (EX_TEMPFAIL); `-E N` changes it.
pub const EX_TEMPFAIL: i32 = 75;
/// The run's slot was already run by an earlier run; `-E N` changes it.
pub const EX_SLOT_DONE: i32 = 76;
/// A fatal database error: credentials, unknown database, missing table,
/// privilege (EX_NOPERM).
pub const EX_NOPERM: i32 = 77;
/// Leadership was lost or at risk and the child was stopped.
pub const EX_LOST: i32 = 79;

fn main() {
    let mut argv = std::env::args_os().skip(1).peekable();
    // `run`'s sentinel (see run.rs), not a subcommand for users: first, so
    // that nothing else happens in it.
    if argv.peek().is_some_and(|a| a == sys::SENTINEL_ARG) {
        let tool = argv.nth(1).and_then(|a| a.to_str()?.parse().ok()).filter(|&p: &i32| p > 1);
        std::process::exit(sys::sentinel(tool));
    }
    // Before any thread exists, so that every thread inherits the mask and
    // only the signal thread of `run` ever takes these signals.
    if argv.peek().is_some_and(|a| a == "run") {
        if let Err(e) = sys::block_forwarded() {
            eprintln!("leaderelection: cannot block signals: {e}");
            std::process::exit(1);
        }
    } else {
        // `status | head -1`, `schema | true`: a closed pipe ends the
        // printing subcommands quietly, as it does any Unix tool (`run`
        // writes only stderr lines, and ignores their failures).
        sys::default_sigpipe();
    }
    let result = args::parse(argv).and_then(|cmd| match cmd {
        Cmd::Run(a) => {
            logger::install(a.quiet);
            run::run(*a)
        }
        Cmd::Status(a) => status::status(a),
        Cmd::Schema(a) => status::schema(a),
        Cmd::AfterRestore(a) => status::after_restore(a),
        Cmd::Help(text) => {
            print!("{text}");
            Ok(0)
        }
        Cmd::Version => {
            println!("leaderelection {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
    });
    let code = result.unwrap_or_else(|Fail { code, msg, .. }| {
        if !msg.is_empty() {
            sys::say(&msg);
        }
        code
    });
    std::process::exit(code);
}
