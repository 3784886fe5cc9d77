//! Command-line parsing (lexopt) and the hand-written `--help` texts, which
//! never show a DSN.

use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use leaderelection::{
    default_safety_margin, Config, ConfigError, MemStore, Problem, Timing, DEFAULT_LEASE_DURATION,
    DEFAULT_OPERATION_TIMEOUT, DEFAULT_RENEW_INTERVAL, DEFAULT_RETRY_PERIOD,
};
use lexopt::prelude::*;

pub const MAIN_HELP: &str = "\
leaderelection: run a command only while this process leads an election kept
in a PostgreSQL or MySQL/MariaDB table.

Usage:
  leaderelection run --name NAME [OPTIONS] -- CMD [ARGS...]
  leaderelection status --name NAME [--json]
  leaderelection schema [--dialect postgres|mysql] [--table [SCHEMA.]TABLE]
  leaderelection schema --apply [--dsn URL] [--table [SCHEMA.]TABLE]
  leaderelection after-restore [--dsn URL] [--table [SCHEMA.]TABLE]
  leaderelection --version

The database comes from --dsn URL, else $LEADERELECTION_DSN, else
$DATABASE_URL (postgres://... or mysql://...). Prefer the variables: other
users can read command lines with ps. The URL is all there is: libpq's
variables (PGPASSWORD, PGHOST, ...), ~/.pgpass and pg_service.conf are not
read, so a password must be in the URL.

Run `leaderelection SUBCOMMAND --help` (or `leaderelection help SUBCOMMAND`)
for each subcommand's options and exit codes.
";

pub const RUN_HELP: &str = "\
leaderelection run: campaign, run CMD while leading, stop it before the lease
can run out.

Usage: leaderelection run --name NAME [OPTIONS] -- CMD [ARGS...]

Options:
  --name NAME         election name (required)
  --dsn URL           database URL (default: $LEADERELECTION_DSN, else
                      $DATABASE_URL); visible in ps, prefer the variables.
                      libpq's PGPASSWORD and ~/.pgpass are not read
  --keep-dsn-env      pass $LEADERELECTION_DSN (and $DATABASE_URL when it
                      was the DSN) on to CMD; by default CMD does not get
                      them, so the password stays with the tool
  --table T           postgres: SCHEMA.TABLE or TABLE; mysql: TABLE
                      (default: leader_election)
  --identity ID       a name for this run (default: host-pid); each run adds
                      its own #tag, so runs given one name never lead at once
  --payload TEXT      data published with the lease (see `status`)
  --lease D           lease duration (15s)
  --renew D           renew interval (5s)
  --retry D           follower poll period (3s)
  --no-release-feed   learn of a release only by polling: no listening
                      connection (PostgreSQL's LISTEN, MySQL's named
                      locks). By default a waiting run leads within
                      milliseconds of a release
  --op-timeout D      bound on one database call (3s)
  --margin D          safety margin (lease/10, at least 1s)
  --grace D           time from SIGTERM (the tool's own, or a forwarded
                      SIGINT, SIGTERM or SIGHUP) to SIGKILL of the child's
                      group, shortened to end 250ms before the local
                      deadline when the term is at risk (2s)
  --wait D            give up when not leading within D (default: forever);
                      0 tries once (as flock -n): leads if nobody else
                      holds the lease, else exits 75 (see -E)
  --slot NAME         run CMD at most once for slot NAME across every run
                      of this election (for cron: --slot \"$(date -u +%F)\")
  --every P           the slot is the period P (1d, 1h, 15m) holding the
                      database's clock, named by its UTC start
  --retry-failed      take a slot over whose earlier run did not exit 0
                      (failed or was killed) once its term has ended
  -E, --wait-exit-code N   exit status instead of 75 and 76 (see below):
                      CMD was not run because another run leads or ran it
  --loop              run CMD again at each new term until signalled
  -q, --quiet         nothing on stdout or stderr unless something is
                      wrong: no progress lines, and nothing when CMD is not
                      run because another run leads or ran the slot (75,
                      76 or -E); errors still print
  -h, --help          this text
Durations: 500ms, 1.5s, 2m, 1h, 1d (and 0). A flag's value may not start
with `--` (`--name --dsn` is a mistake); write --payload=--x to mean it.

Progress goes to stderr, one line each: the term's start (fence), its end
and why it ended (with the database error that caused it), signals
forwarded, SIGTERM and SIGKILL of the child.

CMD runs in a new process group, with every signal at its default
disposition (SIGHUP stays ignored under nohup), without
$LEADERELECTION_DSN (see --keep-dsn-env) and with LEADERELECTION_FENCE,
LEADERELECTION_NAME and LEADERELECTION_IDENTITY (ID#tag, as `status`
shows it) set, and LEADERELECTION_CHECK_SQL: the lease check as one
statement, values written in, for CMD's own transactions on the election's
database (`psql -v ON_ERROR_STOP=1 -1`, or `mariadb` inside START
TRANSACTION): it fails once this term no longer holds the lease, and until
the transaction ends no other term can take the lease over. When no renewal has
landed by (local deadline - grace - 250ms), or the term ends, the group gets
SIGTERM, and SIGKILL at the latest 250ms before the local deadline. Needs
grace + 250ms < lease - margin - renew - op-timeout. SIGINT, SIGTERM and
SIGHUP are forwarded to the group, and SIGKILL follows --grace later if
it is still running. When stdin is the terminal (interactive use), the
group is given the terminal while CMD runs, so CMD can read it and Ctrl-C
reaches it directly; the tool takes the terminal back when it ends. When
the child exits the lease is released (bounded by --op-timeout; not tried
once the term was lost). With a slot, the run claims it on becoming leader, in the
statement that checks the lease; a slot already claimed by an earlier run
(whatever its host) exits 76 without running CMD. The child's exit status
is recorded for the slot; a run killed before it could record one counts
as failed for --retry-failed. If the tool is SIGKILLed, the whole group is SIGKILLed too: the
kernel kills CMD, and a sentinel in the group (`leaderelection __sentinel
PID` in ps, started while the run waits) kills the rest.

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
leaderelection schema: print the DDL that creates the election table, or
create it.

Usage: leaderelection schema [--dialect postgres|mysql] [--dsn URL] [--table T]
       leaderelection schema --apply [--dsn URL] [--table T] [-q]

Without --apply, prints the DDL (CREATE TABLE IF NOT EXISTS ...) and
touches no database. --dialect defaults to the DSN's scheme when a DSN is
set (--dsn, $LEADERELECTION_DSN, $DATABASE_URL), else postgres. --table:
postgres SCHEMA.TABLE or TABLE (schema public), mysql TABLE; default
leader_election.

--apply connects to the DSN (PostgreSQL or MySQL/MariaDB) and creates the
table if it does not exist, upgrading an older one; it needs the CREATE
privilege. It prints one line on stdout saying so (nothing with -q).

Exit status: 0; 64 bad usage (dialect, table name, DSN, --dialect with
--apply); with --apply, 69 database unreachable, 77 fatal database error
(credentials, unknown database, privilege).
";

pub const AFTER_RESTORE_HELP: &str = "\
leaderelection after-restore: the one step after restoring the election's
database from a backup or snapshot of itself.

Usage: leaderelection after-restore [--dsn URL] [--table T] [-q]

A server restored from its own backup keeps its identity (MySQL's
server_id), so its election rows look as if nothing was lost, although the
renewals after the backup were. This marks every row of the table as
inherited from another server: a row's holder may go on renewing it, and an
expired row is held for nobody for a lease before anyone claims it, so no
successor leads while a leader the lost renewals were acknowledged to
still may. Run it once the server is up, before or while the participants
reconnect; running it again changes nothing. (On PostgreSQL a restore also
changes the history the rows are stamped with, so this is a second line
there.) --table as for `schema`. It prints one line on stdout saying how
many rows it marked (nothing with -q).

Exit status: 0; 64 bad usage (table name, DSN); 69 database unreachable;
77 fatal database error (credentials, unknown database, missing table,
privilege).
";

/// A failure to report: the message (one line, none when empty) and the
/// exit status.
#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub msg: String,
    /// Not something wrong: CMD was not run because another run leads or
    /// ran the slot, or a signal stopped the wait. `--quiet` says nothing.
    pub losing: bool,
}

impl Fail {
    pub fn new(code: i32, msg: impl Into<String>) -> Fail {
        Fail { code, msg: msg.into(), losing: false }
    }
    pub fn losing(code: i32, msg: impl Into<String>) -> Fail {
        Fail { code, msg: msg.into(), losing: true }
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
    AfterRestore(AfterRestoreArgs),
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
    /// `--keep-dsn-env`: CMD gets the DSN variables too.
    pub keep_dsn_env: bool,
    /// `--no-release-feed`: followers poll only.
    pub no_release_feed: bool,
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
    pub db: Db,
    /// `--apply`: create the table over the DSN instead of printing the DDL.
    pub apply: bool,
    pub quiet: bool,
}

pub struct AfterRestoreArgs {
    pub db: Db,
    pub quiet: bool,
}

/// Parses the whole command line (without the program name).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cmd, Fail> {
    let mut p = lexopt::Parser::from_args(args);
    match p.next()? {
        Some(Value(sub)) => match sub.to_str() {
            Some("run") => parse_run(&mut p),
            Some("status") => parse_status(&mut p),
            Some("schema") => parse_schema(&mut p),
            Some("after-restore") => parse_after_restore(&mut p),
            Some("help") => match p.next()? {
                None => Ok(Cmd::Help(MAIN_HELP)),
                Some(Value(topic)) => match topic.to_str() {
                    Some("run") => Ok(Cmd::Help(RUN_HELP)),
                    Some("status") => Ok(Cmd::Help(STATUS_HELP)),
                    Some("schema") => Ok(Cmd::Help(SCHEMA_HELP)),
                    Some("after-restore") => Ok(Cmd::Help(AFTER_RESTORE_HELP)),
                    _ => Err(Fail::usage(format!(
                        "help: unknown subcommand {topic:?} (run, status, schema, after-restore)"
                    ))),
                },
                Some(arg) => Err(arg.unexpected().into()),
            },
            _ => Err(Fail::usage(format!("unknown subcommand {sub:?} (run, status, schema, after-restore)"))),
        },
        Some(Long("help") | Short('h')) => Ok(Cmd::Help(MAIN_HELP)),
        Some(Long("version") | Short('V')) => Ok(Cmd::Version),
        Some(arg) => Err(arg.unexpected().into()),
        None => {
            Err(Fail::usage("missing subcommand (run, status, schema, after-restore); see `leaderelection --help`"))
        }
    }
}

/// A flag's value. A separate argument that starts with `--` is refused
/// (`--name --dsn URL` forgot the name); attached with `=` it is taken as
/// written (`--payload=--x`).
fn string(p: &mut lexopt::Parser, flag: &str) -> Result<String, Fail> {
    if let Some(v) = p.optional_value() {
        return Ok(v.string()?);
    }
    let v = p.value()?.string()?;
    if v.starts_with("--") {
        return Err(Fail::usage(format!(
            "--{flag}: missing value (the next argument, {v:?}, is a flag; write --{flag}={v} to mean it)"
        )));
    }
    Ok(v)
}

fn duration(p: &mut lexopt::Parser, flag: &str) -> Result<Duration, Fail> {
    let text = string(p, flag)?;
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
        keep_dsn_env: false,
        no_release_feed: false,
        cmd: Vec::new(),
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("dsn") => db.dsn = Some(string(p, "dsn")?),
            Long("table") => db.table = Some(string(p, "table")?),
            Long("name") => name = Some(string(p, "name")?),
            Long("identity") => r.identity = Some(string(p, "identity")?),
            Long("payload") => r.payload = Some(string(p, "payload")?),
            Long("lease") => timing.lease_duration = duration(p, "lease")?,
            Long("renew") => timing.renew_interval = duration(p, "renew")?,
            Long("retry") => timing.retry_period = duration(p, "retry")?,
            Long("op-timeout") => timing.operation_timeout = duration(p, "op-timeout")?,
            Long("margin") => margin = Some(duration(p, "margin")?),
            Long("grace") => r.grace = duration(p, "grace")?,
            Long("wait") => r.wait = Some(duration(p, "wait")?),
            Long("wait-exit-code") | Short('E') => {
                let text = string(p, "wait-exit-code")?;
                r.wait_code = match text.parse::<u8>() {
                    Ok(n) => Some(i32::from(n)),
                    Err(_) => return Err(Fail::usage(format!("--wait-exit-code: {text:?} is not 0..255"))),
                };
            }
            Long("slot") => {
                let name = string(p, "slot")?;
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
            Long("keep-dsn-env") => r.keep_dsn_env = true,
            Long("no-release-feed") => r.no_release_feed = true,
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
    // Everything the library would refuse, refused here, before any
    // database is touched: the same exit (64) whatever the database.
    let mut config = Config::new(MemStore::new(), r.name.as_str()).timing(timing);
    if let Some(id) = &r.identity {
        config = config.identity(id.as_str());
    }
    if let Some(payload) = &r.payload {
        config = config.payload(payload.as_bytes());
    }
    config.validate().map_err(|e| config_fail(&e, margin.is_none()))?;
    Ok(Cmd::Run(Box::new(r)))
}

/// The command-line flag behind a library `Config` field, or the words for
/// a figure the flags derive (the renewal retry delay).
fn flag_of(field: &str) -> &str {
    match field {
        "lease_duration" => "--lease",
        "renew_interval" => "--renew",
        "retry_period" => "--retry",
        "operation_timeout" => "--op-timeout",
        "safety_margin" => "--margin",
        "retry_delay" => "the renewal retry delay (renew/4, at least 50ms)",
        "name" => "--name",
        "identity" => "--identity",
        "payload" => "--payload",
        other => other,
    }
}

/// A refused configuration as a usage error naming the flags, with the
/// numbers: the library's own words (`Problem::named`) with flags for
/// fields. `default_margin`: `--margin` was not given (its default,
/// lease/10 and at least 1s, follows `--lease`).
pub fn config_fail(e: &ConfigError, default_margin: bool) -> Fail {
    let margin = if default_margin { " (--margin defaults to lease/10, at least 1s)" } else { "" };
    let flag = flag_of(e.field());
    let said = e.problem().named(&flag_of);
    let msg = match e.problem() {
        Problem::TooLong { .. } if flag == "--identity" => format!("{flag}: {said} (the run adds a 17-byte #tag)"),
        Problem::MarginNotBelowLease { .. } | Problem::TimingInvariant { .. } => {
            format!("timings do not fit: {said}{margin}")
        }
        Problem::Empty
        | Problem::TooLong { .. }
        | Problem::ControlCharacter { .. }
        | Problem::Zero
        | Problem::TooLongDuration { .. } => format!("{flag}: {said}"),
        _ => e.to_string(),
    };
    Fail::usage(msg)
}

fn parse_status(p: &mut lexopt::Parser) -> Result<Cmd, Fail> {
    let (mut name, mut db, mut json) = (None, Db::default(), false);
    while let Some(arg) = p.next()? {
        match arg {
            Long("dsn") => db.dsn = Some(string(p, "dsn")?),
            Long("table") => db.table = Some(string(p, "table")?),
            Long("name") => name = Some(string(p, "name")?),
            Long("json") => json = true,
            Long("help") | Short('h') => return Ok(Cmd::Help(STATUS_HELP)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let name = required_name(name, "status")?;
    // As `run` does, before any database is touched.
    Config::new(MemStore::new(), name.as_str()).validate().map_err(|e| config_fail(&e, false))?;
    Ok(Cmd::Status(StatusArgs { name, db, json }))
}

fn parse_schema(p: &mut lexopt::Parser) -> Result<Cmd, Fail> {
    let mut s = SchemaArgs { dialect: None, db: Db::default(), apply: false, quiet: false };
    while let Some(arg) = p.next()? {
        match arg {
            Long("dialect") => s.dialect = Some(string(p, "dialect")?),
            Long("dsn") => s.db.dsn = Some(string(p, "dsn")?),
            Long("table") => s.db.table = Some(string(p, "table")?),
            Long("apply") => s.apply = true,
            Long("quiet") | Short('q') => s.quiet = true,
            Long("help") | Short('h') => return Ok(Cmd::Help(SCHEMA_HELP)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if s.apply && s.dialect.is_some() {
        return Err(Fail::usage("schema: --apply takes the dialect from the DSN; drop --dialect"));
    }
    Ok(Cmd::Schema(s))
}

fn parse_after_restore(p: &mut lexopt::Parser) -> Result<Cmd, Fail> {
    let mut a = AfterRestoreArgs { db: Db::default(), quiet: false };
    while let Some(arg) = p.next()? {
        match arg {
            Long("dsn") => a.db.dsn = Some(string(p, "dsn")?),
            Long("table") => a.db.table = Some(string(p, "table")?),
            Long("quiet") | Short('q') => a.quiet = true,
            Long("help") | Short('h') => return Ok(Cmd::Help(AFTER_RESTORE_HELP)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Cmd::AfterRestore(a))
}

/// Parses `500ms`, `1.5s`, `2m`, `1h`, `1d` (a decimal number and a unit, no
/// sign, no spaces), and a bare `0`. `None` for anything else or an overflow.
pub fn parse_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
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

/// A duration as the help text writes them: `250ms`, `1.5s`, `2.25s`, and
/// from a minute on in whole seconds: `9m32s`, `2h`, `3d4h0m5s`.
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            return write!(f, "{ms}ms");
        }
        if ms >= 60_000 {
            let s = self.0.as_secs();
            let parts = [(s / 86_400, "d"), (s / 3600 % 24, "h"), (s / 60 % 60, "m"), (s % 60, "s")];
            // From the first unit that is not zero to the last that is not.
            let first = parts.iter().position(|p| p.0 > 0).unwrap_or(3);
            let last = parts.iter().rposition(|p| p.0 > 0).unwrap_or(3);
            for (n, unit) in &parts[first..=last] {
                write!(f, "{n}{unit}")?;
            }
            return Ok(());
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
        assert_eq!(Human(ms(59_999)).to_string(), "59.999s");
        assert_eq!(Human(ms(572_247)).to_string(), "9m32s");
        assert_eq!(Human(ms(120_000)).to_string(), "2m");
        assert_eq!(Human(ms(3_600_000)).to_string(), "1h");
        assert_eq!(Human(ms(3_661_000)).to_string(), "1h1m1s");
        assert_eq!(Human(ms(86_400_000 + 5_000)).to_string(), "1d0h0m5s");
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
    }
}
