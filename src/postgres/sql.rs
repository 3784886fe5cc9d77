//! The statements, their literals, and error classification.
//!
//! Statements go out with the simple-query protocol, so values are written
//! as literals: strings as `E'…'` with `'` and `\` escaped (correct whatever
//! `standard_conforming_strings` says), bytes as hex, numbers formatted from
//! integers. Identifiers come already quoted by `ident::quote_postgres`.
//! Every instant comes back as microseconds since the epoch on the server's
//! clock, read by the same statement as `now()`.

use std::time::Duration;

use tokio_postgres::{SimpleQueryMessage, SimpleQueryRow};

use crate::batch::BatchItem;
use crate::lease::{DbTime, Lease};
use crate::store::{ErrorKind, StoreError};

/// Longest TTL written, so `now() + ttl` stays far inside PostgreSQL's range.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Microseconds since the epoch of a `timestamptz` expression, exactly:
/// `extract` yields `numeric` from PostgreSQL 14 on (exact), `double` before
/// (within a fraction of a microsecond at today's dates), and the cast to
/// `int8` rounds to the nearest integer in both cases.
macro_rules! micros {
    ($e:literal) => {
        concat!("(extract(epoch from ", $e, ") * 1000000)::int8")
    };
}

/// The server's `now()` in microseconds: a fresh claim's fence candidate.
const NOW_MICROS: &str = micros!("now()");

/// The history of the server answering, `system/timeline/start`: its
/// `system_identifier` (set by `initdb`, kept by its standbys and copies),
/// its timeline (the first eight hex digits of the current WAL file's name;
/// promoting a standby or a point-in-time recovery starts a new one) and
/// when its postmaster started, in microseconds. Every write stamps its row
/// with it (`history`), and a row whose stamp differs was written by
/// another server, or by this one before it last started, and may lack
/// writes that server acknowledged (see [`acquire`]).
///
/// Why all three (issue 34, item 4): a timeline alone is not an identity.
/// Two `initdb` clusters both answer `00000001`, so a logical-replication
/// subscriber's rows (written with the publisher's values) looked native
/// to it; a `pg_basebackup` copy or a restored file-system snapshot keeps
/// both the system identifier and the timeline (crash recovery starts no
/// new one), and only its start tells it from the server it was copied
/// from. A restart of the same server counts as a new history too: its
/// expired rows are held for nobody for a lease before a claim (their
/// holders renew them as before), the price of telling a restore from a
/// restart, which nothing the server reports does.
///
/// One scalar subquery, so each statement reads it once. Callable by any
/// role (`pg_control_system()` included, on PostgreSQL 15), and only on a
/// primary, which is where writes run.
pub(crate) const HISTORY: &str = "(SELECT (SELECT system_identifier::text FROM pg_control_system()) || '/' || \
     substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) || '/' || \
     (extract(epoch from pg_postmaster_start_time()) * 1000000)::int8::text)";

/// [`HISTORY`] as it was before issue 34: the timeline alone. For the
/// negative control only (`PostgresStore::__timeline_only_history`).
pub(crate) const TIMELINE_ONLY_HISTORY: &str = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)";

/// The columns every lease-returning statement yields, in this order.
const COLS: &str = concat!(
    "name, holder, fence::text, ",
    micros!("acquired_at"),
    "::text, ",
    micros!("renewed_at"),
    "::text, ",
    micros!("expires_at"),
    "::text, ",
    micros!("now()"),
    "::text, encode(payload, 'hex')"
);

pub(crate) fn create_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   name        text        PRIMARY KEY,\n\
         \x20   holder      text        NOT NULL,\n\
         \x20   fence       bigint      NOT NULL CHECK (fence > 0),\n\
         \x20   acquired_at timestamptz NOT NULL,\n\
         \x20   renewed_at  timestamptz NOT NULL,\n\
         \x20   expires_at  timestamptz NOT NULL,\n\
         \x20   payload     bytea       NOT NULL DEFAULT ''::bytea,\n\
         \x20   terms       bigint      NOT NULL DEFAULT 0 CHECK (terms >= 0),\n\
         \x20   history     text\n\
         ) WITH (fillfactor = 70);\n"
    )
}

/// The unique index on `(name, fence)` that makes a lease check hold a
/// claim off: a claim changes `fence`, a column of a unique index, so it
/// needs the row lock that a check's `FOR KEY SHARE` blocks, while a
/// renewal changes no indexed column and goes through (and stays a HOT
/// update). `index_name` is quoted (the index lives in the table's
/// schema), `table` quoted and schema-qualified. A plain
/// `CREATE INDEX` (the table has one row per election, so it is built at
/// once), under the caller's lock timeout.
pub(crate) fn create_fence_index(index_name: &str, table: &str) -> String {
    format!("CREATE UNIQUE INDEX IF NOT EXISTS {index_name} ON {table} (name, fence);\n")
}

/// Whether the valid unique index `index_name` (unquoted) of schema
/// `schema` exists: `1` or `0`. A catalog read, so it takes no table lock.
pub(crate) fn has_fence_index(schema: &str, index_name: &str) -> Result<String, StoreError> {
    let (s, i) = (literal("schema", schema)?, literal("index", index_name)?);
    Ok(format!(
        "SELECT count(*)::text FROM pg_catalog.pg_index x \
         JOIN pg_catalog.pg_class c ON c.oid = x.indexrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = {s} AND c.relname = {i} AND x.indisunique AND x.indisvalid"
    ))
}

/// The lease check, with parameters `$1` (the election's name, text), `$2`
/// (the identity, text) and `$3` (the fence, bigint): one row back while
/// this term holds the lease, none otherwise. `FOR KEY SHARE` holds a
/// claim of a new term off until the transaction ends, and lets the
/// holder's renewals through; the expiry is compared with the clock as the
/// check runs (`clock_timestamp()`), not with the transaction's start.
pub(crate) fn lease_check(table: &str) -> String {
    format!(
        "SELECT 1 FROM {table} WHERE name = $1 AND holder = $2 AND fence = $3 \
         AND expires_at > pg_catalog.clock_timestamp() FOR KEY SHARE"
    )
}

/// The lease check with its values written in, as one statement that
/// fails when the term no longer holds the lease (a `DO` block raising
/// SQLSTATE `LE001`, so `psql -v ON_ERROR_STOP=1` stops and the transaction
/// is rolled back), and also when the unique index it needs is missing
/// (`LE002`). Every value is a literal, and the block's dollar quote is one
/// no value contains, so nothing in a name can end it early.
pub(crate) fn lease_check_literal(
    table: &str, schema: &str, index_name: &str, name: &str, identity: &str, fence: u64,
) -> Result<String, StoreError> {
    let (n, i) = (literal("election name", name)?, literal("identity", identity)?);
    let index = has_fence_index(schema, index_name)?;
    let no_index = literal(
        "message",
        &format!("leaderelection: the lease check needs the unique index {index_name} (ensure_schema makes it)"),
    )?;
    let lost = literal(
        "message",
        &format!("leaderelection: the term with fence {fence} no longer holds the lease of {name:?}"),
    )?;
    let body = format!(
        " BEGIN \
           IF ({index}) <> '1' THEN RAISE EXCEPTION USING MESSAGE = {no_index}, ERRCODE = 'LE002'; END IF; \
           PERFORM 1 FROM {table} WHERE name = {n} AND holder = {i} AND fence = {fence} \
             AND expires_at > pg_catalog.clock_timestamp() FOR KEY SHARE; \
           IF NOT FOUND THEN RAISE EXCEPTION USING MESSAGE = {lost}, ERRCODE = 'LE001'; END IF; \
         END "
    );
    let mut tag = String::from("leaderelection");
    while body.contains(&format!("${tag}$")) {
        tag.push('_');
    }
    Ok(format!("DO ${tag}${body}${tag}$;"))
}

/// The table of slots claimed (see [`crate::slot`]): one row per election
/// and slot, with the fence of the term that claimed it, when, and how its
/// run ended (`outcome`, 0 for success; NULL while it runs, or when it was
/// killed before it could say).
pub(crate) fn create_slots(slots: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {slots} (\n\
         \x20   name        text        NOT NULL,\n\
         \x20   slot        text        NOT NULL,\n\
         \x20   fence       bigint      NOT NULL,\n\
         \x20   claimed_at  timestamptz NOT NULL,\n\
         \x20   finished_at timestamptz,\n\
         \x20   outcome     integer,\n\
         \x20   PRIMARY KEY (name, slot)\n\
         );\n"
    )
}

/// Claims `slot` for the term (`identity`, `fence`), if the term holds the
/// lease at the statement's `now()`: one statement that checks the lease
/// and inserts the slot's row (or, with `retry_failed`, takes over the row
/// of an earlier term whose run did not record success), answering one row
/// (how many lease rows matched, how many slot rows it wrote); then, in a
/// statement of its own (a fresh snapshot, so a row a concurrent claim
/// committed meanwhile is seen), the slot's row as it stands: its fence and
/// outcome. The primary key serialises concurrent claims of one slot.
pub(crate) fn claim_slot(
    table: &str, slots: &str, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool,
) -> Result<String, StoreError> {
    let (n, i, sl) = (literal("election name", name)?, literal("identity", identity)?, literal("slot", slot)?);
    Ok(format!(
        "WITH lease AS (\
           SELECT 1 FROM {table} WHERE name = {n} AND holder = {i} AND fence = {fence} \
           AND expires_at > now() AND renewed_at <= now()\
         ), claimed AS (\
           INSERT INTO {slots} AS s (name, slot, fence, claimed_at) SELECT {n}, {sl}, {fence}, now() FROM lease \
           ON CONFLICT (name, slot) DO UPDATE \
             SET fence = excluded.fence, claimed_at = excluded.claimed_at, finished_at = NULL, outcome = NULL \
             WHERE {retry_failed} AND s.fence < excluded.fence AND s.outcome IS DISTINCT FROM 0 \
           RETURNING 1\
         ) \
         SELECT (SELECT count(*) FROM lease)::text, (SELECT count(*) FROM claimed)::text; \
         SELECT fence::text, outcome::text FROM {slots} WHERE name = {n} AND slot = {sl}"
    ))
}

/// Records how the run of `slot` that the term with `fence` claimed ended;
/// a row back when it was still that term's slot.
pub(crate) fn finish_slot(slots: &str, name: &str, fence: u64, slot: &str, outcome: i32) -> Result<String, StoreError> {
    let (n, sl) = (literal("election name", name)?, literal("slot", slot)?);
    Ok(format!(
        "UPDATE {slots} SET finished_at = now(), outcome = {outcome} \
         WHERE name = {n} AND slot = {sl} AND fence = {fence} RETURNING 1::text"
    ))
}

/// Every row among `msgs`, as text columns (`None` for NULL).
pub(crate) fn rows(msgs: &[SimpleQueryMessage]) -> Vec<Vec<Option<&str>>> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|k| r.get(k)).collect()),
            _ => None,
        })
        .collect()
}

/// The statement that gives a table made before the `terms` column existed
/// that column (last, as in [`create_table`], so old and new tables match).
/// Existing rows start at 0: their earlier terms were not counted. Adding a
/// column with a constant default rewrites nothing (PostgreSQL 11 and later).
pub(crate) fn add_terms(table: &str) -> String {
    format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS terms bigint NOT NULL DEFAULT 0 CHECK (terms >= 0)")
}

/// The statement that gives a table made before server histories were
/// recorded the `history` column (last, as in [`create_table`]). Rows start
/// with none (NULL), which counts as this server's until written. No
/// default, so nothing is rewritten.
pub(crate) fn add_history(table: &str) -> String {
    format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS history text")
}

/// How many of the columns added since the first version (`terms`,
/// `history`) `table` (a quoted, qualified name) has, and (`leads`) its
/// members table if it has one: `3` when up to date. A catalog read, so it
/// takes no lock that a renewal could wait on.
pub(crate) fn has_terms(table: &str, members: Option<&str>) -> Result<String, StoreError> {
    let t = literal("table", table)?;
    let m = match members {
        Some(m) => format!(
            "(SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass({}) AND attname = 'leads' \
             AND NOT attisdropped)",
            literal("table", m)?
        ),
        None => "1".to_owned(),
    };
    Ok(format!(
        "SELECT ((SELECT count(*) FROM pg_attribute \
         WHERE attrelid = to_regclass({t}) AND attname IN ('terms', 'history') AND NOT attisdropped) + {m})::text"
    ))
}

/// The statement that gives a members table made before members reported
/// what they lead the `leads` column. A constant default: no rewrite.
pub(crate) fn add_leading(members: &str) -> String {
    format!("ALTER TABLE {members} ADD COLUMN IF NOT EXISTS leads bigint NOT NULL DEFAULT 0")
}

/// What a call's statement does, for the settings it pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pin {
    /// DDL, sent as it is.
    None,
    /// A read (inspect).
    Read,
    /// A write (acquire, renew, release): a read-write transaction only if
    /// nothing made the session read-only (see [`pinned`]).
    Write,
    /// A write sent again after a read-only default that a session `SET`
    /// left on the connection refused it: read-write whatever that says.
    WriteOverSession,
}

/// Prefixes `body` with what every call pins, so that what a session was
/// left with cannot change what the statement means. Behind PgBouncer in
/// transaction mode a server connection is shared by every client of the
/// pooler, and a session `SET` by any of them stays on it; the
/// connection's startup options and a role's or database's settings apply
/// too. So, for this one transaction (`SET LOCAL`): `search_path` is
/// `pg_catalog` (a function or operator of the same name in another
/// schema, such as a test suite's `now()`, must not be called instead; the
/// table is always schema-qualified), the isolation is `READ COMMITTED` (a
/// claim that meets a concurrent one then waits and re-reads the row
/// instead of failing with a serialization error), and the server gives up
/// on a lock wait (55P03) or a long statement (57014) a little inside
/// `remaining`, before the client drops the connection.
///
/// A write leaves `default_transaction_read_only` alone: set on the
/// server, the database or the role (or in the store's own connection
/// options), it is how an operator fences a server, and the write fails
/// (25006, retryable). Only a default that a session `SET` left on the
/// connection (another client of a pooler's shared server connection) is
/// overridden, and only once the store has seen that this is what made
/// the write fail ([`Pin::WriteOverSession`], see
/// `PostgresStore::run`). A write's session `synchronous_commit` goes
/// back to what the server, database, role or connection configured (a
/// leaked `off` would let a crash lose a write the store reported
/// committed; it is read at commit, so the `RESET` applies to this very
/// transaction). Time zone, date and interval styles change nothing here:
/// every instant is read as microseconds since the epoch.
pub(crate) fn pinned(body: &str, remaining: Duration, pin: Pin) -> String {
    let ms = remaining.min(super::MAX_WAIT).as_millis().max(4);
    let lock = (ms * 3 / 4).max(1);
    let stmt = (ms * 7 / 8).max(1);
    let write = match pin {
        Pin::None => return body.to_owned(),
        Pin::Read => "",
        Pin::Write => "RESET synchronous_commit; ",
        Pin::WriteOverSession => "SET LOCAL transaction_read_only = off; RESET synchronous_commit; ",
    };
    // The bounds first: the server arms each statement's timeout with the
    // value in force when it starts, so only this first `SET` runs under a
    // session's own (a 1 ms one, say).
    format!(
        "SET LOCAL statement_timeout = {stmt}; SET LOCAL lock_timeout = {lock}; {write}\
         SET LOCAL search_path = pg_catalog; SET LOCAL transaction_isolation = 'read committed'; {body}"
    )
}

/// A string literal that means `s` whatever `standard_conforming_strings` is.
pub(crate) fn literal(what: &'static str, s: &str) -> Result<String, StoreError> {
    // A NUL is the only thing the quoting refuses.
    crate::ident::quote_postgres_literal(what, s).map_err(|_| {
        StoreError::fatal(format!("postgres: the {what} holds a NUL character, which PostgreSQL text cannot store"))
    })
}

fn bytes(payload: &[u8]) -> String {
    format!("decode('{}', 'hex')", hex(payload))
}

fn interval(ttl: Duration) -> String {
    format!("(interval '1 microsecond' * {})", ttl.min(MAX_TTL).as_micros())
}

pub(crate) fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(DIGITS[usize::from(x >> 4)] as char);
        s.push(DIGITS[usize::from(x & 15)] as char);
    }
    s
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// Claims an absent, expired or own lease; otherwise reads the row as it now
/// stands (`FOR SHARE` follows a concurrent update to its newest version).
/// The holder's own lease is taken again only if it was last written no
/// later than this statement's `now()` (see [`renew`]).
///
/// The fence of a new term is `max(previous + 1, now() in microseconds)`
/// (at least 1 for an absent row), so it is higher than every fence this
/// election handed out before even when the row was deleted or an older
/// copy of it came back, as long as the server clock did not go back. The
/// holder re-acquiring a valid lease keeps its fence, and its expiry never
/// moves backwards: `GREATEST(expires_at, now() + ttl)`.
///
/// `terms` counts the election's terms for operators: 1 for an absent row,
/// one more for each claim of an expired row (under the same condition as
/// the fence), unchanged when the holder re-acquires its valid lease.
///
/// **A row inherited across a failover** (its `history` is not this
/// server's [`HISTORY`]) may lack renewals, or the claim, that the old
/// primary acknowledged. It is never claimed as it stands: while it has
/// not expired nothing changes (its holder may renew it, see [`renew`]);
/// once expired it is held for nobody, in this server's history: the
/// holder becomes `''` (no identity is empty, so nobody can renew or
/// release it), the fence stays, and it expires a whole lease from now
/// (the longer of this caller's and the row's own). A claim is possible
/// only then, when every deadline the old primary's acknowledgements gave
/// has passed. Every `SET` expression reads the old row, so the branches
/// cannot see each other's values. Without `failover_rule` (the failover
/// tests' negative control only) every row counts as this server's, as in
/// a store that knows nothing of server histories.
pub(crate) fn acquire(
    table: &str, name: &str, identity: &str, ttl: Duration, payload: &[u8], failover_rule: bool,
) -> Result<String, StoreError> {
    let (n, i, p, t) = (literal("election name", name)?, literal("identity", identity)?, bytes(payload), interval(ttl));
    let claim = Claim {
        holder: "excluded.holder",
        expires: "excluded.expires_at",
        payload: "excluded.payload",
        history: "excluded.history",
        ttl: &t,
        failover_rule,
    };
    let (set, applies) = (claim.set(), claim.applies());
    Ok(format!(
        "WITH up AS (\
           INSERT INTO {table} AS t (name, holder, fence, acquired_at, renewed_at, expires_at, payload, terms, history) \
           VALUES ({n}, {i}, GREATEST(1, {NOW_MICROS}), now(), now(), now() + {t}, {p}, 1, {HISTORY}) \
           ON CONFLICT (name) DO UPDATE SET {set} \
           WHERE {applies} \
           RETURNING t.name, t.holder, t.fence, t.acquired_at, t.renewed_at, t.expires_at, t.payload\
         ), cur AS (\
           SELECT name, holder, fence, acquired_at, renewed_at, expires_at, payload FROM {table} \
           WHERE name = {n} AND NOT EXISTS (SELECT 1 FROM up) FOR SHARE\
         ) \
         SELECT {COLS} FROM up UNION ALL SELECT {COLS} FROM cur"
    ))
}

/// A claim's decision and its writes on the old row `t`, as SQL, shared by
/// the single claim ([`acquire`], whose new values are its `VALUES` row,
/// `excluded`) and the batched one ([`acquire_many`], whose new values are
/// literals and the item's payload column), so that both decide and write
/// every row alike.
struct Claim<'a> {
    /// The claiming identity.
    holder: &'a str,
    /// `now() + ttl`.
    expires: &'a str,
    /// The payload a claim publishes.
    payload: &'a str,
    /// This server's history ([`HISTORY`]).
    history: &'a str,
    /// The TTL, an interval.
    ttl: &'a str,
    /// See [`acquire`].
    failover_rule: bool,
}

impl Claim<'_> {
    /// Inherited across a failover (a NULL history, from before histories
    /// were recorded, counts as this server's).
    fn inherited(&self) -> String {
        if self.failover_rule {
            format!("COALESCE(t.history <> {}, false)", self.history)
        } else {
            "false".to_owned()
        }
    }

    /// Inherited and expired: held for nobody.
    fn held(&self) -> String {
        format!("({} AND t.expires_at <= now())", self.inherited())
    }

    /// Whether the claim writes the row `t`: held for nobody, or (not
    /// inherited) expired or the claimant's own and not written after
    /// `now()`.
    fn applies(&self) -> String {
        let (inherited, held, i) = (self.inherited(), self.held(), self.holder);
        format!(
            "{held} OR (NOT {inherited} AND (t.expires_at <= now() \
             OR (t.holder = {i} AND t.renewed_at <= now())))"
        )
    }

    /// The `SET` list of the claim's write. Every expression reads the old
    /// row only.
    fn set(&self) -> String {
        let (held, i, e, p, h, t) = (self.held(), self.holder, self.expires, self.payload, self.history, self.ttl);
        format!(
            "holder = CASE WHEN {held} THEN '' ELSE {i} END, \
             fence = CASE WHEN {held} THEN t.fence \
               WHEN t.expires_at <= now() THEN GREATEST(t.fence + 1, {NOW_MICROS}) ELSE t.fence END, \
             acquired_at = CASE WHEN NOT {held} AND t.expires_at <= now() THEN now() ELSE t.acquired_at END, \
             renewed_at = CASE WHEN {held} THEN GREATEST(t.renewed_at, now()) ELSE now() END, \
             expires_at = CASE WHEN {held} THEN GREATEST(t.expires_at, now() + GREATEST({t}, t.expires_at - t.renewed_at)) \
               ELSE GREATEST(t.expires_at, {e}) END, \
             payload = CASE WHEN {held} THEN t.payload ELSE {p} END, \
             terms = CASE WHEN NOT {held} AND t.expires_at <= now() THEN t.terms + 1 ELSE t.terms END, \
             history = {h}"
        )
    }

    /// Whether the claim's write would leave the row `t` exactly as it is:
    /// the claimant's own valid lease, written at this very `now()` with
    /// this payload and an expiry no earlier than `now() + ttl`, in this
    /// history. That is a row the same transaction has just inserted.
    fn changes_nothing(&self) -> String {
        let (i, e, p, h) = (self.holder, self.expires, self.payload, self.history);
        format!(
            "(t.holder = {i} AND t.expires_at > now() AND t.renewed_at = now() AND t.expires_at >= {e} \
             AND t.payload = {p} AND t.history IS NOT DISTINCT FROM {h})"
        )
    }
}

/// Extends the holder's lease; a renewal that commits after a newer one (it
/// waited behind a lock, or the server froze under it) carries an older
/// `now()` and must not shorten the lease: `GREATEST(expires_at, now() + ttl)`.
///
/// `now()` is the transaction's start, read before any lock wait. A renewal
/// that started before the holder's release and waited behind its row lock
/// would still find `expires_at > now()` once the release committed, and
/// extend a released lease by a whole TTL. So a renewal also needs
/// `renewed_at <= now()`: the release moves `renewed_at` up to its own
/// instant, and a renewal whose clock reading is older changes nothing.
///
/// The holder renews a row inherited across a failover expired or not
/// (its renewals since the replica's copy may be lost; nobody else can
/// have claimed it, see [`acquire`]), and the row becomes this server's.
pub(crate) fn renew(
    table: &str, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8],
) -> Result<String, StoreError> {
    let (n, i, p, t) = (literal("election name", name)?, literal("identity", identity)?, bytes(payload), interval(ttl));
    Ok(format!(
        "UPDATE {table} SET renewed_at = now(), expires_at = GREATEST(expires_at, now() + {t}), payload = {p}, \
         history = {HISTORY} \
         WHERE name = {n} AND holder = {i} AND fence = {fence} \
         AND (expires_at > now() OR history <> {HISTORY}) AND renewed_at <= now() \
         RETURNING {COLS}"
    ))
}

/// Ends the term at `now()`; the row and its fence stay. `renewed_at` moves
/// up to that instant too, so that a renewal of the term whose clock
/// reading is older cannot land after it (see [`renew`]). A row inherited
/// across a failover is left alone: the writes the replica lacks may hold
/// a newer term's claim, and ending the lease would let a claim in at
/// once (see [`acquire`]).
/// The notification of a released row, its columns prefixed by `row`:
/// the name, then `listen::FENCE_MARK` (a control character, which no name
/// holds) and the fence, read back by `listen::parse_payload`.
fn notify(notice: &Notice<'_>, row: &str) -> String {
    if notice.quiet {
        return "NULL".into();
    }
    let channel = notice.channel;
    format!("pg_notify('{channel}', {row}name || chr(31) || {row}fence)")
}

/// Where a release notifies: `channel`, unless `quiet`: the store's lock
/// feed holds the releasing identity's lock and gives it back once the
/// release commits, which wakes the waiters (`locks.rs`).
pub(crate) struct Notice<'a> {
    pub(crate) channel: &'a str,
    pub(crate) quiet: bool,
}

/// The `pg_locks` condition of advisory lock `key` (taken on one
/// `bigint`) in this database, held or waited for: `classid` holds the
/// key's high 32 bits, `objid` its low, `objsubid` is 1.
pub(crate) fn advisory_lock(key: i64) -> String {
    let k = u64::from_ne_bytes(key.to_ne_bytes());
    let (hi, lo) = (k >> 32, k & 0xffff_ffff);
    format!(
        "locktype = 'advisory' AND objsubid = 1 AND classid = '{hi}'::oid AND objid = '{lo}'::oid \
         AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())"
    )
}

/// [`advisory_lock`], granted.
pub(crate) fn advisory_held(key: i64) -> String {
    format!("{} AND granted", advisory_lock(key))
}

/// Releases the term; a row it released also notifies `channel` with the
/// election's name and the fence released ([`notify`]), sent by the server
/// once the release commits, and never by a release that changed nothing.
pub(crate) fn release(
    table: &str, notice: &Notice<'_>, name: &str, identity: &str, fence: u64,
) -> Result<String, StoreError> {
    let (n, i) = (literal("election name", name)?, literal("identity", identity)?);
    Ok(format!(
        "UPDATE {table} SET expires_at = now(), renewed_at = GREATEST(renewed_at, now()) \
         WHERE name = {n} AND holder = {i} AND fence = {fence} AND expires_at > now() \
         AND (history IS NULL OR history = {HISTORY}) RETURNING {}",
        notify(notice, "")
    ))
}

pub(crate) fn inspect(table: &str, name: &str) -> Result<String, StoreError> {
    let n = literal("election name", name)?;
    Ok(format!("SELECT {COLS} FROM {table} WHERE name = {n}"))
}

// ---- batches (crate::batch) ----
//
// A batch is the single statements' work on many rows in one simple query.
// The items go in as arrays unnested `WITH ORDINALITY` (`v(n, f, p, k)`:
// name, fence, payload, the item's 1-based position), at most one item per
// row (the caller sends each election once), and every answer row starts
// with `k` so the caller matches it to its item.
//
// No two processes' batches deadlock, whatever order their items come in:
// a claim batch never waits for a row lock (it skips locked rows and says
// so, see [`acquire_many`]), so a renewal or release waiting for a claim's
// lock always gets it; and renewals and releases guard on their own
// identity, so two processes' never touch the same rows. Renewals and
// releases are then plain `UPDATE … FROM` the items, as the single ones
// are, and stay as cheap (measured: the same 3,334 renewals with a lock in
// name order first took about twice as long, the extra lock record per row
// and a second join). What is left: two renew or release batches of one
// process that overlap (one sent while an abandoned one still runs on the
// server) lock in their plans' order, which is the same for both in
// practice; if it ever were not, the server would fail one of them
// (40P01, retryable) after its deadlock timeout.

/// The fence of a batch item as a `bigint`. A fence above `i64::MAX` is no
/// row's (the column is a `bigint`), and neither is -1 (`CHECK (fence >
/// 0)`): the item's guard matches no row, as the single statement's
/// comparison with the larger number would.
fn fence_value(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(-1)
}

/// `unnest(…) WITH ORDINALITY AS v(n, [f,] [p,] k)`: the items as rows,
/// with their fences and payloads when `fences` and `payloads` say.
///
/// Each column is one array constant, `E'{…}'::text[]` (see [`array`]),
/// not an `ARRAY[…]` of one literal per item: the server then parses one
/// string instead of planning thousands of expressions (measured: 6,667
/// names planned in 0.6 ms instead of 2.5 ms). Payloads are `bytea` in
/// hex input form (`\x…`), which the array's input converts.
fn unnest(items: &[BatchItem<'_>], fences: bool, payloads: bool) -> Result<String, StoreError> {
    let names = array("election name", items.iter().map(|it| it.name.to_owned()), "text")?;
    let mut arrays = names;
    let mut cols = String::from("n");
    if fences {
        let f = items.iter().map(|it| fence_value(it.fence).to_string());
        arrays.push_str(&format!(", {}", array("fence", f, "int8")?));
        cols.push_str(", f");
    }
    if payloads {
        let p = items.iter().map(|it| format!("\\x{}", hex(it.payload)));
        arrays.push_str(&format!(", {}", array("payload", p, "bytea")?));
        cols.push_str(", p");
    }
    Ok(format!("unnest({arrays}) WITH ORDINALITY AS v({cols}, k)"))
}

/// One array constant of type `ty[]` holding `elems`: each element
/// double-quoted for the array's input syntax (`\` and `"` escaped with a
/// backslash, so braces, commas, spaces, quotes and the word `NULL` are
/// only text), and the whole written as a string literal by [`literal`].
fn array(what: &'static str, elems: impl Iterator<Item = String>, ty: &str) -> Result<String, StoreError> {
    let mut text = String::from("{");
    for (k, e) in elems.enumerate() {
        if k > 0 {
            text.push(',');
        }
        text.push('"');
        for c in e.chars() {
            if c == '\\' || c == '"' {
                text.push('\\');
            }
            text.push(c);
        }
        text.push('"');
    }
    text.push('}');
    Ok(format!("{}::{ty}[]", literal(what, &text)?))
}

/// This server's history, read once per statement (an init plan).
fn history_once() -> String {
    format!("(SELECT {HISTORY})")
}

/// [`acquire`] of every item (distinct names), for `identity`, in two
/// statements of one transaction (one `now()`) that never wait for a row
/// lock. Each answer row is `k, state, COLS…`: state `w` the claim wrote
/// the row; `r` the row as it stands, which the claim leaves alone; `l`
/// the claim applies, but another transaction holds a `FOR KEY SHARE`
/// lock on the row (a lease check), so it was neither claimed nor waited
/// for. An item without an answer row found its row locked by another
/// writer (a claim or renewal in progress), or deleted: run it again in a
/// new transaction, once that writer is done.
///
/// 1. The absent rows are inserted as new terms, in name order, `ON
///    CONFLICT DO NOTHING`: that waits only for another transaction
///    inserting the same name (in name order too, so two claim batches
///    cannot wait for each other in a circle), never for a row lock; once
///    it returns every item's row exists, committed or this transaction's.
///    The rows the statement's snapshot already has are left out first
///    (`NOT EXISTS`, one anti-join), which costs less than 3,334 conflict
///    checks (measured: 7–11 ms instead of 13).
/// 2. With a fresh snapshot that sees them all: every item's row is locked
///    `FOR NO KEY UPDATE SKIP LOCKED`, which reads its newest version and
///    skips rows another writer holds, but not a check's `FOR KEY SHARE`.
///    The rows the claim writes ([`Claim::applies`]) are then locked `FOR
///    UPDATE SKIP LOCKED`, which only a check's `FOR KEY SHARE` can refuse
///    now: those are answered `l` at once, instead of holding the batch up
///    until the check's transaction ends (a claim changes `fence`, a key
///    column). The rows locked so are written as [`acquire`] writes them
///    ([`Claim::set`]); every other locked row is answered as the first
///    lock read it, and no claim can change it before this transaction
///    ends. A write that would change nothing is not made
///    ([`Claim::changes_nothing`]: the rows step 1 inserted).
pub(crate) fn acquire_many(
    table: &str, identity: &str, ttl: Duration, items: &[BatchItem<'_>], failover_rule: bool,
) -> Result<String, StoreError> {
    let (i, t) = (literal("identity", identity)?, interval(ttl));
    let v = unnest(items, false, true)?;
    let (h, expires) = (history_once(), format!("now() + {t}"));
    // Decided on the locked rows (`mine`, as `t`), written from the newest
    // version with the item's payload (`free.p`).
    let on = |payload| Claim { holder: &i, expires: &expires, payload, history: &h, ttl: &t, failover_rule };
    let (mine, free) = (on("t.p"), on("free.p"));
    let (applies, same, set) = (mine.applies(), mine.changes_nothing(), free.set());
    Ok(format!(
        "INSERT INTO {table} AS t (name, holder, fence, acquired_at, renewed_at, expires_at, payload, terms, history) \
         SELECT v.n, {i}, GREATEST(1, {NOW_MICROS}), now(), now(), {expires}, v.p, 1, {h} \
         FROM {v} WHERE NOT EXISTS (SELECT 1 FROM {table} x WHERE x.name = v.n) \
         ORDER BY v.n ON CONFLICT DO NOTHING; \
         WITH mine AS MATERIALIZED (\
           SELECT t.name, t.holder, t.fence, t.acquired_at, t.renewed_at, t.expires_at, t.payload, t.history, v.p, v.k \
           FROM {table} t JOIN {v} ON v.n = t.name FOR NO KEY UPDATE OF t SKIP LOCKED\
         ), want AS MATERIALIZED (\
           SELECT t.name AS ln, t.p, t.k FROM mine t WHERE ({applies}) AND NOT {same}\
         ), free AS MATERIALIZED (\
           SELECT t.name AS ln, want.p, want.k FROM {table} t JOIN want ON want.ln = t.name FOR UPDATE OF t SKIP LOCKED\
         ), up AS (\
           UPDATE {table} AS t SET {set} FROM free WHERE t.name = free.ln \
           RETURNING free.k, t.name, t.holder, t.fence, t.acquired_at, t.renewed_at, t.expires_at, t.payload\
         ) \
         SELECT k::text, 'w', {COLS} FROM up \
         UNION ALL \
         SELECT k::text, CASE WHEN name IN (SELECT ln FROM want) THEN 'l' ELSE 'r' END, {COLS} FROM mine \
         WHERE name NOT IN (SELECT ln FROM free)"
    ))
}

/// [`renew`] of every item (distinct names and fences), for `identity`, as
/// one statement: each item's row is locked `FOR NO KEY UPDATE SKIP LOCKED`
/// (a lease check's `FOR KEY SHARE` lets it through, another writer's lock
/// does not: that row is skipped, not waited for), then the rows locked are
/// updated with the single renewal's guard and writes. Each answer row is a
/// term renewed, or an item whose row another transaction held locked
/// (`k` and three NULLs: run again shortly, then retryable, its lease
/// untouched); an item without one lost its lease. So one row locked from
/// outside (an operator's `SELECT … FOR UPDATE`, a long transaction) costs
/// that row's renewal alone, not the whole batch its timeout. No indexed column changes, so
/// the writes stay HOT updates.
///
/// A renewed item's row is `k, acquired_at, expires_at, now` ([`RENEWED`]),
/// not the whole lease: the rest of a renewed row is the item's (name,
/// fence, payload), the caller's (holder) or the statement's (`renewed_at`
/// is `now()`), so [`renewed_at`] builds the lease from them. Each
/// timestamp's exact conversion costs the server about 2 ms a batch of
/// 3,334, and the unchanged columns' text more: 17–23 ms for whole rows
/// against 11–12 ms answering nothing (`pgbench`, one renewal of 3,334 rows
/// of 10,000). `now()` is converted once, as an init plan.
pub(crate) fn renew_many(
    table: &str, identity: &str, ttl: Duration, items: &[BatchItem<'_>],
) -> Result<String, StoreError> {
    let (i, t, h) = (literal("identity", identity)?, interval(ttl), history_once());
    let v = unnest(items, true, true)?;
    Ok(format!(
        "WITH v AS MATERIALIZED (SELECT * FROM {v}), l AS MATERIALIZED (\
           SELECT t.name, v.k, v.f, v.p FROM {table} t JOIN v ON v.n = t.name FOR NO KEY UPDATE OF t SKIP LOCKED\
         ), up AS (\
           UPDATE {table} AS t SET renewed_at = now(), expires_at = GREATEST(t.expires_at, now() + {t}), \
           payload = l.p, history = {h} \
           FROM l WHERE l.name = t.name AND l.f = t.fence AND t.holder = {i} \
           AND (t.expires_at > now() OR t.history <> {h}) AND t.renewed_at <= now() \
           RETURNING l.k::text AS k, {RENEWED}\
         ) \
         SELECT * FROM up UNION ALL \
         SELECT v.k::text, NULL, NULL, NULL FROM v WHERE NOT EXISTS (SELECT 1 FROM l WHERE l.k = v.k) \
         AND EXISTS (SELECT 1 FROM {table} x WHERE x.name = v.n)"
    ))
}

/// The columns of [`renew_many`]'s answer row after `k`.
const RENEWED: &str = concat!(
    micros!("t.acquired_at"),
    "::text, ",
    micros!("t.expires_at"),
    "::text, (SELECT ",
    micros!("now()"),
    "::text)"
);

/// The lease an answer row of [`renew_many`] (`k`, then [`RENEWED`])
/// renewed for `item`: held by `identity`, the item's fence and payload,
/// renewed at the statement's `now()`.
pub(crate) fn renewed_at(
    op: &str, row: &SimpleQueryRow, identity: &str, item: &BatchItem<'_>,
) -> Result<Lease, StoreError> {
    let micros = |i: usize| {
        micros_at(row, i)
            .map_err(|what| StoreError::fatal(format!("postgres {op}: cannot read the renewed row ({what})")))
    };
    let now = micros(3)?;
    Ok(Lease {
        name: item.name.to_owned(),
        holder: identity.to_owned(),
        fence: item.fence,
        acquired_at: micros(1)?,
        renewed_at: now,
        expires_at: micros(2)?,
        now,
        payload: item.payload.to_vec(),
    })
}

/// [`release`] of every item (distinct names and fences), for `identity`,
/// as one statement that locks the items' rows as [`renew_many`] does
/// (skipping those another transaction holds) and updates the rows locked
/// with the single release's guard and writes. Answer rows `k`: the items
/// whose row was locked by another transaction (retryable, not released).
/// Releasing what one does not hold is not an error.
/// [`release`] of every item, each released row notifying `channel` as
/// there (a data-modifying `WITH` runs to the end, `RETURNING` included,
/// though nothing reads it).
pub(crate) fn release_many(
    table: &str, notice: &Notice<'_>, identity: &str, items: &[BatchItem<'_>],
) -> Result<String, StoreError> {
    let (i, h) = (literal("identity", identity)?, history_once());
    let v = unnest(items, true, false)?;
    let notify = notify(notice, "t.");
    Ok(format!(
        "WITH v AS MATERIALIZED (SELECT * FROM {v}), l AS MATERIALIZED (\
           SELECT t.name, v.k, v.f FROM {table} t JOIN v ON v.n = t.name FOR NO KEY UPDATE OF t SKIP LOCKED\
         ), up AS (\
           UPDATE {table} AS t SET expires_at = now(), renewed_at = GREATEST(t.renewed_at, now()) \
           FROM l WHERE l.name = t.name AND l.f = t.fence AND t.holder = {i} AND t.expires_at > now() \
           AND (t.history IS NULL OR t.history = {h}) RETURNING {notify}\
         ) \
         SELECT v.k::text FROM v WHERE NOT EXISTS (SELECT 1 FROM l WHERE l.k = v.k) \
         AND EXISTS (SELECT 1 FROM {table} x WHERE x.name = v.n)"
    ))
}

/// [`inspect`] of every name: each answer row `k, COLS…`; a name without
/// one has no row. A plain read: no lock, no write.
pub(crate) fn inspect_many(table: &str, names: &[&str]) -> Result<String, StoreError> {
    let items: Vec<BatchItem<'_>> = names.iter().map(|n| BatchItem { name: n, fence: 0, payload: b"" }).collect();
    let v = unnest(&items, false, false)?;
    Ok(format!("SELECT v.k::text, {COLS} FROM {v} JOIN {table} t ON t.name = v.n"))
}

// ---- group members (Store::heartbeat) ----

/// The table of group members' heartbeats (see [`crate::batch::Members`]):
/// one row per group and member, with the expiry of its last heartbeat.
pub(crate) fn create_members(members: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {members} (\n\
         \x20   group_name  text        NOT NULL,\n\
         \x20   member      text        NOT NULL,\n\
         \x20   expires_at  timestamptz NOT NULL,\n\
         \x20   leads       bigint      NOT NULL DEFAULT 0,\n\
         \x20   PRIMARY KEY (group_name, member)\n\
         ) WITH (fillfactor = 70);\n"
    )
}

/// How long after its expiry a member's row may be deleted.
const FORGET_MEMBERS: &str = "interval '1 hour'";

/// Writes `member`'s heartbeat, `GREATEST(old expiry, now() + ttl)`, and
/// answers one row: the group's members alive at `now()` (this one
/// included), `now()` in microseconds, the live members whose names come
/// before this one's byte by byte (`COLLATE "C"`: the database's own
/// collation may order them otherwise, and ranks must agree with every
/// other store's), and the sum and the most of what the live members
/// reported leading (this one's report as written); the others' four
/// figures come from one pass over their rows. A data-modifying CTE's effects
/// are not visible to its siblings (they share the snapshot taken before
/// it), so the others are counted from the table and this member from what
/// its upsert returned. Rows of the group that expired over an hour ago
/// are deleted on the way, skipping any another heartbeat is deleting.
pub(crate) fn heartbeat(
    members: &str, group: &str, member: &str, leading: u32, ttl: Duration,
) -> Result<String, StoreError> {
    let (g, m, t) = (literal("group", group)?, literal("member", member)?, interval(ttl));
    Ok(format!(
        "WITH gone AS (\
           DELETE FROM {members} WHERE (group_name, member) IN (\
             SELECT group_name, member FROM {members} WHERE group_name = {g} AND member <> {m} \
             AND expires_at <= now() - {FORGET_MEMBERS} FOR UPDATE SKIP LOCKED)\
         ), me AS (\
           INSERT INTO {members} AS x (group_name, member, expires_at, leads) \
           VALUES ({g}, {m}, now() + {t}, {leading}) \
           ON CONFLICT (group_name, member) DO UPDATE \
           SET expires_at = CASE WHEN x.leads < 0 THEN x.expires_at ELSE GREATEST(x.expires_at, excluded.expires_at) END, \
             leads = CASE WHEN x.leads < 0 THEN x.leads ELSE excluded.leads END \
           RETURNING x.expires_at > now() AS live, x.leads\
         ), others AS (\
           SELECT count(*) AS live, count(*) FILTER (WHERE member COLLATE \"C\" < {m}) AS rank, \
             COALESCE(sum(leads), 0) AS led, COALESCE(max(leads), 0) AS most \
           FROM {members} WHERE group_name = {g} AND member <> {m} AND expires_at > now()\
         ) \
         SELECT (o.live + (SELECT count(*) FROM me WHERE live))::text, {NOW_MICROS}::text, o.rank::text, \
           (o.led + (SELECT COALESCE(sum(leads), 0) FROM me WHERE live))::text, \
           GREATEST(o.most, (SELECT COALESCE(max(leads), 0) FROM me WHERE live))::text \
         FROM others o"
    ))
}

/// Turns `member`'s row of `group` into a tombstone: expired now, `leads`
/// -1, which a heartbeat that arrives later leaves as it is (see
/// [`heartbeat`]); deleted with the rows of members gone for an hour.
pub(crate) fn leave_group(members: &str, group: &str, member: &str) -> Result<String, StoreError> {
    let (g, m) = (literal("group", group)?, literal("member", member)?);
    Ok(format!(
        "INSERT INTO {members} AS x (group_name, member, expires_at, leads) VALUES ({g}, {m}, now(), -1) \
         ON CONFLICT (group_name, member) DO UPDATE SET expires_at = LEAST(x.expires_at, now()), leads = -1"
    ))
}

/// The first row of the last statement, as a lease.
pub(crate) fn first_lease(op: &str, msgs: &[SimpleQueryMessage]) -> Result<Option<Lease>, StoreError> {
    let Some(row) = msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => Some(r),
        _ => None,
    }) else {
        return Ok(None);
    };
    lease_at(op, row, 0).map(Some)
}

/// The lease in `row`'s columns `base..base + 8` (the order of `COLS`).
pub(crate) fn lease_at(op: &str, row: &SimpleQueryRow, base: usize) -> Result<Lease, StoreError> {
    let bad = |what: &str| StoreError::fatal(format!("postgres {op}: cannot read the lease row ({what})"));
    let text = |i: usize| row.try_get(base + i).ok().flatten().ok_or_else(|| bad("missing column"));
    let micros = |i: usize| micros_at(row, base + i).map_err(bad);
    let fence = text(2)?.parse::<i64>().map_err(|_| bad("bad fence"))?;
    Ok(Lease {
        name: text(0)?.to_owned(),
        holder: text(1)?.to_owned(),
        fence: u64::try_from(fence).map_err(|_| bad("negative fence"))?,
        acquired_at: micros(3)?,
        renewed_at: micros(4)?,
        expires_at: micros(5)?,
        now: micros(6)?,
        payload: unhex(text(7)?).ok_or_else(|| bad("bad payload"))?,
    })
}

/// The instant in `row`'s column `i` (microseconds since the epoch, as
/// text), or what is wrong with it.
fn micros_at(row: &SimpleQueryRow, i: usize) -> Result<DbTime, &'static str> {
    let text = row.try_get(i).ok().flatten().ok_or("missing column")?;
    text.parse::<i64>().map(DbTime::from_unix_micros).map_err(|_| "bad timestamp")
}

/// The answer rows of a batch among `msgs`: each row's item, from its
/// first column `k` (1-based, at most `len`), with the row.
pub(crate) fn batch_rows<'a>(
    op: &str, msgs: &'a [SimpleQueryMessage], len: usize,
) -> Result<Vec<(usize, &'a SimpleQueryRow)>, StoreError> {
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .map(|r| {
            let k = r.get(0).and_then(|k| k.parse::<usize>().ok()).filter(|k| (1..=len).contains(k));
            k.map(|k| (k - 1, r))
                .ok_or_else(|| StoreError::fatal(format!("postgres {op}: an answer row names no item of the batch")))
        })
        .collect()
}

/// Whether an SQLSTATE means "needs a person" rather than "may fix itself".
pub(crate) fn sqlstate_kind(code: &str) -> ErrorKind {
    match code.get(..2).unwrap_or("") {
        // authorization, missing database / schema, syntax or access rule
        // (undefined table 42P01, insufficient privilege 42501), unsupported
        // feature, data and integrity errors, invalid statement names.
        "28" | "3D" | "3F" | "42" | "0A" | "22" | "23" | "26" | "2F" | "34" | "44" | "0L" | "0P" => ErrorKind::Fatal,
        // connection exceptions (08), read-only transaction (25006),
        // serialization failure and deadlock (40), too many connections (53),
        // lock not available (55P03), admin shutdown and query canceled (57),
        // system and internal errors (58, XX), and anything unknown.
        _ => ErrorKind::Retryable,
    }
}

/// A store error from a driver error on an open session, carrying the
/// server's message. The kind comes from the SQLSTATE when the server sent
/// one; anything else on an open session is the connection failing (I/O, a
/// closed socket, a reply that could not be read), which a fresh connection
/// may not hit: retryable. Errors while opening a connection are classified
/// by `conn::classify_connect`, which knows more about where they arose.
pub(crate) fn classify(op: &str, e: &tokio_postgres::Error) -> StoreError {
    if let Some(err) = classify_db(&format!("postgres {op}"), e) {
        return err;
    }
    let what = if e.is_closed() { "connection closed" } else { "connection error" };
    StoreError::retryable(format!("postgres {op}: {what}: {}", crate::error::chain_text(e)))
}

/// The error the server sent, if it sent one: `"{prefix}: SQLSTATE {code}"`
/// with the server's message as the source, its kind from the SQLSTATE.
pub(crate) fn classify_db(prefix: &str, e: &tokio_postgres::Error) -> Option<StoreError> {
    let db = e.as_db_error()?;
    let code = db.code().code();
    let message = format!("{prefix}: SQLSTATE {code}");
    let err = match sqlstate_kind(code) {
        ErrorKind::Fatal => StoreError::fatal(message),
        _ => StoreError::retryable(message),
    };
    Some(err.with_source(db.clone()))
}

/// The error the server sent, found anywhere in `e`'s source chain.
fn db_error_of<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a tokio_postgres::error::DbError> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(db) = c.downcast_ref::<tokio_postgres::error::DbError>() {
            return Some(db);
        }
        cur = c.source();
    }
    None
}

/// The SQLSTATE the server sent, found anywhere in `e`'s source chain.
pub(crate) fn sqlstate_of<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a str> {
    db_error_of(e).map(|db| db.code().code())
}

/// A concurrent `CREATE … IF NOT EXISTS` or `ADD COLUMN IF NOT EXISTS` lost
/// on a catalog unique index (unique violation, duplicate table, object or
/// column), read from the server's SQLSTATE.
pub(crate) fn is_concurrent_ddl(e: &StoreError) -> bool {
    matches!(sqlstate_of(e), Some("23505" | "42P07" | "42710" | "42701"))
}

/// An acquire that failed with undefined column (42703) stays fatal and
/// says how to add `terms`, the column a table made by an older version's
/// DDL lacks; the server's message, kept as the source, names the column.
pub(crate) fn explain_undefined_column(e: StoreError, op: &str, table: &str) -> StoreError {
    match db_error_of(&e) {
        Some(db) if db.code().code() == "42703" => StoreError::fatal(format!(
            "postgres {op}: SQLSTATE 42703 (a table made by an older version needs: {}; {}; \
             or PostgresStore::ensure_schema)",
            add_terms(table),
            add_history(table)
        ))
        .with_source(db.clone()),
        _ => e,
    }
}

/// A heartbeat or leave that failed with undefined table (42P01) stays
/// fatal and says what is missing and how to make it: the members table,
/// which a schema made before groups existed lacks.
pub(crate) fn explain_missing_members(e: StoreError, op: &str, members: &str) -> StoreError {
    match db_error_of(&e) {
        Some(db) if db.code().code() == "42P01" => StoreError::fatal(format!(
            "postgres {op}: SQLSTATE 42P01 (the group members table {members} does not exist; run \
             PostgresStore::ensure_schema, or the DDL of PostgresStore::schema)"
        ))
        .with_source(db.clone()),
        Some(db) if db.code().code() == "42703" => StoreError::fatal(format!(
            "postgres {op}: SQLSTATE 42703 (a group members table made by an older version needs: {}; \
             or PostgresStore::ensure_schema)",
            add_leading(members)
        ))
        .with_source(db.clone()),
        _ => e,
    }
}

/// The first column of the first row among `msgs`, as text.
pub(crate) fn first_text(msgs: &[SimpleQueryMessage]) -> Option<&str> {
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // A name that holds the block's dollar quote cannot end the block
    // early: the quote grows until no value holds it.
    #[test]
    fn the_lease_checks_dollar_quote_is_one_no_value_holds() {
        let plain = lease_check_literal("\"le\"", "public", "le_name_fence", "jobs", "a#1", 7).unwrap();
        assert!(plain.starts_with("DO $leaderelection$ BEGIN") && plain.ends_with("END $leaderelection$;"), "{plain}");
        let name = "x$leaderelection$y$leaderelection_$";
        let sql = lease_check_literal("\"le\"", "public", "le_name_fence", name, "a#1", 7).unwrap();
        assert!(sql.starts_with("DO $leaderelection__$ BEGIN"), "{sql}");
        assert!(sql.ends_with("END $leaderelection__$;"), "{sql}");
        assert_eq!(sql.matches("$leaderelection__$").count(), 2, "{sql}");
        assert!(sql.contains("name = E'x$leaderelection$y$leaderelection_$'"), "{sql}");
    }

    #[test]
    fn sqlstates_are_classified() {
        for fatal in ["42P01", "42501", "28P01", "28000", "3D000", "42703", "3F000"] {
            assert_eq!(sqlstate_kind(fatal), ErrorKind::Fatal, "{fatal}");
        }
        for retry in ["08006", "08001", "57P01", "25006", "40001", "40P01", "53300", "55P03", "57014", "XX000", ""] {
            assert_eq!(sqlstate_kind(retry), ErrorKind::Retryable, "{retry}");
        }
    }

    #[test]
    fn bad_password_and_other_login_refusals_are_fatal() {
        // Password authentication failed (28P01) cannot be provoked on the
        // trust-auth test servers; tests/postgres_first_errors.rs has a fake
        // server that sends it through the whole connect path.
        for code in ["28P01", "28000", "3D000", "42501", "0A000"] {
            assert_eq!(sqlstate_kind(code), ErrorKind::Fatal, "{code}");
        }
        // Starting up, shutting down, too many connections: they pass.
        for code in ["57P03", "57P01", "57P02", "53300", "08P01", "08006"] {
            assert_eq!(sqlstate_kind(code), ErrorKind::Retryable, "{code}");
        }
    }

    #[test]
    fn concurrent_ddl_is_recognised_by_sqlstate_not_text() {
        // The positive case needs a server's DbError (no public constructor):
        // storetest_postgres runs ensure_schema from many threads at once.
        // A message that merely mentions the code is not the code.
        let text_only = StoreError::fatal("postgres ensure_schema: SQLSTATE 42P07");
        assert!(!is_concurrent_ddl(&text_only));
        let inner = StoreError::fatal("postgres ensure_schema: unrelated").with_source(io_error());
        assert!(!is_concurrent_ddl(&inner));
        assert!(sqlstate_of(&io_error()).is_none());
    }

    fn io_error() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")
    }

    #[test]
    fn literals_escape_quotes_and_backslashes_and_refuse_nul() {
        assert_eq!(literal("x", "plain").unwrap(), "E'plain'");
        assert_eq!(literal("x", r"a'b\c").unwrap(), r"E'a''b\\c'");
        assert_eq!(literal("x", r"\'; DROP TABLE t; --").unwrap(), r"E'\\''; DROP TABLE t; --'");
        assert!(literal("identity", "a\0b").unwrap_err().is_fatal());
    }

    #[test]
    fn batch_arrays_quote_every_element_and_escape_for_any_setting() {
        let elems = [r#"a"b\c'd"#, "NULL", "{x,y}", " sp ", "", "ünï ✓"].map(str::to_owned);
        let text = array("x", elems.into_iter(), "text").unwrap();
        // Array syntax first (`\` and `"` behind a backslash, every element
        // in double quotes), then the string literal (`'` doubled, `\`
        // doubled), so it reads the same whatever standard_conforming_strings.
        assert_eq!(text, r#"E'{"a\\"b\\\\c''d","NULL","{x,y}"," sp ","","ünï ✓"}'::text[]"#);
        let arr = crate::ident::unquote_postgres_literal(text.trim_end_matches("::text[]")).unwrap();
        assert_eq!(arr, r#"{"a\"b\\c'd","NULL","{x,y}"," sp ","","ünï ✓"}"#);
        assert!(array("x", ["a\0b".to_owned()].into_iter(), "text").unwrap_err().is_fatal(), "NUL is refused");
    }

    #[test]
    fn batch_items_carry_names_fences_and_payloads_by_position() {
        let items = [
            BatchItem { name: "it's", fence: 7, payload: &[0, 255] },
            BatchItem { name: "b", fence: u64::MAX, payload: b"" },
        ];
        let v = unnest(&items, true, true).unwrap();
        assert_eq!(
            v,
            r#"unnest(E'{"it''s","b"}'::text[], E'{"7","-1"}'::int8[], E'{"\\\\x00ff","\\\\x"}'::bytea[]) WITH ORDINALITY AS v(n, f, p, k)"#
        );
        assert!(unnest(&[BatchItem { name: "a\0b", fence: 0, payload: b"" }], false, false).unwrap_err().is_fatal());
        assert_eq!(fence_value(u64::MAX), -1, "a fence no row has");
        assert_eq!(fence_value(42), 42);
    }

    #[test]
    fn hex_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)).unwrap(), all);
        assert_eq!(unhex("").unwrap(), Vec::<u8>::new());
        assert!(unhex("abc").is_none() && unhex("zz").is_none());
    }

    #[test]
    fn bounds_stay_inside_the_deadline_and_settings_are_pinned() {
        let s = pinned("SELECT 1", Duration::from_millis(800), Pin::Read);
        assert_eq!(
            s,
            "SET LOCAL statement_timeout = 700; SET LOCAL lock_timeout = 600; \
             SET LOCAL search_path = pg_catalog; SET LOCAL transaction_isolation = 'read committed'; SELECT 1"
        );
        let w = pinned("UPDATE x", Duration::from_millis(800), Pin::Write);
        assert_eq!(
            w,
            "SET LOCAL statement_timeout = 700; SET LOCAL lock_timeout = 600; RESET synchronous_commit; \
             SET LOCAL search_path = pg_catalog; SET LOCAL transaction_isolation = 'read committed'; UPDATE x"
        );
        let again = pinned("UPDATE x", Duration::from_millis(800), Pin::WriteOverSession);
        assert_eq!(
            again,
            "SET LOCAL statement_timeout = 700; SET LOCAL lock_timeout = 600; \
             SET LOCAL transaction_read_only = off; RESET synchronous_commit; \
             SET LOCAL search_path = pg_catalog; SET LOCAL transaction_isolation = 'read committed'; UPDATE x"
        );
        assert_eq!(pinned("CREATE TABLE x ()", Duration::ZERO, Pin::None), "CREATE TABLE x ()");
        assert!(pinned("x", Duration::ZERO, Pin::Read).contains("lock_timeout = 3;"));
        assert!(interval(Duration::MAX).contains(&MAX_TTL.as_micros().to_string()));
    }
}
