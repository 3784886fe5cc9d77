//! `leaderelection::connect`: the store a DSN names, on PostgreSQL and on
//! MariaDB. The acceptance suite runs through the `AnyStore` it returns (so
//! every `Store` call reaches the right store and answers as that store
//! does), and the DSN's scheme, the table argument, `after_restore` and
//! the written-in lease check are checked on both. Run with
//! `bash scripts/test.sh` (it exports the DSN and the URL).

mod mysql_support;
mod pg_support;
mod support;

use std::time::Duration;

use leaderelection::{connect, connect_table, AnyStore, ErrorKind, LeaseCheck, Store};
use mysql::prelude::Queryable;
use mysql_support::claims::NOW_SQL;
use mysql_support::{admin, exec, url, SHARED};
use pg_support::{client, dsn, DIRECT};
use support::random_tag;

const T: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(60);
/// The table of the suites below, on both servers.
const TABLE: &str = "le_any";

fn pg() -> AnyStore {
    let s = connect_table(&dsn(DIRECT), Some(&format!("public.{TABLE}"))).expect("a PostgreSQL DSN");
    s.ensure_schema().expect("ensure_schema on PostgreSQL");
    s
}

fn my() -> AnyStore {
    let s = connect_table(&url(SHARED), Some(TABLE)).expect("a MySQL URL");
    s.ensure_schema().expect("ensure_schema on MariaDB");
    s
}

mod on_postgres {
    leaderelection::storetest_suite!(with members: super::pg());
}

mod on_mysql {
    leaderelection::storetest_suite!(with members: super::my());
}

/// `postgres://`, `postgresql://` and libpq's `key=value` form
/// open a PostgreSQL store; `mysql://` a MySQL one.
#[test]
fn the_scheme_picks_the_store() {
    let pg = dsn(DIRECT);
    let (_, rest) = pg.split_once("://").expect("LE_PG_DSN is a URL");
    for d in [format!("postgres://{rest}"), format!("postgresql://{rest}")] {
        assert!(matches!(connect(&d).unwrap(), AnyStore::Postgres(_)), "{d}");
    }
    assert!(matches!(connect("host=127.0.0.1 dbname=test user=root").unwrap(), AnyStore::Postgres(_)));
    let my = url(SHARED);
    assert!(matches!(connect(&my).unwrap(), AnyStore::Mysql(_)), "{my}");
}

/// Another scheme is a fatal error naming the schemes it takes, and the
/// DSN's password is not in it; so is a DSN the chosen store refuses.
#[test]
fn another_scheme_or_a_bad_dsn_is_refused_without_the_password() {
    let e = connect("redis://app:s3cret-pw@db.internal/0").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
    assert!(e.message().contains("postgres://, postgresql:// or mysql://"), "{e}");
    assert!(!format!("{e} {e:?}").contains("s3cret-pw"), "{e:?}");
    let e = connect("mysql://app:s3cret-pw@db.internal:notaport/app").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
    assert!(!format!("{e} {e:?}").contains("s3cret-pw"), "{e:?}");
    let e = connect("postgres://app:s3cret-pw@db.internal/app?sslmode=sometimes").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
    assert!(!format!("{e} {e:?}").contains("s3cret-pw"), "{e:?}");
}

/// The table argument: `schema.table` or `table` (schema `public`) on
/// PostgreSQL, `table` on MySQL; the rows land there. A name the store
/// cannot use (an empty one) is refused.
#[test]
fn the_table_argument_names_the_table_the_rows_go_to() {
    let name = format!("any-table-{}", random_tag());
    let bare = connect_table(&dsn(DIRECT), Some(TABLE)).unwrap();
    bare.ensure_schema().unwrap();
    let lease = bare.acquire(&name, "a", LONG, b"bare", T).unwrap();
    assert!(lease.held_by("a"), "{lease:?}");
    let q = format!("SELECT holder FROM public.{TABLE} WHERE name = '{name}'");
    let row = client(DIRECT).query_opt(q.as_str(), &[]).unwrap().expect("the row is in public.le_any");
    assert_eq!(row.get::<_, String>(0), "a");
    // The same election through `public.le_any` is the same row.
    assert!(pg().inspect(&name, T).unwrap().held_by("a"));

    let my = my();
    my.acquire(&name, "b", LONG, b"", T).unwrap();
    let holder: Option<String> =
        admin(SHARED).query_first(format!("SELECT CAST(holder AS CHAR) FROM `{TABLE}` WHERE name = '{name}'")).unwrap();
    assert_eq!(holder.as_deref(), Some("b"));

    for (d, t) in [(dsn(DIRECT), "public."), (dsn(DIRECT), ""), (url(SHARED), "")] {
        let e = connect_table(&d, Some(t)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fatal, "{t:?}: {e}");
        assert!(e.to_string().contains("invalid table name: must not be empty"), "{t:?}: {e}");
    }
}

/// `after_restore` marks every row of the store's table inherited (the
/// shared scenario of `tests/support/inherited.rs`), through `AnyStore`,
/// on a table of its own on each server.
#[test]
fn after_restore_marks_every_row_inherited_on_both() {
    let table = format!("le_any_restore_{}", random_tag());
    let s = connect_table(&dsn(DIRECT), Some(&table)).unwrap();
    s.ensure_schema().unwrap();
    let admin_pg = std::cell::RefCell::new(client(DIRECT));
    let expire = |n: &str| {
        let q = format!("UPDATE public.{table} SET expires_at = now() - interval '1 second' WHERE name = '{n}'");
        admin_pg.borrow_mut().batch_execute(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
    };
    support::inherited::a_restore_marks_every_row_inherited(&s, || s.after_restore().unwrap(), expire);
    let drop = format!("DROP TABLE public.{table}, public.{table}_slots, public.{table}_members");
    admin_pg.borrow_mut().batch_execute(&drop).unwrap();

    let s = connect_table(&url(SHARED), Some(&table)).unwrap();
    s.ensure_schema().unwrap();
    let expire = |n: &str| {
        exec(&mut admin(SHARED), &format!("UPDATE `{table}` SET expires_at = {NOW_SQL} - 1000000 WHERE name = '{n}'"));
    };
    support::inherited::a_restore_marks_every_row_inherited(&s, || s.after_restore().unwrap(), expire);
    exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
}

/// The written-in lease check through `AnyStore`: it passes for the
/// term holding the lease and fails by itself (PostgreSQL's `LE001`,
/// MariaDB's error 1242) once that term has released it.
#[test]
fn the_written_in_check_passes_for_the_holder_and_fails_after_release() {
    let name = format!("any-check-{}", random_tag());

    let s = pg();
    let lease = s.acquire(&name, "a", LONG, b"", T).unwrap();
    let literal = s.lease_check_literal(&LeaseCheck { name: &name, identity: "a", fence: lease.fence }).unwrap();
    let mut c = client(DIRECT);
    c.batch_execute(&format!("BEGIN; {literal} COMMIT;")).expect("the holder's check");
    s.release(&name, "a", lease.fence, T).unwrap();
    let e = c.batch_execute(&format!("BEGIN; {literal} COMMIT;")).expect_err("the check after release");
    assert_eq!(e.code().map(|c| c.code()), Some("LE001"), "{e}");

    let s = my();
    let lease = s.acquire(&name, "a", LONG, b"", T).unwrap();
    let literal = s.lease_check_literal(&LeaseCheck { name: &name, identity: "a", fence: lease.fence }).unwrap();
    let mut c = admin(SHARED);
    let held: Option<String> = c.query_first(&literal).expect("the holder's check");
    assert_eq!(held.as_deref(), Some("leaderelection: lease held"));
    s.release(&name, "a", lease.fence, T).unwrap();
    let e = c.query_first::<String, _>(&literal).expect_err("the check after release");
    match e {
        mysql::Error::MySqlError(ref m) => assert_eq!(m.code, 1242, "{e}"),
        other => panic!("the check after release: {other}"),
    }
}
