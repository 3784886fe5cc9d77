//! `PostgresStore`'s builder and pool entry points, with no server needed:
//! what a program reads back, and that a password in the DSN shows up in no
//! `Debug` output and no error.

use leaderelection::postgres::{PgManager, PostgresStore, DEFAULT_SCHEMA, DEFAULT_TABLE};

const DSN: &str = "postgres://app:hunter2@db.invalid:5432/app";

#[test]
fn the_builder_debug_shows_the_settings_and_not_the_password() {
    let b = PostgresStore::builder(DSN).table("ops", "leases").pool_size(7).ca_file("/etc/ssl/ca.pem");
    let dbg = format!("{b:?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    for shown in ["\"ops\"", "\"leases\"", "pool_size: 7", "/etc/ssl/ca.pem"] {
        assert!(dbg.contains(shown), "{shown} missing from {dbg}");
    }
}

#[test]
fn a_built_store_reports_its_table_and_hides_the_password() {
    // Building connects to nothing: the pool opens connections on first use.
    let store = PostgresStore::builder(DSN).build().expect("a valid DSN builds");
    assert_eq!(store.table(), (DEFAULT_SCHEMA, DEFAULT_TABLE));
    let dbg = format!("{store:?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");

    let store = PostgresStore::builder(DSN).table("ops", "Leases").build().unwrap();
    assert_eq!(store.table(), ("ops", "Leases"));
}

#[test]
fn a_missing_or_unreadable_ca_file_is_a_fatal_error_naming_the_file() {
    let missing = std::env::temp_dir().join("leaderelection-no-such-ca.pem");
    let err = PostgresStore::builder(DSN).ca_file(&missing).build().expect_err("the CA file does not exist");
    assert!(err.is_fatal(), "{err}");
    assert!(err.to_string().contains(&*missing.to_string_lossy()), "{err}");
    assert!(!err.to_string().contains("hunter2") && !format!("{err:?}").contains("hunter2"), "{err:?}");

    let not_pem = std::env::temp_dir().join(format!("leaderelection-not-a-ca-{}.pem", std::process::id()));
    std::fs::write(&not_pem, b"this is not a certificate").unwrap();
    let err = PostgresStore::builder(DSN).ca_file(&not_pem).build().expect_err("the CA file is not PEM");
    std::fs::remove_file(&not_pem).unwrap();
    assert!(err.is_fatal(), "{err}");
    assert!(err.to_string().contains(&*not_pem.to_string_lossy()), "{err}");
}

#[test]
fn a_store_over_your_own_pool_checks_the_table_name() {
    let pool = || {
        let manager = PgManager::from_dsn(DSN, None, None).expect("a valid DSN");
        r2d2::Pool::builder().max_size(2).min_idle(Some(0)).build_unchecked(manager)
    };
    let store = PostgresStore::from_pool(pool(), "ops", "leases").expect("valid names");
    assert_eq!(store.table(), ("ops", "leases"));
    assert!(format!("{store:?}").contains("pool built elsewhere"));

    let err = PostgresStore::from_pool(pool(), "ops", "").expect_err("an empty table name is refused");
    assert!(err.is_fatal(), "{err}");
}

#[test]
fn a_malformed_connection_string_is_a_fatal_error_that_repeats_none_of_it() {
    for dsn in [
        "postgres://app:hunter2@db.invalid:notaport/app",
        "host=db.invalid password='hunter2",
        "postgres://app:hunter2@db.invalid/app?sslmode",
    ] {
        let err = PostgresStore::connect(dsn).expect_err(dsn);
        assert!(err.is_fatal(), "{dsn}: {err}");
        assert!(err.to_string().starts_with("invalid PostgreSQL connection string"), "{dsn}: {err}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{dsn}: {err:?}");
    }
}

#[test]
fn sslrootcert_in_a_key_value_string_is_the_ca_file_beside_quoted_values() {
    let dsn = "host=db.invalid user=app password='hunter2' sslrootcert=/nonexistent/leaderelection-ca.pem";
    let err = PgManager::from_dsn(dsn, None, None).expect_err("the CA file named in the DSN does not exist");
    assert!(err.is_fatal(), "{err}");
    assert!(err.to_string().contains("/nonexistent/leaderelection-ca.pem"), "{err}");
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
}

#[test]
fn a_unix_socket_host_shows_its_path_and_not_the_password() {
    let m = PgManager::from_dsn("host=/var/run/postgresql port=5433 user=app password=hunter2 dbname=app", None, None)
        .expect("a valid key=value DSN");
    let dbg = format!("{m:?}");
    assert!(dbg.contains("/var/run/postgresql") && dbg.contains("5433"), "{dbg}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert!(!m.uses_tls());
}

/// `leaderelection::connect` picks the store by the DSN's scheme; a scheme
/// whose feature is off (this suite runs without `mysql`) or an unknown one
/// is a fatal error that never shows the password.
#[test]
fn connect_picks_the_store_by_scheme_and_names_a_missing_feature() {
    for dsn in [DSN, "postgresql://app:hunter2@db.invalid/app", "host=db.invalid user=app password=hunter2"] {
        match leaderelection::connect(dsn) {
            Ok(leaderelection::AnyStore::Postgres(s)) => assert_eq!(s.table(), (DEFAULT_SCHEMA, DEFAULT_TABLE)),
            other => panic!("{dsn}: {other:?}"),
        }
    }
    match leaderelection::connect_table(DSN, Some("ops.leases")) {
        Ok(leaderelection::AnyStore::Postgres(s)) => assert_eq!(s.table(), ("ops", "leases")),
        other => panic!("{other:?}"),
    }
    let e = leaderelection::connect("mysql://app:hunter2@db.invalid/app").unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("feature `mysql`") && !e.to_string().contains("hunter2"), "{e}");
    let e = leaderelection::connect("sqlite://app:hunter2@x").unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("postgres://") && !e.to_string().contains("hunter2"), "{e}");
}
