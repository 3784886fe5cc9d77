//! What the example programs share: reading their command line, the
//! timings they derive from `--lease`, and reporting how they ended. Each
//! program's own file is about what it does with its election.

// Each program uses some of these, not all.
#![allow(dead_code)]

use std::collections::HashMap;
use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

/// A program's `--flag value` pairs.
pub struct Flags(HashMap<String, String>);

impl Flags {
    /// Reads the program's arguments: `--dsn` and the flags in `known`,
    /// each followed by its value.
    pub fn parse(known: &[&str]) -> Result<Flags, Box<dyn Error>> {
        let mut values = HashMap::new();
        let mut argv = std::env::args().skip(1);
        while let Some(flag) = argv.next() {
            if flag != "--dsn" && !known.contains(&flag.as_str()) {
                return Err(format!("unknown option {flag}").into());
            }
            let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
            values.insert(flag, value);
        }
        Ok(Flags(values))
    }

    /// The database: `--dsn URL`, else `DATABASE_URL`.
    pub fn dsn(&self) -> Result<String, Box<dyn Error>> {
        match self.0.get("--dsn").cloned().or_else(|| std::env::var("DATABASE_URL").ok()) {
            Some(dsn) if !dsn.is_empty() => Ok(dsn),
            _ => Err("give the database as --dsn URL or DATABASE_URL".into()),
        }
    }

    /// `flag`'s value, if given.
    pub fn get(&self, flag: &str) -> Option<String> {
        self.0.get(flag).cloned()
    }

    /// `flag`'s value, or `default`.
    pub fn text(&self, flag: &str, default: &str) -> String {
        self.get(flag).unwrap_or_else(|| default.to_owned())
    }

    /// `flag`'s value as a duration (`500ms`, `5s`, `2m`, `1h`, `1d`), or
    /// `default`.
    pub fn duration(&self, flag: &str, default: Duration) -> Result<Duration, String> {
        self.get(flag).map_or(Ok(default), |v| duration(&v))
    }

    /// `flag`'s value as a whole number, or `default`.
    pub fn number(&self, flag: &str, default: usize) -> Result<usize, String> {
        self.get(flag).map_or(Ok(default), |v| v.parse().map_err(|_| format!("{flag}: not a number: {v}")))
    }
}

/// `config` with every timing in proportion to `lease`, as the programs
/// take it from `--lease`: renew and poll every fifth of it, give a store
/// call a sixth (the safety margin stays the library's default for the
/// lease). Short leases then fail over quickly and still meet the
/// library's invariant.
pub fn lease_timings(config: leaderelection::Config, lease: Duration) -> leaderelection::Config {
    config.lease_duration(lease).renew_interval(lease / 5).retry_period(lease / 5).operation_timeout(lease / 6)
}

/// `500ms`, `5s`, `2m`, `1h`, `1d`.
pub fn duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let n: u64 = text[..split].parse().map_err(|_| format!("not a duration: {text}"))?;
    let millis = match &text[split..] {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    };
    millis.map(Duration::from_millis).ok_or_else(|| format!("not a duration: {text} (try 500ms, 5s, 2m, 1h, 1d)"))
}

/// The exit status of a program whose body returned `result`; an error is
/// printed first, after the program's name.
pub fn exit(program: &str, result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}
