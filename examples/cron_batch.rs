//! A batch job that cron starts on every host at the same time, and that
//! must do its work once per slot (once a day, once an hour), not once per
//! host.
//!
//! Leading is not enough: a host whose cron fires late, or that waited for
//! the lease while the first host ran the job, leads after the first has
//! finished, and would run the job again. So the leader claims the run's
//! slot, in the same statement that checks it still holds the lease, and
//! only the term that claimed it does the work; every other copy says it
//! skipped.
//!
//! ```cron
//! 15 3 * * *  DATABASE_URL=postgres://cron@db.internal/ops /opt/jobs/cron_batch --every 1d
//! ```
//!
//! Options: `--dsn URL` (or `DATABASE_URL`; `postgres://` or `mysql://`),
//! `--id NAME` (default `$HOSTNAME`), `--name ELECTION` (default
//! `nightly-batch`), `--every DURATION` (the slot is that period's start
//! by the database's clock, UTC; default `1d`) or `--slot NAME` (a slot
//! named by you), `--wait DURATION` (how long to wait to lead; default
//! 30s), `--work DURATION` (how long the stand-in job takes; default 1s),
//! `--lease DURATION` (default 15s). Exits 0 when it did the work or
//! another copy did; 1 on errors.

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leaderelection::{period_slot, Config, Elector, LeaderGuard, SlotClaim, Store, WaitLeaderError};

use common::Flags;

fn main() -> ExitCode {
    common::exit("cron_batch", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let args = Args::parse()?;
    let store = leaderelection::connect(&args.dsn)?;
    store.ensure_schema()?;
    let config =
        common::lease_timings(Config::new(store.clone(), args.name.as_str()), args.lease).identity(args.id.as_str());
    let elector = Elector::start(config)?;

    let guard = match elector.wait_leader_timeout(args.wait) {
        Ok(guard) => guard,
        Err(WaitLeaderError::Timeout) => {
            println!("{} skipped: another copy led for the whole {:?}", args.id, args.wait);
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let slot = match &args.slot {
        Some(name) => name.clone(),
        // The database's clock, read inside the term: every host names the
        // same slot whatever its own clock says.
        None => period_slot(store.inspect(&args.name, args.lease / 6)?.now.as_unix_micros(), args.every),
    };
    match guard.claim_slot(&slot)? {
        SlotClaim::Claimed => {
            println!("{} claimed slot {slot} fence={}", args.id, guard.fence());
            let outcome = match work(&guard, args.work) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{} slot {slot} failed: {e}", args.id);
                    1
                }
            };
            guard.finish_slot(&slot, outcome)?;
            println!("{} did slot {slot} fence={} outcome={outcome}", args.id, guard.fence());
        }
        SlotClaim::Taken { fence, outcome } => {
            println!("{} skipped slot {slot}: done by fence={fence} outcome={outcome:?}", args.id);
        }
        _ => return Err("a slot claim this program does not know".into()),
    }
    drop(guard); // resigns: the next copy leads at once and finds the slot taken
    elector.shutdown()?;
    Ok(())
}

/// The job: stands in for a report, an export, a cleanup. It stops as soon
/// as the term ends, and stamps whatever it writes with `guard.fence()`.
fn work(guard: &LeaderGuard, takes: Duration) -> Result<(), Box<dyn Error>> {
    let done = Instant::now() + takes;
    while Instant::now() < done {
        if !guard.is_valid() {
            return Err("the term ended mid-job".into());
        }
        guard.wait_lost_timeout(Duration::from_millis(100));
    }
    Ok(())
}

struct Args {
    dsn: String,
    id: String,
    name: String,
    slot: Option<String>,
    every: Duration,
    wait: Duration,
    work: Duration,
    lease: Duration,
}

impl Args {
    fn parse() -> Result<Args, Box<dyn Error>> {
        let f = Flags::parse(&["--id", "--name", "--slot", "--every", "--wait", "--work", "--lease"])?;
        Ok(Args {
            dsn: f.dsn()?,
            id: f.get("--id").or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_else(|| "batch".into()),
            name: f.text("--name", "nightly-batch"),
            slot: f.get("--slot"),
            every: f.duration("--every", Duration::from_secs(86_400))?,
            wait: f.duration("--wait", Duration::from_secs(30))?,
            work: f.duration("--work", Duration::from_secs(1))?,
            lease: f.duration("--lease", Duration::from_secs(15))?,
        })
    }
}
