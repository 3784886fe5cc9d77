//! The binary without a database: usage errors (exit 64, one line),
//! `--help` for every subcommand, `schema` for both dialects.

mod common;
use common::{BIN, PASSWORD, TIMING};
use std::process::{Command, Output};

const ENV_DSN: &str = "postgres://someone:pw-s3cret@db.example:5432/app";

fn tool(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("LEADERELECTION_DSN", ENV_DSN).env("DATABASE_URL", ENV_DSN).output().unwrap()
}

/// Exit 64 with exactly one `leaderelection: ` line on stderr; returns it.
fn usage_error(args: &[&str]) -> String {
    let out = tool(args);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert!(err.starts_with("leaderelection: ") && err.lines().count() == 1, "{args:?}: {err:?}");
    assert!(!err.contains(PASSWORD), "{err}");
    err
}

#[test]
fn usage_errors_exit_64_with_one_line() {
    assert!(usage_error(&["run", "--name", "x", "--bogus", "--", "true"]).contains("--bogus"));
    assert!(usage_error(&["run", "--", "true"]).contains("--name NAME is required"));
    assert!(usage_error(&["status"]).contains("--name NAME is required"));
    assert!(usage_error(&["run", "--name", "x"]).contains("missing the command"));
    assert!(
        usage_error(&["run", "--name", "x", "--lease", "15", "--", "true"]).contains("--lease: bad duration \"15\"")
    );
    assert!(usage_error(&["run", "--name", "x", "--renew", "1.5.s", "--", "true"]).contains("--renew"));
    assert!(usage_error(&["run", "--name", "x", "-E", "300", "--", "true"]).contains("--wait-exit-code"));
    assert!(usage_error(&["frobnicate"]).contains("unknown subcommand"));
    assert!(usage_error(&[]).contains("missing subcommand"));
    // The library's own timing rule, with its numbers, naming the flags.
    let err = usage_error(&["run", "--name", "x", "--lease", "5s", "--", "true"]);
    assert!(
        err.contains(
            "--renew + 2*--op-timeout + the renewal retry delay (renew/4, at least 50ms) (5s + 2*3s + 1.25s = 12.25s) \
             must not exceed --lease - --margin (5s - 1s = 4s) (--margin defaults to lease/10, at least 1s)"
        ),
        "{err}"
    );
    assert!(!err.contains("lease_duration") && !err.contains("safety_margin"), "{err}");
    let err = usage_error(&["run", "--name", "x", "--margin", "20s", "--", "true"]);
    assert!(err.contains("--margin (20s) must be shorter than --lease (15s)") && !err.contains("defaults"), "{err}");
    assert!(usage_error(&["run", "--name", "x", "--renew", "0", "--", "true"]).contains("--renew: must be greater"));
    // A grace that cannot fit, with the numbers: 2.5s - 250ms - 400ms - 500ms = 1.35s.
    let mut args = vec!["run", "--name", "x"];
    args.extend(TIMING);
    args.extend(["--grace", "1.1s", "--", "true"]);
    let err = usage_error(&args);
    assert!(err.contains("--grace 1.1s does not fit: grace + 250ms"), "{err}");
    assert!(err.contains("(2.5s - 250ms - 400ms - 500ms = 1.35s)"), "{err}");
    // 1.05s + 250ms < 1.35s fits; it then fails on the database (not 64).
    let mut args = vec!["run", "--dsn", "mysql://root@127.0.0.1:1/x", "--name", "x"];
    args.extend(TIMING);
    args.extend(["--grace", "1.05s", "--", "true"]);
    assert_eq!(tool(&args).status.code(), Some(69));
    // A DSN of another kind; a bad table name.
    let err = usage_error(&["run", "--dsn", "redis://u:pw-s3cret@h/0", "--name", "x", "--", "true"]);
    assert!(err.contains("postgres:// or mysql://"), "{err}");
    // Slots: once per slot, so not with --loop; retrying needs a slot.
    assert!(usage_error(&["run", "--name", "x", "--slot", "d", "--loop", "--", "true"]).contains("--loop"));
    assert!(usage_error(&["run", "--name", "x", "--retry-failed", "--", "true"]).contains("needs --slot"));
    assert!(usage_error(&["run", "--name", "x", "--every", "500ms", "--", "true"]).contains("at least 1s"));
    assert!(usage_error(&["run", "--name", "x", "--slot", "", "--", "true"]).contains("--slot"));
    assert!(usage_error(&["schema", "--dialect", "oracle"]).contains("--dialect"));
    // A flag where a value belongs: the value is missing.
    let err = usage_error(&["run", "--name", "--dsn", "postgres://u:pw-s3cret@h/d", "--", "true"]);
    assert!(err.contains("--name: missing value (the next argument, \"--dsn\", is a flag"), "{err}");
    assert!(usage_error(&["status", "--table", "--name", "x"]).contains("--table: missing value"));
    assert!(usage_error(&["schema", "--apply", "--dialect", "mysql"]).contains("--apply"));
    assert!(usage_error(&["help", "frobnicate"]).contains("unknown subcommand"));
    assert!(usage_error(&["schema", "--table", ""]).contains("--table"));
}

/// Input the database would refuse is refused before connecting, so the
/// exit is 64 whatever the database: a closed port on either kind would
/// otherwise give 69 (and a server 64 on PostgreSQL, 77 on MySQL).
#[test]
fn input_is_checked_before_the_database() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let long = "n".repeat(256);
    let long_id = "i".repeat(239);
    for scheme in ["postgres", "mysql"] {
        let dsn = format!("{scheme}://root@127.0.0.1:{closed}/test");
        let err = usage_error(&["run", "--dsn", &dsn, "--name", &long, "--", "true"]);
        assert!(err.contains("--name: is 256 bytes, more than the limit of 255"), "{err}");
        assert!(usage_error(&["status", "--dsn", &dsn, "--name", &long]).contains("--name: is 256 bytes"));
        assert!(usage_error(&["run", "--dsn", &dsn, "--name", "x\ty", "--", "true"]).contains("control character"));
        let err = usage_error(&["run", "--dsn", &dsn, "--name", "x", "--identity", &long_id, "--", "true"]);
        assert!(err.contains("--identity: is 239 bytes, more than the limit of 238"), "{err}");
        // Right at the limits, and a value that starts with `--` given with
        // `=`: past the checks, to the closed port.
        let ok = "n".repeat(255);
        let args = ["run", "--dsn", &dsn, "--name", &ok, "--payload=--x", "--wait", "0", "--", "true"];
        assert_eq!(tool(&args).status.code(), Some(69), "{scheme}");
    }
}

/// A closed pipe on stdout ends `schema` and `--help` as it ends any Unix
/// tool: by SIGPIPE, with nothing on stderr (not a panic, exit 101).
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::ExitStatusExt;
    for args in [&["schema"][..], &["--help"], &["schema", "--dialect", "mysql"]] {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills two fds we then own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both fds are ours; the read end is closed at once.
        let (read, write) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
        drop(read);
        let out = Command::new(BIN).args(args).stdout(write).output().unwrap();
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn help_for_every_subcommand_exits_0_without_the_dsn() {
    let text = |args: &[&str]| String::from_utf8(tool(args).stdout).unwrap();
    for sub in ["run", "status", "schema", "after-restore"] {
        assert_eq!(text(&["help", sub]), text(&[sub, "--help"]), "`help {sub}` prints {sub}'s help");
    }
    assert!(text(&["schema", "--help"]).contains("--dsn URL") && text(&["schema", "--help"]).contains("--apply"));
    assert!(text(&["--help"]).contains("PGPASSWORD") && text(&["run", "--help"]).contains("~/.pgpass"));
    for flag in ["--keep-dsn-env", "0 tries once", "-q, --quiet"] {
        assert!(text(&["run", "--help"]).contains(flag), "run --help documents {flag}");
    }
    for args in [&["--help"][..], &["help"], &["run", "--help"], &["status", "-h"], &["schema", "--help"]] {
        let out = tool(args);
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text.contains("Usage"), "{args:?}: {text}");
        assert!(!text.contains(PASSWORD) && !text.contains("db.example"), "{args:?} shows the DSN");
    }
    let run = String::from_utf8(tool(&["run", "--help"]).stdout).unwrap();
    for code in ["64 ", "69 ", "75 ", "77 ", "79 ", "128+N"] {
        assert!(run.contains(code), "run --help documents exit {code}");
    }
    let out = tool(&["--version"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("leaderelection {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn schema_prints_the_library_ddl_for_both_dialects() {
    let schema = |args: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.arg("schema").args(args).env_remove("LEADERELECTION_DSN").env_remove("DATABASE_URL");
        if let Some(dsn) = env {
            cmd.env("LEADERELECTION_DSN", dsn);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let pg = |s, t| format!("{}\n", leaderelection::PostgresStore::schema(s, t).unwrap().trim_end());
    let my = |t| format!("{}\n", leaderelection::MySqlStore::schema(t).unwrap().trim_end());
    assert_eq!(schema(&[], None), pg("public", "leader_election"));
    assert_eq!(schema(&["--table", "ops.leases"], None), pg("ops", "leases"));
    assert_eq!(schema(&["--table", "leases"], None), pg("public", "leases"));
    assert_eq!(schema(&["--dialect", "mysql", "--table", "leases"], None), my("leases"));
    assert_eq!(schema(&[], Some("mysql://u:p@h/db")), my("leader_election"), "dialect from the DSN's scheme");
    assert_eq!(schema(&["--dialect", "postgres"], Some("mysql://u:p@h/db")), pg("public", "leader_election"));
    // `--dsn` as `schema --help` lists it: its scheme picks the dialect.
    assert_eq!(schema(&["--dsn", "mysql://u:p@h/db", "--table", "t"], None), my("t"));
}

/// The hidden `__sentinel` subcommand (see `leaderelection run`) run by hand:
/// outside a group it leads it refuses (exit 64, one line) and kills
/// nothing; leading its own group, with a parent that is not the tool it
/// names, it SIGKILLs that group at once, itself included. `--help` does not
/// list it among the subcommands.
#[test]
fn the_sentinel_kills_only_a_group_it_leads() {
    for args in [&["__sentinel"][..], &["__sentinel", "1"], &["__sentinel", "junk"], &["__sentinel", "2"]] {
        assert!(usage_error(args).contains("__sentinel is internal"), "{args:?}");
    }
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let status = Command::new(BIN).args(["__sentinel", "2"]).process_group(0).status().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(!String::from_utf8(tool(&["--help"]).stdout).unwrap().contains("sentinel"));
}
