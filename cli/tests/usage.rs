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
    // The library's own timing rule, with its numbers.
    let err = usage_error(&["run", "--name", "x", "--lease", "5s", "--", "true"]);
    assert!(err.contains("(5s + 2*3s + 1.25s = 12.25s) must not exceed lease_duration - safety_margin"), "{err}");
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
    assert!(usage_error(&["schema", "--table", ""]).contains("--table"));
}

#[test]
fn help_for_every_subcommand_exits_0_without_the_dsn() {
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
