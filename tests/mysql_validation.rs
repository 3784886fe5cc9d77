//! What the MySQL store refuses before it sends anything, and how it
//! explains a table missing beside the election table: a batch item whose
//! name does not fit the column fails alone while the others are
//! answered, in order; an identity that does not fit fails every item; a
//! multi-primary store without its `_terms` table says how to make it.
//! Against the shared MariaDB; run with `bash scripts/test.sh`.

mod mysql_support;
mod support;

use std::time::Duration;

use leaderelection::{BatchItem, ErrorKind, MySqlStore, Store, StoreError, MAX_IDENTITY_LEN, MAX_NAME_LEN};
use mysql_support::{admin, exec, url, SHARED};
use support::random_tag;

const T: Duration = Duration::from_secs(5);
const TABLE: &str = "le_validation";

fn store() -> MySqlStore {
    let s = MySqlStore::builder(&url(SHARED)).table(TABLE).build().unwrap();
    s.ensure_schema().unwrap();
    s
}

fn too_long(what: &str, e: &StoreError) {
    assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
    assert!(e.message().contains(&format!("{what} is 256 bytes long, more than the limit of 255")), "{e}");
}

#[test]
fn a_name_too_long_fails_its_item_alone_and_an_identity_too_long_fails_all() {
    let s = store();
    let tag = random_tag();
    let long_name = "n".repeat(MAX_NAME_LEN + 1);
    let long_id = "i".repeat(MAX_IDENTITY_LEN + 1);
    let (a, b) = (format!("valid-a-{tag}"), format!("valid-b-{tag}"));
    let items = [
        BatchItem { name: &a, fence: 0, payload: b"" },
        BatchItem { name: &long_name, fence: 0, payload: b"" },
        BatchItem { name: &b, fence: 0, payload: b"" },
    ];
    let out = s.acquire_many("x", T, &items, T);
    assert_eq!(out.len(), 3);
    assert!(out[0].as_ref().is_ok_and(|l| l.held_by("x") && l.name == a), "{:?}", out[0]);
    too_long("election name", out[1].as_ref().unwrap_err());
    assert!(out[2].as_ref().is_ok_and(|l| l.held_by("x") && l.name == b), "{:?}", out[2]);
    let read = s.inspect_many(&[&long_name, &a], T);
    too_long("election name", read[0].as_ref().unwrap_err());
    assert!(read[1].as_ref().is_ok_and(|l| l.held_by("x")), "{:?}", read[1]);

    let c = format!("valid-c-{tag}");
    let fresh = [BatchItem { name: &c, fence: 0, payload: b"" }, BatchItem { name: &a, fence: 0, payload: b"" }];
    for r in s.acquire_many(&long_id, T, &fresh, T) {
        too_long("identity", &r.unwrap_err());
    }
    for r in s.renew_many(&long_id, T, &fresh, T) {
        too_long("identity", &r.unwrap_err());
    }
    for r in s.release_many(&long_id, &fresh, T) {
        too_long("identity", &r.unwrap_err());
    }
    assert!(s.inspect(&c, T).unwrap_err().is_no_lease(), "nothing was written for {c}");
    assert!(s.inspect(&a, T).unwrap().held_by("x"), "{a} is untouched");
}

#[test]
fn a_multi_primary_store_without_its_terms_table_says_how_to_make_it() {
    let table = format!("le_noterms_{}", random_tag());
    MySqlStore::builder(&url(SHARED)).table(&table).build().unwrap().ensure_schema().unwrap();
    exec(&mut admin(SHARED), &format!("DROP TABLE IF EXISTS `{table}_terms`"));
    let m = MySqlStore::builder(&url(SHARED)).table(&table).multi_primary(true).build().unwrap();
    let explained = |call: &str, e: &StoreError| {
        assert_eq!(e.kind(), ErrorKind::Fatal, "{call}: {e}");
        assert!(e.message().starts_with(&format!("mysql {call}: server error 1146")), "{call}: {e}");
        assert!(e.message().contains("a multi-primary cluster needs the terms table"), "{call}: {e}");
        assert!(e.message().contains(&format!("CREATE TABLE IF NOT EXISTS `{table}_terms`")), "{call}: {e}");
    };
    explained("acquire", &m.acquire("e", "a", T, b"", T).unwrap_err());
    let items = [BatchItem { name: "e1", fence: 0, payload: b"" }, BatchItem { name: "e2", fence: 0, payload: b"" }];
    for r in m.acquire_many("a", T, &items, T) {
        explained("acquire_many", &r.unwrap_err());
    }
    m.ensure_schema().expect("ensure_schema makes it");
    assert!(m.acquire("e", "a", T, b"", T).unwrap().held_by("a"));
    exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
}
