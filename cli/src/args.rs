//! Command-line parsing (lexopt) and the hand-written `--help` texts, which
//! never show a DSN.

use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use leaderelection::{
    default_safety_margin, Timing, DEFAULT_LEASE_DURATION, DEFAULT_OPERATION_TIMEOUT, DEFAULT_RENEW_INTERVAL,
    DEFAULT_RETRY_PERIOD,
};
use lexopt::prelude::*;

pub const MAIN_HELP: &str = "\
leaderelection: run a command only while this process leads an election kept
in a PostgreSQL or MySQL/MariaDB table.

Usage:
  leaderelection run --name NAME [OPTIONS] -- CMD [ARGS...]
  leaderelection status --name NAME [--json]
  leaderelection schema [--dialect postgres|mysql] [--table [SCHEMA.]TABLE]
  leaderelection --version

The database comes from --dsn URL, else $LEADERELECTION_DSN, else
$DATABASE_URL (postgres://... or mysql://...). Prefer the variables: other
users can read command lines with ps.

Run `leaderelection SUBCOMMAND --help` for each subcommand's options and exit
codes.
";

pub const RUN_HELP: &str = "\
leaderelection run: campaign, run CMD while leading, stop it before the lease
can run out.

Usage: leaderelection run --name NAME [OPTIONS] -- CMD [ARGS...]

Options:
  --name NAME         election name (required)
  --dsn URL           database URL (default: $LEADERELECTION_DSN, else
                      $DATABASE_URL); visible in ps, prefer the variables
  --table T           postgres: SCHEMA.TABLE or TABLE; mysql: TABLE
                      (default: leader_election)
  --identity ID       a name for this run (default: host-pid); each run adds
                      its own #tag, so runs given one name never lead at once
  --payload TEXT      data published with the lease (see `status`)
  --lease D           lease duration (15s)
  --renew D           renew interval (5s)
  --retry D           follower poll period (3s)
  --op-timeout D      bound on one database call (3s)
  --margin D          safety margin (lease/10, at least 1s)
  --grace D           time between SIGTERM and SIGKILL of the child (2s)
  --wait D            give up when not leading within D (default: forever)
  --slot NAME         run CMD at most once for slot NAME across every run
                      of this election (for cron: --slot \"$(date -u +%F)\")
  --every P           the slot is the period P (1d, 1h, 15m) holding the
                      database's clock, named by its UTC start
  --retry-failed      take a slot over whose earlier run did not exit 0
                      (failed or was killed) once its term has ended
  -E, --wait-exit-code N   exit status instead of 75 and 76 (see below):
                      CMD was not run because another run leads or ran it
  --loop              run CMD again at each new term until signalled
  -q, --quiet         no progress messages, errors only
  -h, --help          this text
Durations: 500ms, 1.5s, 2m, 1h, 1d.

CMD runs in a new process group with LEADERELECTION_FENCE,
LEADERELECTION_NAME and LEADERELECTION_IDENTITY (ID#tag, as `status`
shows it) set, and LEADERELECTION_CHECK_SQL: the lease check as one
statement, values written in, for CMD's own transactions on the election's
database (`psql -v ON_ERROR_STOP=1 -1`, or `mariadb` inside START
TRANSACTION): it fails once this term no longer holds the lease, and until
the transaction ends no other term can take the lease over. When no renewal has
landed by (local deadline - grace - 250ms), or the term ends, the group gets
SIGTERM, and SIGKILL at the latest 250ms before the local deadline. Needs
grace + 250ms < lease - margin - renew - op-timeout. SIGINT, SIGTERM and
SIGHUP are forwarded to the group. When the child exits the lease is
released. With a slot, the run claims it on becoming leader, in the
statement that checks the lease; a slot already claimed by an earlier run
(whatever its host) exits 76 without running CMD. The child's exit status
is recorded for the slot; a run killed before it could record one counts
as failed for --retry-failed. If the tool is SIGKILLed, the whole group is SIGKILLed too: the
kernel kills CMD, and a sentinel in the group (`leaderelection __sentinel
PID` in ps) kills the rest.

Exit status:
  child's own status, or 128+N when it died of signal N
  64   bad usage (flags, durations, timings, DSN)
  69   database unreachable at start
  75   not leader within --wait (see -E)
  76   the slot (--slot, --every) was already run: CMD not run (see -E)
  77   fatal database error (credentials, unknown database, missing table,
       privilege)
  79   leadership lost (or at risk); the child was stopped
  126, 127  CMD could not be run / not found
  1    other failures (e.g. no sentinel could be started: CMD is not run)
  128+N     signal N received before the child started
";

pub const STATUS_HELP: &str = "\
leaderelection status: who leads an election, from the database.

Usage: leaderelection status --name NAME [--dsn URL] [--table T] [--json]

Prints the leader's identity, fence, time left and payload as text, or one
JSON object with --json:
  {\"name\":..,\"leader\":..|null,\"fence\":..|null,\"time_left_ms\":..,
   \"payload\":..|null, \"last_leader\":..|null}
(\"payload_hex\" instead of \"payload\" when it is not UTF-8). The DSN and
--table work as for `run`.

Exit status: 0 someone leads, 1 nobody leads, 64 bad usage, 69 database
unreachable, 77 fatal database error.
";

pub const SCHEMA_HELP: &str = "\
leaderelection schema: print the DDL that creates the election table.

Usage: leaderelection schema [--dialect postgres|mysql] [--table T]

--dialect defaults to the DSN's scheme when a DSN is set (--dsn,
$LEADERELECTION_DSN, $DATABASE_URL), else postgres. --table: postgres
SCHEMA.TABLE or TABLE (schema public), mysql TABLE; default leader_election.

Exit status: 0, or 64 for a bad dialect or table name.
";

/// A failure to report: the message (one line) and the exit status.
#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub msg: String,
}

impl Fail {
    pub fn new(code: i32, msg: impl Into<String>) -> Fail {
        Fail { code, msg: msg.into() }
    }
    pub fn usage(msg: impl Into<String>) -> Fail {
        Fail::new(crate::EX_USAGE, msg)
    }
}

impl From<lexopt::Error> for Fail {
    fn from(e: lexopt::Error) -> Fail {
        Fail::usage(e.to_string())
    }
}

pub enum Cmd {
    Run(Box<RunArgs>),
    Status(StatusArgs),
    Schema(SchemaArgs),
    /// Print this text and exit 0.
    Help(&'static str),
    Version,
}

/// Where an election lives.
#[derive(Default)]
pub struct Db {
    pub dsn: Option<String>,
    pub table: Option<String>,
}

pub struct RunArgs {
    pub name: String,
    pub db: Db,
    pub timing: Timing,
    pub grace: Duration,
    pub wait: Option<Duration>,
    /// `-E N`: the exit status when CMD is not run because another run
    /// leads (`--wait` ran out) or already ran the slot.
    pub wait_code: Option<i32>,
    pub looping: bool,
    pub slot: Option<Slot>,
    pub retry_failed: bool,
    pub identity: Option<String>,
    pub payload: Option<String>,
    pub quiet: bool,
    pub cmd: Vec<OsString>,
}

/// What names a run's slot.
pub enum Slot {
    /// `--slot NAME`.
    Named(String),
    /// `--every P`: the period holding the database's clock.
    Every(Duration),
}

pub struct StatusArgs {
    pub name: String,
    pub db: Db,
    pub json: bool,
}

pub struct SchemaArgs {
    pub dialect: Option<String>,
    pub table: Option<String>,
}

/// Parses the whole command line (without the program name).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cmd, Fail> {
    let mut p = lexopt::Parser::from_args(args);
    match p.next()? {
        Some(Value(sub)) => match sub.to_str() {
            Some("run") => parse_run(&mut p),
            Some("status") => parse_status(&mut p),
            Some("schema") => parse_schema(&mut p),
            Some("help") => Ok(Cmd::Help(MAIN_HELP)),
            _ => Err(Fail::usage(format!("unknown subcommand {sub:?} (run, status, schema)"))),
        },
        Some(Long("help") | Short('h')) => Ok(Cmd::Help(MAIN_HELP)),
        Some(Long("version") | Short('V')) => Ok(Cmd::Version),
        Some(arg) => Err(arg.unexpected().into()),
        None => Err(Fail::usage("missing subcommand (run, status, schema); see `leaderelection --help`")),
    }
}

fn string(p: &mut lexopt::Parser) -> Result<String, Fail> {
    Ok(p.value()?.string()?)
}

fn duration(p: &mut lexopt::Parser, flag: &str) -> Result<Duration, Fail> {
    let text = string(p)?;
    parse_duration(&text)
        .ok_or_else(|| Fail::usage(format!("--{flag}: bad duration {text:?} (use 500ms, 1.5s, 2m, 1h)")))
}

fn required_name(name: Option<String>, sub: &str) -> Result<String, Fail> {
    name.ok_or_else(|| Fail::usage(format!("{sub}: --name NAME is required")))
}

fn parse_run(p: &mut lexopt::Parser) -> Result<Cmd, Fail> {
    let (mut name, mut db, mut margin) = (None, Db::default(), None);
    let mut timing = Timing {
        lease_duration: DEFAULT_LEASE_DURATION,
        renew_interval: DEFAULT_RENEW_INTERVAL,
        retry_period: DEFAULT_RETRY_PERIOD,
        operation_timeout: DEFAULT_OPERATION_TIMEOUT,
        safety_margin: Duration::ZERO,
    };
    let mut r = RunArgs {
        name: String::new(),
        db: Db::default(),
        timing,
        grace: Duration::from_secs(2),
        wait: None,
        wait_code: None,
        looping: false,
        slot: None,
        retry_failed: false,
        identity: None,
        payload: None,
        quiet: false,
        cmd: Vec::new(),
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("dsn") => db.dsn = Some(string(p)?),
            Long("table") => db.table = Some(string(p)?),
            Long("name") => name = Some(string(p)?),
            Long("identity") => r.identity = Some(string(p)?),
            Long("payload") => r.payload = Some(string(p)?),
            Long("lease") => timing.lease_duration = duration(p, "lease")?,
            Long("renew") => timing.renew_interval = duration(p, "renew")?,
            Long("retry") => timing.retry_period = duration(p, "retry")?,
            Long("op-timeout") => timing.operation_timeout = duration(p, "op-timeout")?,
            Long("margin") => margin = Some(duration(p, "margin")?),
            Long("grace") => r.grace = duration(p, "grace")?,
            Long("wait") => r.wait = Some(duration(p, "wait")?),
            Long("wait-exit-code") | Short('E') => {
                let text = string(p)?;
                r.wait_code = match text.parse::<u8>() {
                    Ok(n) => Some(i32::from(n)),
                    Err(_) => return Err(Fail::usage(format!("--wait-exit-code: {text:?} is not 0..255"))),
                };
            }
            Long("slot") => {
                let name = string(p)?;
                if name.is_empty() || name.len() > leaderelection::MAX_SLOT_LEN || name.contains(char::is_control) {
                    return Err(Fail::usage(format!(
                        "--slot: {name:?} must be 1 to {} bytes with no control characters",
                        leaderelection::MAX_SLOT_LEN
                    )));
                }
                r.slot = Some(Slot::Named(name));
            }
            Long("every") => {
                let period = duration(p, "every")?;
                if period < Duration::from_secs(1) {
                    return Err(Fail::usage("--every: the period must be at least 1s"));
                }
                r.slot = Some(Slot::Every(period));
            }
            Long("retry-failed") => r.retry_failed = true,
            Long("loop") => r.looping = true,
            Long("quiet") | Short('q') => r.quiet = true,
            Long("help") | Short('h') => return Ok(Cmd::Help(RUN_HELP)),
            // The command and everything after it are the child's, unparsed.
            Value(first) => {
                r.cmd.push(first);
                r.cmd.extend(p.raw_args()?);
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    r.name = required_name(name, "run")?;
    if r.slot.is_some() && r.looping {
        return Err(Fail::usage("run: --slot and --every run CMD once per slot; they cannot be used with --loop"));
    }
    if r.retry_failed && r.slot.is_none() {
        return Err(Fail::usage("run: --retry-failed needs --slot or --every"));
    }
    if r.cmd.is_empty() {
        return Err(Fail::usage("run: missing the command: leaderelection run --name NAME -- CMD [ARGS...]"));
    }
    timing.safety_margin = margin.unwrap_or_else(|| default_safety_margin(timing.lease_duration));
    r.timing = timing;
    r.db = db;
    Ok(Cmd::Run(Box::new(r)))
}

fn parse_status(p: &mut lexopt::Parser) -> Result<Cmd, Fail> {
    let (mut name, mut db, mut json) = (None, Db::default(), false);
    while let Some(arg) = p.next()? {
        match arg {
            Long("dsn") => db.dsn = Some(string(p)?),
            Long("table") => db.table = Some(string(p)?),
            Long("name") => name = Some(string(p)?),
            Long("json") => json = true,
            Long("help") | Short('h') => return Ok(Cmd::Help(STATUS_HELP)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Cmd::Status(StatusArgs { name: required_name(name, "status")?, db, json }))
}

fn parse_schema(p: &mut lexopt::Parser) -> Result<Cmd, Fail> {
    let mut s = SchemaArgs { dialect: None, table: None };
    while let Some(arg) = p.next()? {
        match arg {
            Long("dialect") => s.dialect = Some(string(p)?),
            Long("table") => s.table = Some(string(p)?),
            Long("help") | Short('h') => return Ok(Cmd::Help(SCHEMA_HELP)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Cmd::Schema(s))
}

/// Parses `500ms`, `1.5s`, `2m`, `1h`, `1d` (a decimal number and a unit, no
/// sign, no spaces). `None` for anything else or an overflow.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let unit_ns: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits_ok(whole) || !digits_ok(frac) || (number.contains('.') && frac.is_empty()) {
        return None;
    }
    if frac.len() > 9 {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let frac_val: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let frac_ns = frac_val * unit_ns / 10u128.pow(frac.len() as u32);
    let ns = whole.checked_mul(unit_ns)?.checked_add(frac_ns)?;
    u64::try_from(ns).ok().map(Duration::from_nanos)
}

/// A duration as the help text writes them: `250ms`, `1.5s`, `2.25s`.
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            return write!(f, "{ms}ms");
        }
        let (s, rest) = (ms / 1000, ms % 1000);
        if rest == 0 {
            write!(f, "{s}s")
        } else {
            write!(f, "{s}.{}s", format!("{rest:03}").trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Some(ms(500)));
        assert_eq!(parse_duration("1.5s"), Some(ms(1500)));
        assert_eq!(parse_duration("2m"), Some(ms(120_000)));
        assert_eq!(parse_duration("1h"), Some(ms(3_600_000)));
        assert_eq!(parse_duration("0.25s"), Some(ms(250)));
        assert_eq!(parse_duration("1d"), Some(ms(86_400_000)));
        for junk in ["", "15", "s", "1.s", ".5s", "1.5.5s", "-1s", "1 s", "1sec", "5w", "1e3s", "99999999999999h"] {
            assert_eq!(parse_duration(junk), None, "{junk:?}");
        }
        assert_eq!(Human(ms(250)).to_string(), "250ms");
        assert_eq!(Human(ms(2250)).to_string(), "2.25s");
        assert_eq!(Human(ms(15_000)).to_string(), "15s");
    }
}
