//! Leader and readers: every replica serves reads, one of them (the leader)
//! is the only writer, and what it publishes travels with its lease. Every
//! replica, the leader included, reads the leader's publication from the
//! election's row (`Status::leader`): the payload names the leader and what
//! it serves, so readers find it with nothing but the shared database. When
//! the leader stops, another replica takes over and its payload replaces
//! the old one.
//!
//! ```sh
//! cargo run --example leader_reader --features postgres,mysql -- \
//!     --dsn mysql://app@db.internal/app --id replica-1 --addr 10.0.0.1:8080 --for 10m
//! ```
//!
//! Options: `--dsn URL` (or `DATABASE_URL`; `postgres://` or `mysql://`),
//! `--id NAME` (default `replica`), `--addr HOST:PORT` (what this replica
//! publishes while it leads; default `<id>:8080`), `--name ELECTION`
//! (default `config-writer`), `--for DURATION` (run that long, then shut
//! down cleanly; default a day), `--lease DURATION` (default 15s).
//!
//! Prints `<id> leads term fence=N` when its term starts, and
//! `<id> reads leader=<id> fence=N payload=<...>` each time what it reads
//! changes.

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leaderelection::{base_identity, Config, Elector};

use common::Flags;

fn main() -> ExitCode {
    common::exit("leader_reader", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let args = Args::parse()?;
    let store = leaderelection::connect(&args.dsn)?;
    store.ensure_schema()?;
    // The publication: it lives on the lease row while this replica leads.
    let addr = args.addr.clone().unwrap_or_else(|| format!("{}:8080", args.id));
    let publication = format!("leader={} serves writes at {addr}", args.id);
    let id = args.id.clone();
    let config = common::lease_timings(Config::new(store, args.name.as_str()), args.lease)
        .identity(args.id.as_str())
        .payload(publication)
        // The writer's side: runs on its own thread for the whole term.
        .on_started_leading(move |guard| {
            println!("{id} leads term fence={}", guard.fence());
            while guard.is_valid() {
                // The one writer's work, stamped with guard.fence().
                guard.wait_lost_timeout(Duration::from_millis(200));
            }
            println!("{id} term fence={} over", guard.fence());
        });
    let elector = Elector::start(config)?;

    // The readers' side, on every replica: what the leader published.
    let stop_at = Instant::now() + args.run_for;
    let mut last = None;
    while Instant::now() < stop_at {
        let read = elector.status().leader.filter(|l| l.valid).map(|l| {
            let payload = String::from_utf8_lossy(&l.payload).into_owned();
            (base_identity(&l.identity).to_owned(), l.fence, payload)
        });
        if read.is_some() && read != last {
            if let Some((leader, fence, payload)) = &read {
                println!("{} reads leader={leader} fence={fence} payload={payload}", args.id);
            }
            last = read;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    elector.shutdown()?; // the term ends and the lease is released: another replica takes over
    println!("{} stopped", args.id);
    Ok(())
}

struct Args {
    dsn: String,
    id: String,
    addr: Option<String>,
    name: String,
    run_for: Duration,
    lease: Duration,
}

impl Args {
    fn parse() -> Result<Args, Box<dyn Error>> {
        let f = Flags::parse(&["--id", "--addr", "--name", "--for", "--lease"])?;
        Ok(Args {
            dsn: f.dsn()?,
            id: f.text("--id", "replica"),
            addr: f.get("--addr"),
            name: f.text("--name", "config-writer"),
            run_for: f.duration("--for", Duration::from_secs(86_400))?,
            lease: f.duration("--lease", Duration::from_secs(15))?,
        })
    }
}
