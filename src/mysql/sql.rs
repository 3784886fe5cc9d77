//! The statements, their literals, reading rows back, and error
//! classification.
//!
//! Every operation is one text-protocol query holding a few statements,
//! sent in one round trip: bound the server's lock waits, run the short
//! transaction, and put the session's lock-wait settings back. MySQL 8 has
//! no `RETURNING`, so the write and the read of the row are two statements
//! of one transaction, on MariaDB as on MySQL.
//!
//! Values are hex literals (`X'…'`), whose meaning no `sql_mode` or
//! character set changes, and integers formatted from Rust integers.
//! Identifiers come already quoted by `ident::quote_mysql`. Instants are
//! `BIGINT` microseconds since the Unix epoch computed from
//! `UTC_TIMESTAMP(6)`, so the session time zone (and its daylight-saving
//! folds) can change none of them.

use std::time::Duration;

use mysql::Value;

use crate::lease::{DbTime, Lease};
use crate::slot::MAX_SLOT_LEN;
use crate::store::{ErrorKind, StoreError};
use crate::timing::{MAX_IDENTITY_LEN, MAX_NAME_LEN};

/// Longest TTL written, so `now + ttl` stays far inside `BIGINT`.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The server's clock in microseconds since the epoch, UTC, with no time
/// zone conversion anywhere. `UTC_TIMESTAMP(6)` is fixed for the duration
/// of one statement, so every use in a statement reads the same instant.
pub(crate) const NOW: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The instant of one call: the server's clock read once, after the
/// session's `timestamp` is back to the real clock, and used by every
/// statement of the call, so the write, its guard and the row read back
/// all speak of the same instant, and the read-back can tell the row this
/// call wrote (its `renewed_at` is exactly this) from one it did not.
pub(crate) const AT: &str = "@leaderelection_now";

/// The instant before which a lease counts as expired for a claim: the
/// call's instant less the store's bound on the clock skew between the
/// servers that write one election's rows (`MySqlBuilder::max_clock_skew`,
/// 0 by default). Every claiming text sets it ([`claimable`]) after the
/// call's instant; unset it is NULL and nothing is claimed.
pub(crate) const CLAIMABLE: &str = "@leaderelection_claimable";

/// Sets [`CLAIMABLE`] from the call's instant and the skew bound.
pub(crate) fn claimable(skew: Duration) -> String {
    format!("SET {CLAIMABLE} = {AT} - {};", skew.min(MAX_TTL).as_micros())
}

/// The payload, sent once (the claim needs it twice).
const PAYLOAD: &str = "@leaderelection_payload";

/// Whether the term a slot claim is for holds the lease (1 or 0).
const HELD: &str = "@leaderelection_held";

/// Whether the row an acquire found was written under another server's
/// history (see [`acquire`]).
const INHERITED: &str = "@leaderelection_inherited";

/// The history of the server answering: its `server_id`, which every
/// server of a replication topology must have of its own (so promoting a
/// replica changes it; a restart keeps it). Every write stamps its row with
/// it (`history`), and a row whose stamp differs was written by another
/// server and may lack writes that server acknowledged.
///
/// A value the statements carry, read once per call into this variable
/// ([`pin`]), not `@@server_id` in the statements themselves: under
/// statement-based replication a replica runs the statements again, and on
/// MySQL, where `server_id` is global only, it would stamp its own id, so
/// after a promotion every row would look native (MariaDB's replication
/// thread happens to take on the source's id). A user variable goes into
/// the binary log with its value. The global value, too: a session's
/// `server_id` (MariaDB lets a session set one) is not the server's.
pub(crate) const HISTORY: &str = "@leaderelection_history";

/// What [`HISTORY`] is set to, once per call.
pub(crate) const SERVER_HISTORY: &str = "CAST(@@GLOBAL.server_id AS BINARY)";

/// The columns every lease-reading statement yields, in this order, then
/// the call's instant ([`AT`] for a write, the reading statement's own
/// clock for an inspect), `ROW_COUNT()` of the statement before it, and the
/// server's clock as the row is read.
pub(crate) const COLS: &str = "name, holder, fence, acquired_at, renewed_at, expires_at, payload";

/// How many columns a lease row read back has.
const ROW_LEN: usize = 10;

/// The `sql_mode` every call runs under. Modes change what statements mean
/// (`SIMULTANEOUS_ASSIGNMENT` the order of `ON DUPLICATE KEY UPDATE`
/// assignments, `ORACLE` and `ANSI` a dozen things); this one is strict, so
/// a value the table cannot hold is an error, and means the same on MySQL 8
/// and MariaDB.
const SQL_MODE: &str = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION";

pub(crate) fn create_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   name        VARBINARY({MAX_NAME_LEN}) NOT NULL,\n\
         \x20   holder      VARBINARY({MAX_IDENTITY_LEN}) NOT NULL,\n\
         \x20   fence       BIGINT      NOT NULL CHECK (fence > 0),\n\
         \x20   acquired_at BIGINT      NOT NULL COMMENT 'microseconds since 1970-01-01 00:00 UTC, server clock',\n\
         \x20   renewed_at  BIGINT      NOT NULL COMMENT 'microseconds since 1970-01-01 00:00 UTC, server clock',\n\
         \x20   expires_at  BIGINT      NOT NULL COMMENT 'microseconds since 1970-01-01 00:00 UTC, server clock',\n\
         \x20   payload     MEDIUMBLOB  NOT NULL,\n\
         \x20   terms       BIGINT      NOT NULL DEFAULT 0 COMMENT 'terms so far, for operators' CHECK (terms >= 0),\n\
         \x20   history     VARBINARY(64) NULL COMMENT 'the server_id of the server that last wrote the row',\n\
         \x20   PRIMARY KEY (name),\n\
         \x20   KEY {TERM_INDEX} (name, fence, holder)\n\
         ) ENGINE = InnoDB;\n"
    )
}

/// The index lease checks lock (see [`lease_check`]). A claim changes
/// `fence` and `holder`, so it must change this index's entry; a renewal or
/// a release changes neither.
pub(crate) const TERM_INDEX: &str = "leaderelection_term";

/// Every statement that reads or writes the lease row by its name goes
/// through the primary key. Left to itself, MariaDB's range optimizer picks
/// [`TERM_INDEX`] for an `UPDATE … WHERE name = …` (both find one row), and
/// an exclusive lock taken through it locks the index entry that lease
/// checks hold shared: a renewal would wait for every checked transaction.
pub(crate) const BY_KEY: &str = "FORCE INDEX (PRIMARY)";

/// The statement that gives a table made before lease checks existed the
/// index they lock. Online in InnoDB (no lock on rows, a short metadata
/// lock at the start and the end); a racing replica's duplicate (1061)
/// counts as done.
pub(crate) fn add_term_index(table: &str) -> String {
    format!("ALTER TABLE {table} ADD INDEX {TERM_INDEX} (name, fence, holder)")
}

/// The statement that gives a table made before server histories were
/// recorded the `history` column (after `terms`, as in [`create_table`]).
/// Rows start with none (NULL), which counts as this server's until
/// written; a racing replica's duplicate column (1060) counts as done.
pub(crate) fn add_history(table: &str) -> String {
    format!("ALTER TABLE {table} ADD COLUMN history VARBINARY(64) NULL AFTER terms")
}

/// How many `terms` and `history` columns and [`TERM_INDEX`] indexes the
/// table `name` (unquoted) of the session's database has, and `leads`
/// columns its members table has: rows `'terms', n`, `'history', n`,
/// `'index', n` and `'leads', n`, each 1 or 0. The comparison is binary (a hex literal), so
/// a server with `lower_case_table_names` set may answer 0 for a table that
/// has them; the `ALTER` then fails with 1060 or 1061, which count as done.
pub(crate) fn schema_state(name: &str) -> String {
    let n = hex(name.as_bytes());
    format!(
        "SELECT 'terms', COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {n} AND COLUMN_NAME = 'terms'; \
         SELECT 'history', COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {n} AND COLUMN_NAME = 'history'; \
         SELECT 'index', COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {n} AND INDEX_NAME = '{TERM_INDEX}'; \
         SELECT 'leads', COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = {} AND COLUMN_NAME = 'leads';",
        hex(format!("{name}_members").as_bytes())
    )
}

/// The lease check (see `MySqlStore::check_lease`), with parameters `?`
/// the election's name, the identity and the fence, in that order: one row
/// back while this term holds the lease, none otherwise.
///
/// How it holds a claim off and lets renewals through: `LOCK IN SHARE
/// MODE` through [`TERM_INDEX`] with a covering condition sets a shared
/// lock on that index's entry only (InnoDB locks the row itself too only
/// for exclusive locks or when it must read columns the index lacks). A
/// claim changes `fence`, so it must replace that entry, and waits for the
/// lock until the checking transaction ends; a renewal changes no column
/// of the index and takes only the row's own lock. The expiry, which the
/// index cannot hold (renewals move it), is read by a subquery, which a
/// locking clause of the outer query does not make a locking read (except
/// under `SERIALIZABLE`, where every read locks). `FORCE INDEX` makes a
/// table without the index an error (1176) rather than a check that locks
/// the whole row. The clock is `UTC_TIMESTAMP(6)` as the store's own
/// statements read it.
pub(crate) fn lease_check(table: &str) -> String {
    lease_check_with(table, "?", "?", "?", "1")
}

fn lease_check_with(table: &str, name: &str, identity: &str, fence: &str, what: &str) -> String {
    format!(
        "SELECT {what} FROM {table} AS term FORCE INDEX ({TERM_INDEX}) \
         WHERE term.name = {name} AND CAST(term.holder AS BINARY) = {identity} AND term.fence = {fence} \
         AND (SELECT lease.expires_at > {NOW} FROM {table} AS lease {BY_KEY} WHERE lease.name = term.name) \
         LOCK IN SHARE MODE"
    )
}

/// The lease check with its values written in, as one statement that
/// fails by itself when the term no longer holds the lease, for the
/// `mariadb` and `mysql` clients (which stop a script at the first error,
/// and roll back the open transaction as they disconnect). Neither server
/// can raise an error of one's choosing outside a stored program, so the
/// failure is a subquery of two rows where one is expected: error 1242
/// (SQLSTATE 21000, "Subquery returns more than 1 row"). A missing index
/// fails it with 1176. The values are hex literals: nothing in them can
/// end the statement.
pub(crate) fn lease_check_literal(table: &str, name: &str, identity: &str, fence: u64) -> Result<String, StoreError> {
    let (n, i) = (text("election name", name, MAX_NAME_LEN)?, text("identity", identity, MAX_IDENTITY_LEN)?);
    let what = "IF(COUNT(*) = 1, 'leaderelection: lease held', \
                (SELECT 'leaderelection: lease lost' UNION ALL SELECT 'leaderelection: lease lost')) \
                AS leaderelection_lease_check";
    Ok(lease_check_with(table, &n, &i, &fence.to_string(), what))
}

/// The table of slots claimed (see [`crate::slot`]): one row per election
/// and slot, with the fence of the term that claimed it, when, and how its
/// run ended (`outcome`, 0 for success; NULL while it runs, or when it was
/// killed before it could say).
pub(crate) fn create_slots(slots: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {slots} (\n\
         \x20   name        VARBINARY({MAX_NAME_LEN}) NOT NULL,\n\
         \x20   slot        VARBINARY({MAX_SLOT_LEN}) NOT NULL,\n\
         \x20   fence       BIGINT      NOT NULL,\n\
         \x20   claimed_at  BIGINT      NOT NULL COMMENT 'microseconds since 1970-01-01 00:00 UTC, server clock',\n\
         \x20   finished_at BIGINT      NULL COMMENT 'microseconds since 1970-01-01 00:00 UTC, server clock',\n\
         \x20   outcome     INT         NULL COMMENT 'the run''s status, 0 for success; NULL: running, or killed',\n\
         \x20   PRIMARY KEY (name, slot)\n\
         ) ENGINE = InnoDB;\n"
    )
}

/// The table of group members (see [`crate::batch::Members`]): one row per
/// group and member, with when its heartbeat expires. Binary columns, as
/// the election table's, so names compare byte for byte.
pub(crate) fn create_members(members: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {members} (\n\
         \x20   group_name  VARBINARY({MAX_NAME_LEN}) NOT NULL,\n\
         \x20   member      VARBINARY({MAX_IDENTITY_LEN}) NOT NULL,\n\
         \x20   expires_at  BIGINT      NOT NULL COMMENT 'microseconds since 1970-01-01 00:00 UTC, server clock',\n\
         \x20   leads       BIGINT      NOT NULL DEFAULT 0 COMMENT 'elections the member last reported leading',\n\
         \x20   PRIMARY KEY (group_name, member)\n\
         ) ENGINE = InnoDB;\n"
    )
}

/// How long after its heartbeat expired a member's row may be deleted.
pub(crate) const FORGET_MEMBERS_AFTER: Duration = Duration::from_secs(3600);

/// A member's heartbeat, without its transaction (the caller's: one of its
/// own, or a renewal batch's, see `MySqlStore::renew_many_with_heartbeat`):
/// its row written with the later of its expiry and the call's instant
/// plus `ttl` (one assignment, reading only the old row, and only when the row found is
/// exactly this group's and member's), then one row `'members', live,
/// stale, now, rank, led, most`: the group's rows unexpired at the call's
/// instant (this one included), those expired for longer than
/// [`FORGET_MEMBERS_AFTER`], the unexpired ones whose member's bytes come
/// before this one's, and the sum and the most of the unexpired rows'
/// `leads` (this one's as just written), by a plain read (no lock on
/// the other members' rows).
pub(crate) fn heartbeat(
    members: &str, group: &str, member: &str, leading: u32, ttl: Duration,
) -> Result<String, StoreError> {
    let (g, m, t) =
        (text("group name", group, MAX_NAME_LEN)?, text("member", member, MAX_IDENTITY_LEN)?, ttl_micros(ttl));
    let forget = FORGET_MEMBERS_AFTER.as_micros();
    let ours = format!("{} AND {}", exactly("group_name", &g), exactly("member", &m));
    Ok(format!(
        "INSERT INTO {members} (group_name, member, expires_at, leads) VALUES ({g}, {m}, {AT} + {t}, {leading}) \
         ON DUPLICATE KEY UPDATE expires_at = IF({ours} AND leads >= 0, GREATEST(expires_at, {AT} + {t}), expires_at), \
         leads = IF({ours} AND leads >= 0, {leading}, leads); \
         SELECT 'members', COALESCE(SUM(expires_at > {AT}), 0), COALESCE(SUM(expires_at < {AT} - {forget}), 0), {AT}, \
         COALESCE(SUM(expires_at > {AT} AND CAST(member AS BINARY) < {m}), 0), \
         COALESCE(SUM(IF(expires_at > {AT}, leads, 0)), 0), COALESCE(MAX(IF(expires_at > {AT}, leads, 0)), 0) \
         FROM {members} {BY_KEY} WHERE group_name = {g} AND {};",
        exactly("group_name", &g),
    ))
}

/// The statement that gives a members table made before members reported
/// what they lead the `leads` column; a racing replica's duplicate
/// column (1060) counts as done.
pub(crate) fn add_leading(members: &str) -> String {
    format!("ALTER TABLE {members} ADD COLUMN leads BIGINT NOT NULL DEFAULT 0")
}

/// Deletes the rows of `group`'s members whose heartbeat expired longer
/// than [`FORGET_MEMBERS_AFTER`] ago (members that stopped without
/// leaving). Locks the group's rows while it runs, so it runs only when a
/// heartbeat found such rows.
pub(crate) fn forget_members(members: &str, group: &str) -> Result<String, StoreError> {
    let g = text("group name", group, MAX_NAME_LEN)?;
    let forget = FORGET_MEMBERS_AFTER.as_micros();
    Ok(format!(
        "{BEGIN} DELETE FROM {members} WHERE group_name = {g} AND {} AND expires_at < {AT} - {forget}; {COMMIT}",
        exactly("group_name", &g)
    ))
}

/// Turns `member`'s row of `group` into a tombstone: expired now, `leads`
/// -1, which a heartbeat that arrives later leaves as it is (see
/// [`heartbeat`]); deleted with the rows of members gone for an hour.
pub(crate) fn leave_group(members: &str, group: &str, member: &str) -> Result<String, StoreError> {
    let (g, m) = (text("group name", group, MAX_NAME_LEN)?, text("member", member, MAX_IDENTITY_LEN)?);
    let ours = format!("{} AND {}", exactly("group_name", &g), exactly("member", &m));
    Ok(format!(
        "{BEGIN} INSERT INTO {members} (group_name, member, expires_at, leads) VALUES ({g}, {m}, {AT}, -1) \
         ON DUPLICATE KEY UPDATE expires_at = IF({ours}, LEAST(expires_at, {AT}), expires_at), \
         leads = IF({ours}, -1, leads); {COMMIT}"
    ))
}

/// Claims `slot` for the term (`identity`, `fence`) if it holds the lease
/// at the call's instant, in one short transaction: the lease check (a
/// plain read); the slot's row inserted only when it passed (`INSERT
/// IGNORE`, whose row count is 1 or 0 whatever the connection's
/// `client_found_rows` says); with `retry_failed`, an earlier term's row
/// taken over whose run did not record success (an `UPDATE` whose
/// condition is on the old row and that always changes `fence`, so its
/// count is 1 or 0 either way); then the slot's row as it stands (a
/// locking read, so a claim committed meanwhile is seen); with `check`,
/// after the `COMMIT`, whether the slot's row holds this claim committed
/// (as [`committed`] reads a lease). Rows back: `'inserted', held, count`,
/// `'retaken', count`, `'slot', fence, outcome`, and with `check`
/// `'committed', count`.
/// The primary key serialises concurrent claims of one slot.
#[allow(clippy::too_many_arguments)]
pub(crate) fn claim_slot(
    table: &str, slots: &str, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, check: bool,
) -> Result<String, StoreError> {
    let (n, i, sl) = (
        text("election name", name, MAX_NAME_LEN)?,
        text("identity", identity, MAX_IDENTITY_LEN)?,
        text("slot", slot, MAX_SLOT_LEN)?,
    );
    let retry = if retry_failed { "TRUE" } else { "FALSE" };
    Ok(format!(
        "{BEGIN} \
         SELECT COUNT(*) INTO {HELD} FROM {table} WHERE name = {n} AND {} AND {} AND fence = {fence} \
         AND expires_at > {AT} AND renewed_at <= {AT}; \
         INSERT IGNORE INTO {slots} (name, slot, fence, claimed_at) SELECT {n}, {sl}, {fence}, {AT} FROM DUAL \
         WHERE {HELD} = 1; \
         SELECT 'inserted', {HELD}, ROW_COUNT(); \
         UPDATE {slots} SET claimed_at = {AT}, finished_at = NULL, outcome = NULL, fence = {fence} \
         WHERE name = {n} AND slot = {sl} AND {HELD} = 1 AND {retry} AND fence < {fence} AND NOT (outcome <=> 0); \
         SELECT 'retaken', ROW_COUNT(); \
         SELECT 'slot', fence, outcome FROM {slots} WHERE name = {n} AND slot = {sl} FOR UPDATE; \
         {COMMIT} {}",
        exactly("name", &n),
        exactly("holder", &i),
        if check {
            format!(
                "{READ_BEGIN} SELECT 'committed', COUNT(*) FROM {slots} WHERE name = {n} AND slot = {sl} \
                 AND fence = {fence} AND claimed_at = {AT}; {COMMIT}"
            )
        } else {
            String::new()
        },
    ))
}

/// Records how the run of `slot` that the term with `fence` claimed ended;
/// then one row `'finish', ROW_COUNT()`.
pub(crate) fn finish_slot(slots: &str, name: &str, fence: u64, slot: &str, outcome: i32) -> Result<String, StoreError> {
    let (n, sl) = (text("election name", name, MAX_NAME_LEN)?, text("slot", slot, MAX_SLOT_LEN)?);
    Ok(format!(
        "{BEGIN} \
         UPDATE {slots} SET finished_at = {AT}, outcome = {outcome} WHERE name = {n} AND slot = {sl} AND fence = {fence}; \
         SELECT 'finish', ROW_COUNT(); {COMMIT}"
    ))
}

/// The rows among `rows` whose first column is the tag `tag`, without it.
pub(crate) fn tagged<'a>(rows: &'a [Vec<Value>], tag: &'a str) -> impl Iterator<Item = &'a [Value]> + 'a {
    rows.iter().filter(move |r| matches!(r.first(), Some(Value::Bytes(b)) if b == tag.as_bytes())).map(|r| &r[1..])
}

/// An integer column as the text protocol sends it; `None` for NULL or
/// anything else.
pub(crate) fn int_value(v: &Value) -> Option<i64> {
    match v {
        Value::Int(v) => Some(*v),
        Value::UInt(v) => i64::try_from(*v).ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// The statement that gives a table made before the `terms` column existed
/// that column (last, as in [`create_table`], so old and new tables match).
/// Existing rows start at 0: their earlier terms were not counted. MySQL 8
/// has no `ADD COLUMN IF NOT EXISTS`, so [`schema_state`] looks first and a
/// racing replica's duplicate column (1060) counts as done.
pub(crate) fn add_terms(table: &str) -> String {
    format!("ALTER TABLE {table} ADD COLUMN terms BIGINT NOT NULL DEFAULT 0 CHECK (terms >= 0)")
}

/// Whole seconds the server may wait for a row or metadata lock: a little
/// inside `remaining`, at least 1 (the smallest either server accepts).
pub(crate) fn lock_wait_secs(remaining: Duration) -> u64 {
    (remaining.min(super::MAX_WAIT).as_millis() as u64 * 3 / 4 / 1000).max(1)
}

/// Wraps `body` (statements ending in `;`) in the settings every call pins,
/// so that what a session was left with (by an `init` statement, a server
/// default, or an application sharing its `mysql::Pool`) cannot change what
/// the statements mean: the real clock (`timestamp`, which `NOW()` and
/// `UTC_TIMESTAMP()` follow), [`SQL_MODE`], no row limit on reads, result
/// text in `utf8mb4`, and the server-side bound on lock waits. Then the
/// call's instant is read into [`AT`]. The settings go back to the server's
/// defaults, and the variables are cleared, in the same round trip. When a
/// statement fails, the rest do not run, and the store drops that
/// connection (which also rolls back an open transaction), so a changed
/// setting never outlives the call.
///
/// The `SET` that pins the settings is parsed under the session's own
/// mode; every statement after it is parsed under [`SQL_MODE`].
///
pub(crate) fn pinned(body: &str, remaining: Duration) -> String {
    format!("{} {body} {}", pin(remaining), unpin())
}

/// The start of [`pinned`]: the settings, then the call's instant. A
/// batch that spans several queries sends it first, and [`unpin`] last.
pub(crate) fn pin(remaining: Duration) -> String {
    let s = lock_wait_secs(remaining);
    format!(
        "SET SESSION timestamp = DEFAULT, sql_mode = '{SQL_MODE}', sql_select_limit = 18446744073709551615, \
         character_set_results = 'utf8mb4', innodb_lock_wait_timeout = {s}, lock_wait_timeout = {s}; \
         SET {AT} = {NOW}, {HISTORY} = {SERVER_HISTORY};"
    )
}

/// The end of [`pinned`]: the settings back to the server's defaults, the
/// variables cleared.
pub(crate) fn unpin() -> String {
    format!(
        "SET SESSION sql_mode = DEFAULT, sql_select_limit = DEFAULT, character_set_results = DEFAULT, \
         innodb_lock_wait_timeout = DEFAULT, lock_wait_timeout = DEFAULT, {AT} = NULL, {PAYLOAD} = NULL, \
         {HELD} = NULL, {INHERITED} = NULL, {CLAIMABLE} = NULL, {HISTORY} = NULL"
    )
}

/// Starts a write's transaction: `REPEATABLE READ` whatever the session's
/// level (under `SERIALIZABLE` a follower's read would lock the row; under
/// `READ COMMITTED` statement-based binlogs refuse the writes), and
/// read-only exactly when the server is (`@@global.read_only`, which
/// `super_read_only` turns on too), whatever the session's default.
///
/// Both are characteristics of the next transaction only, so the session
/// keeps its own. A server made read-only refuses the writes of a user
/// without `SUPER` (MySQL) or `READ_ONLY ADMIN` (MariaDB) by itself; a
/// read-only transaction refuses every user's (1792, retryable), so an
/// election user with those privileges does not write through an
/// operator's fence either. The variable is `tx_read_only` on MariaDB
/// (`transaction_read_only` only from 11.1) and `transaction_read_only`
/// on MySQL (8.0.3 dropped `tx_read_only`): each server runs its own
/// assignment in an executable comment, `/*M!…*/` on MariaDB only, and
/// `/*!80003 …*/` on MySQL only (MariaDB skips versions 50700-99999 as
/// MySQL's). They ride on a `SET` of the call's instant to itself, so the
/// statement is never empty.
pub(crate) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
     SET @leaderelection_now = @leaderelection_now /*M!100000 , @@tx_read_only = @@global.read_only */ \
     /*!80003 , @@transaction_read_only = @@global.read_only */; START TRANSACTION;";

/// [`BEGIN`] as it was before writes respected a read-only server: read-write
/// whatever the server says, so a user with `SUPER` or `READ_ONLY ADMIN`
/// writes through `read_only`. For the negative control only
/// (`MySqlStore::__overriding_read_only`).
pub(crate) const BEGIN_OVERRIDING_READ_ONLY: &str =
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION READ WRITE;";

/// Commits without chaining a transaction or ending the session, whatever
/// `completion_type` says (`RELEASE` would close the connection after every
/// call, so every write would look lost).
pub(crate) const COMMIT: &str = "COMMIT AND NO CHAIN NO RELEASE;";

pub(crate) fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2 + 3);
    hex_into(&mut s, b);
    s
}

/// [`hex`] written at the end of `s`.
pub(crate) fn hex_into(s: &mut String, b: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    s.reserve(b.len() * 2 + 3);
    s.push_str("X'");
    for &x in b {
        s.push(DIGITS[usize::from(x >> 4)] as char);
        s.push(DIGITS[usize::from(x & 15)] as char);
    }
    s.push('\'');
}

/// A name or identity as a literal, refused when the column cannot hold it
/// (the server might otherwise cut it short in a lax `sql_mode`).
pub(crate) fn text(what: &'static str, s: &str, max: usize) -> Result<String, StoreError> {
    if s.len() > max {
        return Err(StoreError::fatal(format!(
            "mysql: {what} is {} bytes long, more than the limit of {max}",
            s.len()
        )));
    }
    Ok(hex(s.as_bytes()))
}
/// A claim's or renewal's values as SQL: the election's name and the
/// identity as checked literals, the payload in hex, the lease in
/// microseconds.
fn term_values(
    name: &str, identity: &str, payload: &[u8], ttl: Duration,
) -> Result<(String, String, String, u128), StoreError> {
    Ok((
        text("election name", name, MAX_NAME_LEN)?,
        text("identity", identity, MAX_IDENTITY_LEN)?,
        hex(payload),
        ttl_micros(ttl),
    ))
}

pub(crate) fn ttl_micros(ttl: Duration) -> u128 {
    ttl.min(MAX_TTL).as_micros()
}

/// Whether the row's column `col` is exactly the bytes of the literal `lit`.
/// A table made by hand with a case- or accent-insensitive collation would
/// otherwise match another election's (or holder's) row.
pub(crate) fn exactly(col: &str, lit: &str) -> String {
    format!("CAST({col} AS BINARY) = {lit}")
}

/// Claims an absent, expired or own lease; otherwise leaves the row alone.
/// Then reads the row back in the same transaction.
///
/// **Every assignment means the same in any order.** MySQL evaluates the
/// `ON DUPLICATE KEY UPDATE` assignments "generally left to right", each
/// seeing the values assigned before it; MariaDB's `SIMULTANEOUS_ASSIGNMENT`
/// mode (part of `sql_mode=ORACLE`) has every one read the old row. So each
/// assignment repeats the whole condition, on the old row's columns:
///
/// - `claim`: the row is this election's and expired at the call's instant;
/// - `write`: `claim`, or the row is this election's, held by `identity`,
///   valid, and last written no later than this call's instant (a call
///   whose clock reading is older than the holder's own release or renewal
///   must not extend the lease after it).
///
/// Only the last assignment, `expires_at`, reads columns assigned before it
/// (`holder`, `renewed_at`): under left-to-right order it sees their new
/// values, and those give `write` the same value as the old ones do (a
/// claim made `holder` this identity and `renewed_at` this instant, which
/// `write` then accepts; a row not written kept both). Every column a
/// condition reads, `expires_at` included, is assigned after every other
/// assignment that reads it.
///
/// Fences: an absent row starts at the server's clock in microseconds; a
/// claim of an expired row takes `GREATEST(fence + 1, now)`, so a fence is
/// higher than any this election handed out before even after the row was
/// deleted or an older copy restored (unless the server clock went back);
/// the holder re-acquiring a valid lease keeps its fence. Expiry never moves
/// backwards: `GREATEST(expires_at, now + ttl)`.
///
/// `terms` counts the election's terms for operators: 1 for an absent row,
/// one more for each claim of an expired row, unchanged when the holder
/// re-acquires its valid lease.
///
/// The payload is sent once, in a session variable.
///
/// **A row inherited across a failover** (its `history` is not this
/// server's [`HISTORY`]) may lack renewals, or the claim, that the old
/// primary acknowledged. It is never claimed as it stands. The call first
/// reads (and locks) whether the row is inherited into [`INHERITED`]; an
/// expired inherited row is then held for nobody, in this server's
/// history, by an `UPDATE` of its own: the holder becomes empty (no
/// identity is, so nobody can renew or release it), the fence stays, and
/// it expires a whole lease from the call's instant (the longer of this
/// caller's and the row's own; `expires_at` is assigned first, so both
/// assignment orders read the old `renewed_at`). The claim's conditions
/// also require the row not inherited, so an unexpired inherited row is
/// left for its holder to renew (see [`renew`]). A claim is possible only
/// a lease after the first participant asked, when every deadline the old
/// primary's acknowledgements gave has passed. The claim itself writes no
/// `history` (it needs none: a row it writes is this server's or NULL,
/// which counts as this server's; a new row gets this server's stamp).
/// Without `failover_rule` (the failover tests' negative control only)
/// every row counts as this server's, as in a store that knows nothing of
/// server histories.
///
/// With `terms` (a multi-primary cluster's terms table, see
/// [`super::cluster`]), a claim of a new term also replaces the election's
/// terms row, in the same transaction. A row counts as expired for the
/// claim `skew` after its expiry (see [`CLAIMABLE`]). With `check`, the
/// row is read again after the `COMMIT` ([`committed`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire(
    table: &str, name: &str, identity: &str, ttl: Duration, payload: &[u8], failover_rule: bool, terms: Option<&str>,
    skew: Duration, check: bool,
) -> Result<String, StoreError> {
    let (n, i, p, t) = term_values(name, identity, payload, ttl)?;
    let ours = exactly("name", &n);
    let inherited = if failover_rule { format!("COALESCE(history <> {HISTORY}, FALSE)") } else { "FALSE".into() };
    let update = claim_update(&ours, &format!("NOT {INHERITED}"), &i, t, PAYLOAD);
    let this_row = format!("name = {n} AND {ours}");
    Ok(format!(
        "SET {PAYLOAD} = {p}; {} {BEGIN} \
         SET {INHERITED} = FALSE; \
         SELECT {inherited} INTO {INHERITED} FROM {table} {BY_KEY} \
         WHERE name = {n} AND {ours} FOR UPDATE; \
         UPDATE {table} {BY_KEY} SET expires_at = GREATEST(expires_at, {AT} + GREATEST({t}, expires_at - renewed_at)), \
           renewed_at = GREATEST(renewed_at, {AT}), holder = X'', history = {HISTORY} \
         WHERE name = {n} AND {ours} AND {INHERITED} AND expires_at <= {CLAIMABLE}; \
         SET {INHERITED} = {INHERITED} AND ROW_COUNT() = 0; \
         INSERT INTO {table} (name, holder, fence, acquired_at, renewed_at, expires_at, payload, terms, history) \
         VALUES ({n}, {i}, GREATEST(1, {AT}), {AT}, {AT}, {AT} + {t}, {PAYLOAD}, 1, {HISTORY}) \
         {update}; \
         SELECT {COLS}, {AT}, ROW_COUNT(), {NOW} FROM {table} {BY_KEY} WHERE name = {n} FOR UPDATE; {} \
         {COMMIT} {}",
        claimable(skew),
        terms.map(|terms| claim_terms(terms, table, &this_row, &i)).unwrap_or_default(),
        if check { committed(table, &this_row, &i) } else { String::new() }
    ))
}

/// The claim's `ON DUPLICATE KEY UPDATE` clause (see [`acquire`]): the
/// `ON DUPLICATE KEY UPDATE` of [`claim_assignments`].
pub(crate) fn claim_update(ours: &str, not_inherited: &str, identity: &str, ttl: u128, payload: &str) -> String {
    format!("ON DUPLICATE KEY UPDATE {}", claim_assignments(ours, not_inherited, identity, ttl, payload))
}

/// The claim's assignments (see [`acquire`]), for the single claim and the
/// batched one (its `INSERT … ON DUPLICATE KEY UPDATE` for new rows, its
/// `UPDATE` for existing ones) alike: `ours` says the row is the one the
/// statement names, `not_inherited` that it is this server's, `identity`
/// is the claimant's literal, `payload` the new payload's expression.
/// Every assignment repeats its whole condition on the old row's columns,
/// so it means the same under left-to-right and simultaneous assignment.
pub(crate) fn claim_assignments(ours: &str, not_inherited: &str, identity: &str, ttl: u128, payload: &str) -> String {
    let (i, t) = (identity, ttl);
    let claim = format!("({ours} AND {not_inherited} AND expires_at <= {CLAIMABLE})");
    let write = format!(
        "({ours} AND {not_inherited} AND (expires_at <= {CLAIMABLE} OR ({} AND expires_at > {AT} AND renewed_at <= {AT})))",
        exactly("holder", i)
    );
    format!(
        "fence = IF({claim}, GREATEST(fence + 1, {AT}), fence), \
           acquired_at = IF({claim}, {AT}, acquired_at), \
           terms = IF({claim}, terms + 1, terms), \
           payload = IF({write}, {payload}, payload), \
           renewed_at = IF({write}, {AT}, renewed_at), \
           holder = IF({claim}, {i}, holder), \
           expires_at = IF({write}, GREATEST(expires_at, {AT} + {t}), expires_at)"
    )
}

/// Extends the holder's valid lease, never moving its expiry backwards (a
/// renewal delayed behind a lock or a frozen server that commits after a
/// newer one must not shorten it), then reads the row back.
///
/// A renewal applies only if the row was last written no later than its
/// own instant: one whose clock was read before the holder's release (it
/// waited behind the release's row lock, or was sent earlier on another
/// connection) finds `renewed_at` later than that and changes nothing, so
/// it cannot extend a released lease.
///
/// The holder renews a row inherited across a failover expired or not
/// (its renewals since the replica's copy may be lost; nobody else can
/// have claimed it, see [`acquire`]), and the row becomes this server's.
/// With `check`, the row is read again after the `COMMIT` ([`committed`]).
pub(crate) fn renew(
    table: &str, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], check: bool,
) -> Result<String, StoreError> {
    let (n, i, p, t) = term_values(name, identity, payload, ttl)?;
    let this_term = format!("name = {n} AND {} AND fence = {fence}", exactly("name", &n));
    Ok(format!(
        "SET {PAYLOAD} = {p}; {BEGIN} \
         UPDATE {table} {BY_KEY} SET renewed_at = {AT}, payload = {PAYLOAD}, expires_at = GREATEST(expires_at, {AT} + {t}), \
         history = {HISTORY} \
         WHERE name = {n} AND {} AND {} AND fence = {fence} \
         AND (expires_at > {AT} OR COALESCE(history <> {HISTORY}, FALSE)) AND renewed_at <= {AT}; \
         SELECT {COLS}, {AT}, ROW_COUNT(), {NOW} FROM {table} {BY_KEY} WHERE name = {n} FOR UPDATE; \
         {COMMIT} {}",
        exactly("name", &n),
        exactly("holder", &i),
        if check { committed(table, &this_term, &i) } else { String::new() },
    ))
}

/// Ends the term at the call's instant; the row and its fence stay. It also
/// moves `renewed_at` up to that instant, so a renewal of the term whose
/// clock was read before it cannot land after it (see [`renew`]).
///
/// A row inherited across a failover is left alone: the writes the
/// replica lacks may hold a newer term's claim, and ending the lease would
/// let a claim in at once (see [`acquire`]).
///
/// Like every statement here, an explicit transaction: a session that
/// starts with `autocommit = 0` (a server default some operators set, or an
/// `init` statement) would otherwise leave the update uncommitted, holding
/// the row lock, and lose it when the connection closed.
pub(crate) fn release(table: &str, name: &str, identity: &str, fence: u64) -> Result<String, StoreError> {
    let (n, i) = (text("election name", name, MAX_NAME_LEN)?, text("identity", identity, MAX_IDENTITY_LEN)?);
    Ok(format!(
        "{BEGIN} \
         UPDATE {table} {BY_KEY} SET renewed_at = GREATEST(renewed_at, {AT}), expires_at = {AT} \
         WHERE name = {n} AND {} AND {} AND fence = {fence} AND expires_at > {AT} \
         AND (history IS NULL OR history = {HISTORY}); \
         {COMMIT}",
        exactly("name", &n),
        exactly("holder", &i),
    ))
}

/// Reads the row; a plain consistent read, which takes no row lock, in a
/// read-only transaction of its own, so that with `autocommit = 0` it does
/// not keep reading one old snapshot.
pub(crate) fn inspect(table: &str, name: &str) -> Result<String, StoreError> {
    let n = text("election name", name, MAX_NAME_LEN)?;
    Ok(format!(
        "{READ_BEGIN} \
         SELECT {COLS}, {NOW}, 0, {NOW} FROM {table} WHERE name = {n}; {COMMIT}"
    ))
}

/// One lease row as read back: the lease with `now` set to the server's
/// clock as the row was read, the call's own instant, and the row count of
/// the write before it.
#[derive(Debug)]
pub(crate) struct ReadBack {
    pub lease: Lease,
    /// The instant the call's statements used ([`AT`]); for an inspect,
    /// the reading statement's clock.
    pub at: DbTime,
    pub row_count: i64,
    /// Whether a read after the `COMMIT` saw this call's write committed
    /// (see [`committed`]); a claim or renewal counts only then.
    pub committed: bool,
}

/// A read of committed rows, sent after a write's `COMMIT` in the same
/// query: one row tagged `committed` with the number of rows of `where_`
/// (an election, or a list of them) that hold this identity and this
/// call's instant as their `renewed_at` (which every claim and renewal
/// writes), so at most 1 per election.
///
/// **Why.** A claim or renewal counts only once its `COMMIT` took, and on
/// a multi-primary cluster a `COMMIT` that did not take can go unreported.
/// Galera certifies a transaction at its `COMMIT` against writes other
/// nodes committed meanwhile, and rolls one of two conflicting ones back
/// (MySQL Group Replication in multi-primary mode certifies the same way).
/// Measured on a three-node MariaDB 10.11 Galera cluster, claims of one new
/// election sent to every node at once: the loser's failure came back as
/// error 1213 at its `COMMIT` only when the `COMMIT` ended the query. With
/// statements after it (the store put its settings back there) the error
/// was lost in 17 of 50 trials, and even with only a `SET` before the
/// `COMMIT`, in a few of hundreds: two claimants each told they won, each
/// with a fence of its own, until the loser's first renewal found the
/// lease lost. The read after the `COMMIT` runs on the same node, which
/// has then either committed the write (it sees it) or rolled it back (it
/// does not), whatever the server reported; an error the server did
/// report still fails the call as before.
///
/// The read is a read-only transaction of its own, so a session whose
/// `autocommit` is off is not left inside one.
///
/// **Where.** Only where a `COMMIT` can be discarded unreported: a node of
/// a multi-primary cluster, or a server the store has not yet asked (see
/// `MySqlStore::checks_commits`). A single server, or a replication
/// topology with one writable node, certifies nothing at `COMMIT`: its
/// `COMMIT` either took or failed with an error the call reports, so the
/// read would only double each write's transactions (issue 35: a renewal
/// batch was two transactions, the write and this read).
pub(crate) fn committed(table: &str, where_: &str, identity: &str) -> String {
    format!("{READ_BEGIN} {} {COMMIT}", committed_read(table, where_, identity))
}

/// [`committed`]'s read alone, for a transaction that holds several.
pub(crate) fn committed_read(table: &str, where_: &str, identity: &str) -> String {
    format!(
        "SELECT 'committed', COUNT(*) FROM {table} {BY_KEY} WHERE {where_} \
         AND CAST(holder AS BINARY) = {identity} AND renewed_at = {AT};"
    )
}

/// Starts a read's transaction: `REPEATABLE READ` whatever the session's
/// level, read-only.
pub(crate) const READ_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION READ ONLY;";

/// Whether the [`committed`] reads among `rows` saw anything this call
/// wrote (0 when none came back).
pub(crate) fn committed_count(rows: &[Vec<Value>]) -> i64 {
    tagged(rows, "committed").filter_map(|r| r.first().and_then(int_value)).sum()
}

/// The one lease row among `rows` (every row of every statement's result;
/// only the lease-reading statement's have [`ROW_LEN`] columns), if any. A
/// row of another election, or a value of the wrong type, is an error: the
/// table is not what this store made.
pub(crate) fn read_back(op: &str, name: &str, rows: Vec<Vec<Value>>) -> Result<Option<ReadBack>, StoreError> {
    let (rows, others): (Vec<Vec<Value>>, Vec<Vec<Value>>) = rows.into_iter().partition(|r| r.len() == ROW_LEN);
    let mut rows = rows.into_iter();
    let Some(values) = rows.next() else { return Ok(None) };
    if rows.next().is_some() {
        return Err(StoreError::fatal(format!("mysql {op}: more than one row for one election name")));
    }
    let mut rb = lease_row(op, &values)?;
    if rb.lease.name != name {
        return Err(StoreError::fatal(format!("mysql {op}: the row read back is another election's")));
    }
    rb.committed = committed_count(&others) > 0;
    Ok(Some(rb))
}

/// One lease row's [`ROW_LEN`] values (see [`COLS`]), read as a lease; a
/// value of the wrong type is an error: the table is not what this store
/// made.
pub(crate) fn lease_row(op: &str, values: &[Value]) -> Result<ReadBack, StoreError> {
    let bad = |what: &str| StoreError::fatal(format!("mysql {op}: cannot read the lease row ({what})"));
    if values.len() != ROW_LEN {
        return Err(bad("wrong number of columns"));
    }
    let bytes = |i: usize| match &values[i] {
        Value::Bytes(b) => Ok(b.clone()),
        _ => Err(bad("not a byte string")),
    };
    let int = |i: usize| -> Result<i64, StoreError> {
        match &values[i] {
            Value::Int(v) => Ok(*v),
            Value::UInt(v) => i64::try_from(*v).map_err(|_| bad("integer out of range")),
            Value::Bytes(b) => {
                std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or_else(|| bad("not an integer"))
            }
            _ => Err(bad("not an integer")),
        }
    };
    let string = |i: usize| String::from_utf8(bytes(i)?).map_err(|_| bad("text that is not UTF-8"));
    let fence = int(2)?;
    let lease = Lease {
        name: string(0)?,
        holder: string(1)?,
        fence: u64::try_from(fence).ok().filter(|&f| f > 0).ok_or_else(|| bad("fence not positive"))?,
        acquired_at: DbTime::from_unix_micros(int(3)?),
        renewed_at: DbTime::from_unix_micros(int(4)?),
        expires_at: DbTime::from_unix_micros(int(5)?),
        now: DbTime::from_unix_micros(int(9)?),
        payload: bytes(6)?,
    };
    Ok(ReadBack { lease, at: DbTime::from_unix_micros(int(7)?), row_count: int(8)?, committed: false })
}

/// Checks a row this call wrote (acquire won, or renew matched) against
/// what it asked for, and returns it with `now` set to the call's instant:
/// the writing statement set `renewed_at` to exactly that instant, and
/// `expires_at - renewed_at` is the TTL it granted. That instant was read
/// after the request was sent, so a deadline the elector anchors at the
/// send time is never later than the server's expiry. A renewal (`fence`
/// given) must also have updated exactly one row.
///
/// A row that is not what this call wrote is an error, never a success:
/// another holder, fence or payload; a `renewed_at` that is not this call's
/// instant (the write did not happen, whatever the row says of its holder);
/// an expiry that is not in the future by the server's clock as the row
/// was read; less than the TTL asked for; a write that a read after the
/// `COMMIT` did not see committed ([`committed`]).
pub(crate) fn check_written(
    op: &str, rb: ReadBack, identity: &str, ttl: Duration, payload: &[u8], fence: Option<u64>,
) -> Result<Lease, StoreError> {
    let wrong = |what: &str| {
        StoreError::retryable(format!("mysql {op}: the row read back is not the one written ({what}); outcome unknown"))
    };
    let mut lease = rb.lease;
    if lease.holder != identity {
        return Err(wrong("another holder"));
    }
    if let Some(f) = fence {
        if lease.fence != f {
            return Err(wrong("another fence"));
        }
        if rb.row_count != 1 {
            return Err(wrong(&format!("the update reported {} rows", rb.row_count)));
        }
    }
    if lease.payload != payload {
        return Err(wrong("another payload"));
    }
    if lease.renewed_at != rb.at {
        return Err(wrong("a renewal instant that is not this call's"));
    }
    if lease.expires_at <= lease.now {
        return Err(wrong("an expiry that is not in the future"));
    }
    let granted = Duration::from_micros(ttl_micros(ttl) as u64);
    if lease.expires_at.saturating_duration_since(lease.renewed_at) < granted {
        return Err(wrong("an expiry short of the TTL asked for"));
    }
    if lease.renewed_at > lease.now || lease.acquired_at > lease.renewed_at {
        return Err(wrong("instants out of order"));
    }
    if !rb.committed {
        return Err(StoreError::retryable(format!(
            "mysql {op}: the write did not commit: a read after its COMMIT does not see it (on a multi-primary \
             cluster, another node's conflicting write won); not written"
        )));
    }
    lease.now = lease.renewed_at;
    Ok(lease)
}

/// Whether a server error code needs a person rather than fixing itself.
/// `state` is the SQLSTATE the server sent with it.
pub(crate) fn code_kind(code: u16, state: &str) -> ErrorKind {
    match code {
        // Access denied (database, login, table, column, needs a privilege),
        // unknown database, no such table, unknown column, syntax, an
        // account that must change its password or is locked, a client that
        // cannot do the account's authentication, a packet larger than the
        // server accepts, data the column cannot hold, host blocked, a
        // CHECK constraint someone added (MySQL 3819, MariaDB 4025).
        1044 | 1045 | 1049 | 1146 | 1142 | 1143 | 1227 | 1054 | 1064 | 1149 | 1251 | 1698 | 1820 | 1862 | 3118
        | 4151 | 1153 | 1406 | 1366 | 1129 | 1370 | 1356 | 3819 | 4025 => ErrorKind::Fatal,
        // Settings and names the server will never take, whatever the
        // SQLSTATE (most are HY000): an unknown system variable, one that
        // is global or session only or read-only, a value or type it cannot
        // have, a string that is not valid in its character set (a table
        // name the server cannot store), and a binlog format that refuses
        // the statement.
        1193 | 1228 | 1229 | 1231 | 1232 | 1238 | 1300 | 1665 => ErrorKind::Fatal,
        // Too many connections, server shutting down, lock wait timeout,
        // deadlock, read-only server or transaction, server gone away, lost
        // connection, connection killed, query interrupted or over its time
        // limit, network read/write errors, aborted or idle-disconnected
        // connections, user connection limits, offline mode.
        1040 | 1053 | 1205 | 1213 | 1290 | 1792 | 1836 | 2006 | 2013 | 1927 | 1317 | 1969 | 3024 | 1158 | 1159
        | 1160 | 1161 | 1152 | 1184 | 4031 | 1203 | 1226 | 3032 | 1637 | 1180 | 1181 | 1043 => ErrorKind::Retryable,
        _ => match state.get(..2).unwrap_or("") {
            // Syntax or access rule, authorization, invalid catalog name,
            // data exception (a value the column cannot take), integrity
            // constraint, feature not supported: the same call fails the
            // same way every time.
            "42" | "28" | "3D" | "22" | "23" | "0A" => ErrorKind::Fatal,
            _ => ErrorKind::Retryable,
        },
    }
}

/// The server errors after which retrying on another connection is safe
/// and useful: the session was gone, or the transaction was rolled back.
pub(crate) fn code_retries(code: u16) -> bool {
    matches!(code, 2006 | 2013 | 1927 | 1053 | 4031 | 1213 | 1152 | 1184)
}

/// A store error from a driver error, keeping the server's code, SQLSTATE
/// and message. Never includes connection options (so no password).
/// ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION.
const READ_ONLY_TRANSACTION: u16 = 1792;

pub(crate) fn classify(op: &str, e: &mysql::Error) -> StoreError {
    use mysql::{DriverError, Error};
    match e {
        Error::MySqlError(m) => {
            let mut message = format!("mysql {op}: server error {} ({}): {}", m.code, m.state, m.message);
            if m.code == READ_ONLY_TRANSACTION {
                // Every write's transaction is read-only exactly when the
                // server is (see `BEGIN`).
                message.push_str(
                    " (the server is read-only: read_only or super_read_only is on; writes wait until it is off)",
                );
            }
            match code_kind(m.code, &m.state) {
                ErrorKind::Fatal => StoreError::fatal(message),
                _ => StoreError::retryable(message),
            }
        }
        Error::DriverError(d) => {
            let message = format!("mysql {op}: {d}");
            match d {
                DriverError::TlsNotSupported => {
                    StoreError::fatal(format!("mysql {op}: TLS was asked for and the server does not support it"))
                }
                DriverError::UnknownAuthPlugin(_)
                | DriverError::PacketTooLarge
                | DriverError::OldMysqlPasswordDisabled
                | DriverError::CleartextPluginDisabled
                | DriverError::Protocol41NotSet
                | DriverError::UnsupportedProtocol(_) => StoreError::fatal(message),
                _ => StoreError::retryable(message),
            }
        }
        // The handshake ran into the socket's read timeout: a server or a
        // path too slow to answer, not a certificate.
        Error::TlsError(mysql::error::tls::TlsError::TlsHandshakeError(native_tls::HandshakeError::WouldBlock(_))) => {
            StoreError::retryable(format!("mysql {op}: the TLS handshake got no answer within the socket timeout"))
        }
        Error::TlsError(t) => {
            let text = crate::error::chain_text(t);
            // By cause: I/O during the handshake (reset, timeout) may fix
            // itself; a certificate that does not verify, or no common
            // protocol, needs a person.
            let io = {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(t);
                let mut io = false;
                while let Some(c) = cause {
                    if c.downcast_ref::<std::io::Error>().is_some() {
                        io = true;
                    }
                    cause = c.source();
                }
                io
            };
            let verification = text.contains("certificate") || text.contains("verify");
            let lower = text.to_ascii_lowercase();
            let cut = lower.contains("eof") || lower.contains("reset") || lower.contains("broken pipe");
            if (io || cut) && !verification {
                StoreError::retryable(format!("mysql {op}: I/O error during the TLS handshake: {text}"))
            } else {
                StoreError::fatal(format!("mysql {op}: TLS handshake failed: {text}"))
            }
        }
        _ if is_timeout(e) => StoreError::retryable(format!(
            "mysql {op}: no answer within the socket timeout; the connection is dropped and its session ended"
        )),
        Error::IoError(io) => StoreError::retryable(format!("mysql {op}: connection error: {io}")),
        Error::CodecError(c) => StoreError::retryable(format!("mysql {op}: connection error: {c}")),
        Error::UrlError(u) => {
            StoreError::fatal(format!("mysql {op}: invalid connection URL: {}", super::url::redact(&u.to_string())))
        }
        Error::FromValueError(_) | Error::FromRowError(_) => {
            StoreError::fatal(format!("mysql {op}: cannot read the lease row"))
        }
    }
}

/// Whether `e` may be a packet over `max_allowed_packet`: the driver
/// refuses such a statement before sending it (and such a reply), as a
/// codec error with no I/O under it. Whether it was is then measured: see
/// [`too_large`].
pub(crate) fn may_be_too_large(e: &mysql::Error) -> bool {
    matches!(e, mysql::Error::CodecError(c) if std::error::Error::source(c).is_none())
}

/// The fatal error for a statement of `len` bytes that the server's (or
/// the URL's) `max_allowed_packet` of `limit` bytes cannot take. It names
/// both sizes and the setting, and never retries: the same statement
/// fails the same way every time.
pub(crate) fn too_large(op: &str, len: usize, limit: u64) -> StoreError {
    StoreError::fatal(format!(
        "mysql {op}: the statement is {len} bytes, more than max_allowed_packet ({limit} bytes); raise \
         max_allowed_packet on the server (and in the URL, if set there) or publish a smaller payload"
    ))
}

/// A socket read or write that ran out of time: the server or the path is
/// slow, and another connection would only add load.
fn timed_out(io: &std::io::Error) -> bool {
    matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// Whether `e` is a socket read or write that ran out of time, after which
/// the statement may still be running on the server.
pub(crate) fn is_timeout(e: &mysql::Error) -> bool {
    match e {
        mysql::Error::IoError(io) => timed_out(io),
        mysql::Error::CodecError(c) => {
            std::error::Error::source(c).and_then(|s| s.downcast_ref()).is_some_and(timed_out)
        }
        _ => false,
    }
}

/// Whether the connection is surely unusable after `e`, and another
/// connection may well succeed.
pub(crate) fn retry_elsewhere(e: &mysql::Error) -> bool {
    match e {
        mysql::Error::MySqlError(m) => code_retries(m.code),
        mysql::Error::IoError(io) => !timed_out(io),
        mysql::Error::CodecError(c) => match std::error::Error::source(c).and_then(|s| s.downcast_ref()) {
            Some(io) => !timed_out(io),
            None => true,
        },
        _ => false,
    }
}

/// After a claim, in its transaction: the terms row of each election
/// `where_` names that this call claimed a new term of (the row names
/// `identity` and was acquired at this call's instant) is replaced by that
/// term's. Elections this call did not claim are not touched: a holder's
/// acquire of its own lease writes nothing here, so it never meets its own
/// checks.
pub(crate) fn claim_terms(terms: &str, table: &str, where_: &str, identity: &str) -> String {
    format!(
        "REPLACE INTO {terms} (name, fence, holder, checks) SELECT name, fence, holder, 0 FROM {table} {BY_KEY} \
         WHERE {where_} AND CAST(holder AS BINARY) = {identity} AND acquired_at = {AT} AND renewed_at = {AT};"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        for fatal in
            [(1146, "42S02"), (1045, "28000"), (1049, "42000"), (1142, "42000"), (1044, "42000"), (1054, "42S22")]
        {
            assert_eq!(code_kind(fatal.0, fatal.1), ErrorKind::Fatal, "{fatal:?}");
        }
        for retry in [
            (1040, "08004"),
            (1053, "08S01"),
            (1205, "HY000"),
            (1213, "40001"),
            (1290, "HY000"),
            (1792, "25006"),
            (1836, "HY000"),
            (2006, "HY000"),
            (2013, "HY000"),
            (1927, "70100"),
            (9999, "HY000"),
        ] {
            assert_eq!(code_kind(retry.0, retry.1), ErrorKind::Retryable, "{retry:?}");
        }
        assert_eq!(code_kind(9999, "42000"), ErrorKind::Fatal, "an unknown code in the access-rule class");
        // Permanent HY000s: an unknown variable, a value it cannot take, a
        // name invalid in its character set, a binlog format that refuses
        // the statement.
        for hy in [1193, 1231, 1232, 1238, 1300, 1665] {
            assert_eq!(code_kind(hy, "HY000"), ErrorKind::Fatal, "{hy}");
        }
        // Data the table cannot take (a column narrower than this store's
        // schema, a constraint someone added): the same call fails the same
        // way every time, so a person must look.
        for data in [(1264, "22003"), (1292, "22007"), (4025, "23000"), (3819, "HY000"), (1048, "23000")] {
            assert_eq!(code_kind(data.0, data.1), ErrorKind::Fatal, "{data:?}");
        }
    }

    /// The no-op assignment that carries each server's read-only switch is
    /// of the call's own instant variable, and every write starts with it.
    #[test]
    fn a_write_is_read_only_exactly_when_the_server_is() {
        assert!(BEGIN.contains(&format!("SET {AT} = {AT} /*M!100000 , @@tx_read_only = @@global.read_only */")));
        assert!(BEGIN.contains("/*!80003 , @@transaction_read_only = @@global.read_only */; START TRANSACTION;"));
        assert!(!BEGIN.contains("READ WRITE") && BEGIN_OVERRIDING_READ_ONLY.contains("READ WRITE"));
        let m = mysql::Error::MySqlError(mysql::MySqlError {
            state: "25006".into(),
            code: 1792,
            message: "Cannot execute statement in a READ ONLY transaction".into(),
        });
        let e = classify("renew", &m);
        assert!(e.is_retryable() && e.to_string().contains("read_only or super_read_only is on"), "{e}");
    }

    #[test]
    fn hex_literals_hold_any_bytes() {
        assert_eq!(hex(b""), "X''");
        assert_eq!(hex(b"'\\\0`"), "X'275c0060'");
        let all: Vec<u8> = (0..=255).collect();
        let h = hex(&all);
        assert!(h.len() == 512 + 3 && h[2..514].bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn names_longer_than_the_column_are_refused() {
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let e = acquire("`t`", &long, "a", Duration::from_secs(1), b"", true, None, Duration::ZERO, true).unwrap_err();
        assert!(e.is_fatal() && e.to_string().contains("election name"), "{e}");
        assert!(renew("`t`", "n", &"i".repeat(MAX_IDENTITY_LEN + 1), 1, Duration::from_secs(1), b"", true).is_err());
        assert!(acquire(
            "`t`",
            &"n".repeat(MAX_NAME_LEN),
            "a",
            Duration::from_secs(1),
            b"",
            true,
            None,
            Duration::ZERO,
            true
        )
        .is_ok());
    }

    #[test]
    fn lock_waits_stay_inside_the_deadline_and_are_reset() {
        assert_eq!(lock_wait_secs(Duration::from_millis(500)), 1);
        assert_eq!(lock_wait_secs(Duration::from_secs(4)), 3);
        assert_eq!(lock_wait_secs(Duration::MAX), 64_800);
        let q = pinned("SELECT 1;", Duration::from_secs(8));
        assert!(q.starts_with("SET SESSION timestamp = DEFAULT, sql_mode = 'STRICT_ALL_TABLES,"), "{q}");
        assert!(q.contains("innodb_lock_wait_timeout = 6, lock_wait_timeout = 6; SET @leaderelection_now = "), "{q}");
        assert!(q.contains("; SELECT 1; SET SESSION sql_mode = DEFAULT"), "{q}");
        assert!(q.ends_with(
            "@leaderelection_now = NULL, @leaderelection_payload = NULL, @leaderelection_held = NULL, \
         @leaderelection_inherited = NULL, @leaderelection_claimable = NULL, @leaderelection_history = NULL"
        ));
        // A claim counts a row expired `skew` after its expiry.
        let q = acquire("`t`", "n", "a", Duration::from_secs(1), b"", true, None, Duration::from_millis(4500), true)
            .unwrap();
        assert!(q.contains("SET @leaderelection_claimable = @leaderelection_now - 4500000;"), "{q}");
        assert!(q.contains("expires_at <= @leaderelection_claimable"), "{q}");
        assert!(!q.contains("expires_at <= @leaderelection_now"), "a claim condition on the bare instant: {q}");
    }

    /// Every write commits with `COMMIT AND NO CHAIN NO RELEASE` (never a
    /// plain `COMMIT`, which `completion_type` can turn into a disconnect)
    /// and sends the payload once.
    #[test]
    fn a_checked_write_is_the_unchecked_one_then_the_read_of_what_it_committed() {
        let t = Duration::from_secs(1);
        let slot = |check| claim_slot("`t`", "`t_slots`", "n", "a", 7, "s", false, check).unwrap();
        for (checked, plain) in [
            (
                acquire("`t`", "n", "a", t, b"p", true, None, Duration::ZERO, true).unwrap(),
                acquire("`t`", "n", "a", t, b"p", true, None, Duration::ZERO, false).unwrap(),
            ),
            (renew("`t`", "n", "a", 7, t, b"p", true).unwrap(), renew("`t`", "n", "a", 7, t, b"p", false).unwrap()),
            (slot(true), slot(false)),
        ] {
            assert!(!plain.contains("'committed'") && !plain.contains(READ_BEGIN), "{plain}");
            assert_eq!(plain.matches("START TRANSACTION").count(), 1, "{plain}");
            let read = checked.strip_prefix(plain.trim_end()).expect("the plain write first").trim();
            assert!(read.starts_with(READ_BEGIN) && read.contains("SELECT 'committed', COUNT(*)"), "{read}");
            assert!(read.ends_with(COMMIT), "{read}");
        }
    }

    #[test]
    fn writes_commit_without_release_and_send_the_payload_once() {
        let payload = b"a payload of some length";
        let t = Duration::from_secs(1);
        for q in [
            acquire("`t`", "n", "a", t, payload, true, None, Duration::ZERO, true).unwrap(),
            acquire("`t`", "n", "a", t, payload, true, None, Duration::ZERO, false).unwrap(),
            renew("`t`", "n", "a", 7, t, payload, true).unwrap(),
            renew("`t`", "n", "a", 7, t, payload, false).unwrap(),
            release("`t`", "n", "a", 7).unwrap(),
            inspect("`t`", "n").unwrap(),
        ] {
            // One COMMIT per transaction (a checked claim or renewal has
            // two: the read after the first that sees whether it took),
            // never a plain one.
            assert_eq!(q.matches("COMMIT").count(), q.matches("START TRANSACTION").count(), "{q}");
            assert_eq!(q.matches("COMMIT").count(), q.matches("COMMIT AND NO CHAIN NO RELEASE;").count(), "{q}");
            assert!(q.matches(&hex(payload)).count() <= 1, "{q}");
        }
    }

    /// The assignments of the claim's `ON DUPLICATE KEY UPDATE`, as
    /// (column, expression).
    fn assignments(q: &str) -> Vec<(String, String)> {
        let from = q.find("ON DUPLICATE KEY UPDATE").unwrap() + 23;
        let update = &q[from..from + q[from..].find("; SELECT").unwrap()];
        let mut out = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (k, c) in update.char_indices().chain([(update.len(), ',')]) {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    let (col, expr) = update[start..k].split_once('=').unwrap();
                    out.push((col.trim().to_owned(), expr.trim().to_owned()));
                    start = k + 1;
                }
                _ => {}
            }
        }
        out
    }

    /// Whether `expr` names `column` as a whole word.
    fn mentions(expr: &str, column: &str) -> bool {
        expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == column)
    }

    /// The shape that makes the claim mean the same under left-to-right and
    /// simultaneous assignment (see [`acquire`]): no assignment reads a
    /// column assigned before it, except the last, `expires_at`, which may
    /// read `holder` and `renewed_at` (whose new values give its condition
    /// the same value as their old ones). The real proof runs on MariaDB in
    /// both modes (tests/storetest_mysql.rs); this keeps the shape.
    fn reads_only_the_old_row(assigned: &[(String, String)]) -> Result<(), String> {
        let last = assigned.len() - 1;
        if assigned[last].0 != "expires_at" {
            return Err(format!("expires_at is not assigned last: {assigned:?}"));
        }
        for (j, (col, expr)) in assigned.iter().enumerate() {
            for (earlier, _) in &assigned[..j] {
                let allowed = j == last && (earlier == "holder" || earlier == "renewed_at");
                if mentions(expr, earlier) && !allowed {
                    return Err(format!("{col} reads {earlier}, which is assigned before it"));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_claim_reads_only_the_old_row_whatever_the_assignment_order() {
        let q = acquire("`t`", "n", "a", Duration::from_secs(1), b"", true, None, Duration::ZERO, true).unwrap();
        let assigned = assignments(&q);
        let cols: Vec<&str> = assigned.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(cols, ["fence", "acquired_at", "terms", "payload", "renewed_at", "holder", "expires_at"]);
        reads_only_the_old_row(&assigned).unwrap();
        // Every condition names the row (a hand-made table with a
        // case-insensitive collation could match another election's).
        for (col, expr) in &assigned {
            assert!(expr.contains("CAST(name AS BINARY) = X'6e'"), "{col}: {expr}");
        }
        // The negative control: the claim as it was, which relied on
        // `holder` being assigned first and seen by the rest. Under
        // SIMULTANEOUS_ASSIGNMENT it set `holder` and kept the old fence
        // and expiry (three leaders on one fence, measured).
        let old = "ON DUPLICATE KEY UPDATE \
           holder = IF(expires_at <= N, X'61', holder), \
           fence = IF(holder = X'61' AND expires_at <= N, GREATEST(fence + 1, N), fence), \
           acquired_at = IF(holder = X'61' AND expires_at <= N, N, acquired_at), \
           terms = IF(holder = X'61' AND expires_at <= N, terms + 1, terms), \
           renewed_at = IF(holder = X'61', N, renewed_at), \
           payload = IF(holder = X'61', X'', payload), \
           expires_at = IF(holder = X'61', GREATEST(expires_at, N + 1), expires_at); SELECT";
        let e = reads_only_the_old_row(&assignments(old)).unwrap_err();
        assert!(e.contains("fence reads holder"), "{e}");
    }

    /// The batched claim (`acquire_many`) writes with the same assignments:
    /// its `INSERT … ON DUPLICATE KEY UPDATE` for names without a row, and
    /// its `UPDATE` of existing rows (which names its rows byte for byte in
    /// its `WHERE`, so its condition on the name is TRUE).
    #[test]
    fn the_batched_claims_read_only_the_old_row_too() {
        for (ours, payload) in [("CAST(name AS BINARY) = VALUES(name)", "VALUES(payload)"), ("TRUE", "v.p")] {
            let q = format!("{} ; SELECT", claim_update(ours, "NOT FALSE", "X'61'", 5, payload));
            let assigned = assignments(&q);
            let cols: Vec<&str> = assigned.iter().map(|(c, _)| c.as_str()).collect();
            assert_eq!(cols, ["fence", "acquired_at", "terms", "payload", "renewed_at", "holder", "expires_at"]);
            reads_only_the_old_row(&assigned).unwrap();
            for (col, expr) in &assigned {
                assert!(expr.contains(ours), "{col}: {expr}");
            }
        }
    }

    #[test]
    fn member_statements_write_only_from_the_old_row_and_name_exact_bytes() {
        let hb = heartbeat("`t_members`", "g'1", "m\\1", 42, Duration::from_secs(5)).unwrap();
        assert!(hb.contains("expires_at = IF(CAST(group_name AS BINARY) = X'672731' AND CAST(member AS BINARY) = X'6d5c31' AND leads >= 0, GREATEST(expires_at, @leaderelection_now + 5000000), expires_at)"), "{hb}");
        assert!(
            hb.contains(
                "leads = IF(CAST(group_name AS BINARY) = X'672731' AND CAST(member AS BINARY) = X'6d5c31' AND leads >= 0, 42, leads)"
            ),
            "{hb}"
        );
        // Its statements only: the caller's transaction holds them.
        assert!(!hb.contains("COMMIT") && !hb.contains("START TRANSACTION"), "{hb}");
        assert!(heartbeat("`t`", &"g".repeat(MAX_NAME_LEN + 1), "m", 0, Duration::from_secs(1)).is_err());
        assert!(leave_group("`t`", "g", &"m".repeat(MAX_IDENTITY_LEN + 1)).is_err());
        // A leave is a tombstone a later heartbeat leaves alone (leads -1).
        let l = leave_group("`t`", "g", "m").unwrap();
        assert!(l.contains("VALUES (X'67', X'6d', @leaderelection_now, -1)") && l.contains("leads = IF("), "{l}");
        let f = forget_members("`t`", "g").unwrap();
        assert!(f.contains("expires_at < @leaderelection_now - 3600000000"), "{f}");
    }

    /// A lease row as the server sends it: text protocol, so every value is
    /// bytes. `times` are acquired_at, renewed_at, expires_at, the call's
    /// instant and the clock as the row was read.
    fn row(name: &str, holder: &str, fence: i64, times: [i64; 5], payload: &[u8], count: i64) -> Vec<Value> {
        let n = |v: i64| Value::Bytes(v.to_string().into_bytes());
        vec![
            Value::Bytes(name.into()),
            Value::Bytes(holder.into()),
            n(fence),
            n(times[0]),
            n(times[1]),
            n(times[2]),
            Value::Bytes(payload.to_vec()),
            n(times[3]),
            n(count),
            n(times[4]),
        ]
    }

    const T0: i64 = 1_700_000_000_000_000;
    const TIMES: [i64; 5] = [T0, T0 + 10, T0 + 10 + 5_000_000, T0 + 10, T0 + 20];

    #[test]
    fn rows_are_read_back_from_any_integer_form_and_checked() {
        assert!(read_back("inspect", "e", vec![vec![Value::Int(1)], vec![]]).unwrap().is_none(), "no lease row");
        let rb = read_back("inspect", "e", vec![vec![], row("e", "a", 7, TIMES, b"p", 1)]).unwrap().unwrap();
        assert_eq!((rb.lease.holder.as_str(), rb.lease.fence, rb.row_count), ("a", 7, 1));
        assert_eq!(rb.lease.now.as_unix_micros(), TIMES[4], "now is the clock as the row was read");
        assert_eq!(rb.at.as_unix_micros(), TIMES[3]);
        let mut typed = row("e", "a", 7, TIMES, b"", 0);
        typed[2] = Value::Int(7);
        typed[3] = Value::UInt(T0 as u64);
        assert_eq!(read_back("x", "e", vec![typed]).unwrap().unwrap().lease.acquired_at.as_unix_micros(), T0);
        let broken = |i: usize, v: Value| {
            let mut r = row("e", "a", 7, TIMES, b"", 0);
            r[i] = v;
            read_back("acquire", "e", vec![r]).unwrap_err()
        };
        for (i, v, what) in [
            (0, Value::NULL, "not a byte string"),
            (1, Value::Bytes(vec![0xff]), "not UTF-8"),
            (2, Value::Bytes(b"0".to_vec()), "fence not positive"),
            (2, Value::Bytes(b"-3".to_vec()), "fence not positive"),
            (3, Value::Bytes(b"soon".to_vec()), "not an integer"),
            (4, Value::UInt(u64::MAX), "out of range"),
            (5, Value::Double(1.0), "not an integer"),
            (9, Value::NULL, "not an integer"),
        ] {
            let e = broken(i, v);
            assert!(e.is_fatal() && e.to_string().contains(what), "column {i}: {e}");
        }
        let two = read_back("x", "e", vec![row("e", "a", 1, TIMES, b"", 0), row("e", "b", 2, TIMES, b"", 0)]);
        assert!(two.unwrap_err().to_string().contains("more than one row"));
        let other = read_back("inspect", "e", vec![row("f", "a", 1, TIMES, b"", 0)]).unwrap_err();
        assert!(other.is_fatal() && other.to_string().contains("another election"), "{other}");
    }

    #[test]
    fn a_written_row_must_be_what_was_asked_for() {
        let ttl = Duration::from_secs(5);
        let seen = || vec![Value::Bytes(b"committed".to_vec()), Value::Int(1)];
        let rb = |r: Vec<Value>| read_back("renew", "e", vec![r, seen()]).unwrap().unwrap();
        let ok = check_written("renew", rb(row("e", "a", 7, TIMES, b"p", 1)), "a", ttl, b"p", Some(7)).unwrap();
        assert_eq!(ok.now, ok.renewed_at, "now is the writing statement's");
        assert!(check_written("acquire", rb(row("e", "a", 7, TIMES, b"p", 0)), "a", ttl, b"p", None).is_ok());
        const S: i64 = 1_000_000;
        // (row read back, identity, payload, fence asked for, what is wrong)
        type Case = (Vec<Value>, &'static str, &'static [u8], Option<u64>, &'static str);
        let cases: [Case; 10] = [
            (row("e", "b", 7, TIMES, b"p", 1), "a", b"p", Some(7), "another holder"),
            (row("e", "a", 8, TIMES, b"p", 1), "a", b"p", Some(7), "another fence"),
            (row("e", "a", 7, TIMES, b"p", 2), "a", b"p", Some(7), "reported 2 rows"),
            (row("e", "a", 7, TIMES, b"q", 1), "a", b"p", Some(7), "another payload"),
            (row("e", "a", 7, [T0, T0, T0 + 5 * S - 1, T0, T0 + 1], b"p", 1), "a", b"p", Some(7), "short of the TTL"),
            (
                row("e", "a", 7, [T0, T0 + 10, T0 + 5 * S, T0 + 30, T0 + 40], b"p", 1),
                "a",
                b"p",
                None,
                "not this call's",
            ),
            (
                row("e", "a", 7, [T0, T0 + 10, T0 + 5 * S, T0 + 10, T0 + 5 * S], b"p", 1),
                "a",
                b"p",
                None,
                "not in the future",
            ),
            (
                row("e", "a", 7, [T0, T0 + 30, T0 + 5 * S + 30, T0 + 30, T0 + 20], b"p", 1),
                "a",
                b"p",
                Some(7),
                "out of order",
            ),
            (
                row("e", "a", 7, [T0 + 11, T0 + 10, T0 + 5 * S + 10, T0 + 10, T0 + 20], b"p", 1),
                "a",
                b"p",
                None,
                "out of order",
            ),
            // What the old claim left under SIMULTANEOUS_ASSIGNMENT: this
            // holder on the dead leader's fence, with its old instants.
            (
                row("e", "a", 7, [T0 - 60 * S, T0 - 20 * S, T0 - S, T0, T0 + 5], b"p", 2),
                "a",
                b"p",
                None,
                "not this call's",
            ),
        ];
        for (r, id, p, fence, what) in cases {
            let e = check_written("renew", rb(r), id, ttl, p, fence).unwrap_err();
            assert!(e.is_retryable() && e.to_string().contains(what), "{what}: {e}");
            assert!(e.to_string().contains("not the one written"), "{e}");
        }
        // Everything as written, but a read after the COMMIT did not see it
        // (a count of 0, or no such read at all): not written.
        let unseen = vec![Value::Bytes(b"committed".to_vec()), Value::Int(0)];
        for rows in [vec![row("e", "a", 7, TIMES, b"p", 1), unseen], vec![row("e", "a", 7, TIMES, b"p", 1)]] {
            let rb = read_back("renew", "e", rows).unwrap().unwrap();
            let e = check_written("renew", rb, "a", ttl, b"p", Some(7)).unwrap_err();
            assert!(e.is_retryable() && e.to_string().contains("did not commit"), "{e}");
        }
    }

    #[test]
    fn driver_errors_are_classified_by_cause() {
        use mysql::{DriverError, Error, MySqlError};
        let server =
            |code, state: &str| Error::MySqlError(MySqlError { state: state.into(), message: "m".into(), code });
        let io = |kind| Error::IoError(std::io::Error::new(kind, "x"));
        let codec = |kind| Error::CodecError(std::io::Error::new(kind, "x").into());
        let fatal = [
            Error::DriverError(DriverError::UnknownAuthPlugin("x".into())),
            Error::DriverError(DriverError::TlsNotSupported),
            Error::DriverError(DriverError::PacketTooLarge),
            Error::UrlError(mysql::UrlError::UnknownParameter("x".into())),
            Error::FromValueError(Value::NULL),
            server(1146, "42S02"),
        ];
        for e in &fatal {
            assert!(classify("op", e).is_fatal(), "{e:?}");
            assert!(!retry_elsewhere(e) || matches!(e, Error::MySqlError(_)), "{e:?}");
        }
        assert!(classify("op", &Error::DriverError(DriverError::TlsNotSupported))
            .to_string()
            .contains("does not support"));
        let retryable = [
            Error::DriverError(DriverError::ConnectTimeout),
            io(std::io::ErrorKind::ConnectionReset),
            codec(std::io::ErrorKind::WouldBlock),
            server(1205, "HY000"),
        ];
        for e in &retryable {
            assert!(classify("op", e).is_retryable(), "{e:?}");
        }
        // Another connection helps when this one surely broke, not when the
        // server or the path is only slow (a read that timed out).
        assert!(retry_elsewhere(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(retry_elsewhere(&codec(std::io::ErrorKind::UnexpectedEof)));
        assert!(!retry_elsewhere(&io(std::io::ErrorKind::TimedOut)));
        assert!(!retry_elsewhere(&codec(std::io::ErrorKind::WouldBlock)));
        assert!(retry_elsewhere(&server(1213, "40001")) && !retry_elsewhere(&server(1205, "HY000")));
        assert!(!retry_elsewhere(&Error::DriverError(DriverError::ConnectTimeout)));
        // A socket timeout: the statement may still run on the server.
        assert!(is_timeout(&io(std::io::ErrorKind::TimedOut)) && is_timeout(&codec(std::io::ErrorKind::WouldBlock)));
        assert!(!is_timeout(&io(std::io::ErrorKind::ConnectionReset)) && !is_timeout(&server(1205, "HY000")));
        assert!(classify("renew", &codec(std::io::ErrorKind::WouldBlock)).to_string().contains("socket timeout"));
        // A codec error over I/O is the connection, never the packet limit;
        // the limit's error names the setting and both sizes, and is fatal.
        assert!(!may_be_too_large(&codec(std::io::ErrorKind::WouldBlock)) && !may_be_too_large(&server(1153, "08S01")));
        let big = too_large("acquire", 140_001, 65_536);
        assert!(big.is_fatal() && big.to_string().contains("140001 bytes, more than max_allowed_packet (65536 bytes)"));
        let eof = classify("renew", &codec(std::io::ErrorKind::UnexpectedEof));
        assert!(eof.is_retryable() && eof.to_string().contains("connection error"), "{eof}");
    }

    #[test]
    fn error_chains_name_each_new_cause_once() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E("handshake: bad cert", Some(Box::new(E("bad cert", Some(Box::new(E("expired", None)))))));
        assert_eq!(crate::error::chain_text(&e), "handshake: bad cert: expired");
    }
}
