//! A sharded worker: every replica runs the same 1,000 partition elections
//! in one `Group` with a fair share, so each leads about its share of them
//! and works on those only. A replica that joins makes the others hand
//! over their surplus; one that shuts down hands its partitions back at
//! once, and the others take them over.
//!
//! ```sh
//! cargo run --example sharded_worker --features postgres,mysql -- \
//!     --dsn postgres://app@db.internal/app --id shard-1 --for 10m
//! ```
//!
//! Options: `--dsn URL` (or `DATABASE_URL`; `postgres://` or `mysql://`),
//! `--id NAME` (default `shard`), `--name GROUP` (the group, and the
//! prefix of its partitions' elections; default `partitions`),
//! `--partitions N` (default 1000), `--for DURATION` (run that long, then
//! hand everything back; default a day), `--lease DURATION` (default 5s).
//!
//! It prints `<id> owns N of M partitions (share S): 3,7,...` (their
//! numbers) each time what it owns changes.

mod common;

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leaderelection::{Config, Group, GroupConfig, LeaderGuard};

use common::Flags;

fn main() -> ExitCode {
    common::exit("sharded_worker", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let args = Args::parse()?;
    let store = leaderelection::connect(&args.dsn)?;
    store.ensure_schema()?;
    let template = common::lease_timings(Config::new(store, args.name.as_str()), args.lease).identity(args.id.as_str());
    // The group's callback hands each new term's guard to the work loop
    // below, which keeps it for as long as the term lasts.
    let (started, terms) = crossbeam_channel::unbounded::<(String, LeaderGuard)>();
    let group = Group::start(
        GroupConfig::new(template)
            .fair_share(true)
            .on_started_leading(move |partition, guard| drop(started.send((partition.to_owned(), guard)))),
    )?;
    let partitions =
        (0..args.partitions).map(|i| group.join(&format!("{}-{i:04}", args.name))).collect::<Result<Vec<_>, _>>()?;

    let stop_at = Instant::now() + args.run_for;
    let mut owned: BTreeMap<usize, LeaderGuard> = BTreeMap::new();
    let mut reported = None;
    while Instant::now() < stop_at {
        while let Ok((partition, guard)) = terms.try_recv() {
            if let Some(i) = partition.rsplit('-').next().and_then(|n| n.parse().ok()) {
                owned.insert(i, guard);
            }
        }
        // A term that ended (handed to another replica to even out the
        // shares, or lost) drops its guard here, so the next can start.
        owned.retain(|_, guard| guard.is_valid());
        for guard in owned.values() {
            work(guard);
        }
        let now: Vec<usize> = owned.keys().copied().collect();
        if reported.as_ref() != Some(&now) {
            let share = group.status().share.map_or("-".into(), |s| s.to_string());
            let list: Vec<String> = now.iter().map(usize::to_string).collect();
            println!(
                "{} owns {} of {} partitions (share {share}): {}",
                args.id,
                now.len(),
                partitions.len(),
                list.join(",")
            );
            reported = Some(now);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let count = owned.len();
    group.shutdown()?; // ends every term and releases every lease in one batch
    drop(owned);
    println!("{} handed back {count} partitions", args.id);
    Ok(())
}

/// One step of a partition's work, stamped with its term's fence.
fn work(guard: &LeaderGuard) {
    if guard.is_valid() {
        let _fence = guard.fence(); // your write here
    }
}

struct Args {
    dsn: String,
    id: String,
    name: String,
    partitions: usize,
    run_for: Duration,
    lease: Duration,
}

impl Args {
    fn parse() -> Result<Args, Box<dyn Error>> {
        let f = Flags::parse(&["--id", "--name", "--partitions", "--for", "--lease"])?;
        Ok(Args {
            dsn: f.dsn()?,
            id: f.text("--id", "shard"),
            name: f.text("--name", "partitions"),
            partitions: f.number("--partitions", 1000)?,
            run_for: f.duration("--for", Duration::from_secs(86_400))?,
            lease: f.duration("--lease", Duration::from_secs(5))?,
        })
    }
}
