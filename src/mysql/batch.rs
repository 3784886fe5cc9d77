//! Batched calls ([`crate::batch`]) on MySQL and MariaDB.
//!
//! A batch runs on one session of the pool, as a single call does: the
//! settings every call pins, the call's instant read once into
//! `@leaderelection_now` and used by every statement (so every row is
//! decided at one instant, and a row this call wrote is told by its
//! `renewed_at`), `REPEATABLE READ` transactions started as
//! [`sql::BEGIN`] starts them (read-only exactly when the server is) and
//! ended with `COMMIT AND NO CHAIN NO RELEASE`, whose effect claims and
//! renewals read back after it where a `COMMIT` can be discarded
//! unreported (see [`committed_checks`]), the settings put back at the
//! end, the connection dropped on any failure. Renewals (with a member's
//! heartbeat, when it rides on them), releases and reads are one
//! transaction; a claim is two (see [`acquire`]); a renewal
//! of [`HALVES_FROM`] items or more is two halves at once, each one
//! transaction on a session of its own (see [`halves`]). A batch may
//! take several queries, each within the packet limit (see
//! [`Env::budget`]): statements are split by that, and an item too large
//! for any statement is refused on its own, as the single call refuses it.
//! Every row is decided by the same conditions as the single-lease
//! statement, evaluated by the server on that row under its lock, and the
//! rows read back say, per item, what the call did.
//!
//! **Lock order.** Every statement that takes a lock it may wait for names
//! its rows in ascending (binary) name order, in lists of at most [`CHUNK`]
//! names, sent in that order; so two batches that share rows wait for
//! each other row by row and never deadlock (nor do the two halves of a
//! renewal with anything: each holds a range of names of its own, locked
//! in that order too). Longer lists would be planned
//! differently: MariaDB turns an `IN` list of 1,000 values or more into a
//! join with a table of those values (`in_predicate_conversion_threshold`)
//! and plans a locking read of it as a scan of the whole index, which
//! locks every row of the table (seen here with `EXPLAIN`); MySQL 8 falls
//! back to a scan when the ranges outgrow `range_optimizer_max_mem_size`.
//!
//! **Claims and lease checks.** A lease check (`MySqlStore::check_lease`)
//! holds a shared lock on its row's entry in the `(name, fence, holder)`
//! index until the program's transaction ends and, under `REPEATABLE
//! READ`, on the gaps before and after that entry. A claim changes its
//! row's entry: it marks the old one deleted (which waits for that entry's
//! lock) and inserts the new one right after it, into the gap before the
//! next election's entry; a new row's entry goes into the gap between its
//! neighbours. So a claim waits for a check of its own row and for a check
//! of the next election's (measured: a claim of `a` waits while `c` is
//! checked, with nothing between them), and a new row for a check of
//! either neighbour. A batch waiting there would stall every claim in it,
//! so a claim batch looks first (see [`acquire`]) and leaves out, answered
//! retryable, the candidates a check holds.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::time::{Duration, Instant};

use mysql::{Conn, Value};

use super::conn::{query, Env, Failed, Job};
use super::sql::{self, AT, BEGIN, BY_KEY, CLAIMABLE, COMMIT, HISTORY, NOW, TERM_INDEX};
use crate::config::{MAX_IDENTITY_LEN, MAX_NAME_LEN};
use crate::lease::{DbTime, Lease};
use crate::store::StoreError;

/// Most names one statement lists (see the module's notes on lock order).
pub(crate) const CHUNK: usize = 500;

/// Room kept in a statement's budget beyond what its text is estimated at.
const SLACK: usize = 512;

/// One item of a batch, owned (a call runs on a thread of its own), with
/// its place among the batch's items.
#[derive(Clone)]
pub(crate) struct Item {
    pub at: usize,
    pub name: Vec<u8>,
    pub fence: u64,
    pub payload: Vec<u8>,
}

/// What a batch's job read: every row of every query, and the items it
/// left out (too large for any statement), each by its place and why.
pub(crate) struct Done {
    pub rows: Vec<Vec<Value>>,
    pub refused: Vec<(usize, StoreError)>,
}

/// Whether the table can hold `name`, as the single calls check it.
pub(crate) fn name(name: &str) -> Result<(), StoreError> {
    sql::text("election name", name, MAX_NAME_LEN).map(drop)
}

/// The identity as a literal, refused as the single calls refuse it.
pub(crate) fn identity(identity: &str) -> Result<String, StoreError> {
    sql::text("identity", identity, MAX_IDENTITY_LEN)
}

/// Statements packed into queries of at most `budget` bytes each, in the
/// order given.
struct Script {
    budget: usize,
    queries: Vec<String>,
}

impl Script {
    fn new(budget: usize) -> Script {
        Script { budget, queries: vec![String::new()] }
    }

    fn push(&mut self, statement: &str) {
        if self.queries.last().is_some_and(|q| !q.is_empty() && q.len() + 1 + statement.len() > self.budget) {
            self.queries.push(String::new());
        }
        let last = self.queries.last_mut().expect("a script has a query");
        if !last.is_empty() {
            last.push(' ');
        }
        last.push_str(statement);
    }

    /// Ends the batch: its transaction's `COMMIT`, then `checks` (reads
    /// of committed rows that show whether the commit took, see
    /// [`committed`]), then the settings put back ([`unpin`]).
    fn finish(&mut self, checks: &[String]) {
        self.push(COMMIT);
        for c in checks {
            self.push(c);
        }
        self.push(&unpin());
    }

    /// Sends every query on `conn`, in order, and returns every row.
    fn run(self, conn: &mut Conn) -> Result<Vec<Vec<Value>>, Failed> {
        let mut rows = Vec::new();
        for q in self.queries.iter().filter(|q| !q.is_empty()) {
            rows.extend(query(conn, q).map_err(|e| Failed::sending(e, q))?);
        }
        Ok(rows)
    }
}

/// The settings every call pins, for a job that started at `env`; and,
/// since a batch's transaction may span several queries, how long the
/// server waits for the client within it. A single call's transaction is
/// one query, which the server runs to its end whatever the client does;
/// a batch whose process stops between two of its queries (a pause, a
/// frozen VM) would otherwise hold its row locks, rows other members
/// renew among them, until the server's `wait_timeout` (8 hours by
/// default). With these bounds the server ends such a session, and rolls
/// its transaction back, within the call's own lock-wait bound.
fn pin(env: &Env) -> String {
    let remaining = env.deadline.saturating_duration_since(Instant::now());
    let s = sql::lock_wait_secs(remaining);
    format!("{} SET SESSION wait_timeout = {s}, net_read_timeout = {s}, net_write_timeout = {s};", sql::pin(remaining))
}

/// The end of a batch: the settings [`pin`] made back to the server's
/// defaults.
fn unpin() -> String {
    format!(
        "SET SESSION wait_timeout = DEFAULT, net_read_timeout = DEFAULT, net_write_timeout = DEFAULT; {}",
        sql::unpin()
    )
}

/// The longest statement a job may send.
fn room(env: &Env) -> usize {
    env.budget.saturating_sub(SLACK)
}

/// How a statement's length grows with its items: `fixed` bytes, `each(k)`
/// for item `k`, and its payload (`payload(k)`), which a statement whose
/// items all publish one payload carries once when `shared`.
struct Size<'a> {
    fixed: usize,
    each: &'a dyn Fn(usize) -> usize,
    payload: Option<&'a dyn Fn(usize) -> &'a [u8]>,
    shared: bool,
}

/// Consecutive groups of the `count` items, each at most [`CHUNK`] items
/// whose statement stays within `room` bytes by `size`, and the items
/// too large for any statement with how long theirs would be.
fn chunks(count: usize, room: usize, size: &Size<'_>) -> (Vec<Range<usize>>, Vec<(usize, usize)>) {
    let mut out = Vec::new();
    let mut too_big = Vec::new();
    let own = |k: usize| size.payload.map_or(0, |p| p(k).len() * 2 + 40);
    let mut start = 0;
    let (mut each, mut payloads, mut shared) = (0, 0, true);
    for k in 0..count {
        let alone = size.fixed + (size.each)(k) + own(k);
        if alone > room {
            if start < k {
                out.push(start..k);
            }
            too_big.push((k, alone));
            start = k + 1;
            (each, payloads, shared) = (0, 0, true);
            continue;
        }
        let same = size.shared && size.payload.is_some_and(|p| k == start || p(k) == p(start));
        let grown = |each: usize, payloads: usize, shared: bool| {
            size.fixed + each + if shared { size.payload.map_or(0, |p| p(start).len() * 2 + 3) } else { payloads }
        };
        if k > start && (k - start == CHUNK || grown(each + (size.each)(k), payloads + own(k), shared && same) > room) {
            out.push(start..k);
            start = k;
            (each, payloads, shared) = (0, 0, true);
        }
        each += (size.each)(k);
        payloads += own(k);
        shared = shared && size.shared && size.payload.is_some_and(|p| p(k) == p(start));
    }
    if start < count {
        out.push(start..count);
    }
    (out, too_big)
}

/// The groups of `names` for statements that only list them, each within
/// `room` beside `fixed` bytes of its own.
fn name_chunks(names: &[&[u8]], room: usize, fixed: usize) -> Vec<Range<usize>> {
    let each = |k: usize| names[k].len() * 2 + 5;
    chunks(names.len(), room, &Size { fixed, each: &each, payload: None, shared: false }).0
}

fn list<'a>(names: impl Iterator<Item = &'a [u8]>) -> String {
    let mut s = String::new();
    for n in names {
        if !s.is_empty() {
            s.push_str(", ");
        }
        sql::hex_into(&mut s, n);
    }
    s
}

fn tagged<'a>(rows: &'a [Vec<Value>], tag: &'a str) -> impl Iterator<Item = &'a [Value]> + 'a {
    sql::tagged(rows, tag)
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Bytes(b) => Some(b.clone()),
        _ => None,
    }
}

fn flag(v: &Value) -> bool {
    sql::int_value(v).unwrap_or(0) != 0
}

/// The fatal error of an item whose statement alone would be `len` bytes,
/// over the packet limit the job's budget came from.
fn too_large(op: &str, len: usize, env: &Env) -> StoreError {
    sql::too_large(op, len, env.budget as u64 + 1024)
}

/// The columns of a lease row read back by a batch, after its tag `'r'`.
/// A batch reads the call's instant and the server's clock once, after
/// its rows, in a row `'n', instant, clock` (one after each statement of
/// an inspect, whose instant is that clock), so its rows carry only the
/// row's own columns.
const LEASE: &str = "name, holder, fence, acquired_at, renewed_at, expires_at, payload";

/// The rows a batch read back (tagged `r`, each followed eventually by an
/// `n` row with the instant and the clock they were read at), in name
/// order.
pub(crate) struct ReadBacks {
    op: &'static str,
    rows: Vec<sql::ReadBack>,
    /// Whether a row came back that no item named, byte for byte: a table
    /// made by hand whose `name` column ignores case matched another
    /// election's row.
    stray: bool,
}

/// `bytes` as a new `String` allocated by the thread that calls this
/// (`None`: not UTF-8).
///
/// Why not take the row's own buffer: a batch's rows are read on the call's
/// own thread, so with glibc's allocator their bytes sit in that thread's
/// arena among the batch's large short-lived buffers (statement text, rows,
/// hundreds of KiB). Leases the caller keeps for seconds (two strings each,
/// for every election of a group) then pinned pages all over those arenas,
/// and each new large buffer had to extend them: a process running 10,000
/// elections on MariaDB grew by about 0.2 MiB a second (heap in use flat at
/// about 35 MiB, 46 MiB of one arena free in 8,800 pieces between 19,600
/// live 32-byte strings, nearly all lease names and holders). Copied on
/// the caller's thread, the strings live with the caller's other
/// long-lived data.
pub(crate) fn text_copy(bytes: &[u8]) -> Option<String> {
    std::str::from_utf8(bytes).ok().map(str::to_owned)
}

impl ReadBacks {
    /// `items` in name order, as every batch sorts them.
    pub(crate) fn new(op: &'static str, rows: Vec<Vec<Value>>, items: &[Item]) -> Result<ReadBacks, StoreError> {
        let bad = |what: &str| StoreError::fatal(format!("mysql {op}: cannot read the lease row ({what})"));
        // Copied, not moved out of the row: a row's bytes were allocated on
        // the call's thread, and a lease kept for seconds by the caller must
        // not be (see `text_copy`).
        let text = |v: &Value| match v {
            Value::Bytes(b) => text_copy(b).ok_or_else(|| bad("text that is not UTF-8")),
            _ => Err(bad("not a byte string")),
        };
        let mut out: Vec<sql::ReadBack> = Vec::with_capacity(rows.len());
        let mut read = 0;
        for r in rows {
            match r.first() {
                Some(Value::Bytes(t)) if t == b"r" && r.len() == 8 => {
                    let int = |r: &[Value], k: usize| sql::int_value(&r[k]).ok_or_else(|| bad("not an integer"));
                    let fence =
                        u64::try_from(int(&r, 3)?).ok().filter(|&f| f > 0).ok_or_else(|| bad("fence not positive"))?;
                    let (acquired_at, renewed_at, expires_at) = (int(&r, 4)?, int(&r, 5)?, int(&r, 6)?);
                    let Value::Bytes(payload) = &r[7] else {
                        return Err(bad("not a byte string"));
                    };
                    let lease = Lease {
                        name: text(&r[1])?,
                        holder: text(&r[2])?,
                        fence,
                        acquired_at: DbTime::from_unix_micros(acquired_at),
                        renewed_at: DbTime::from_unix_micros(renewed_at),
                        expires_at: DbTime::from_unix_micros(expires_at),
                        now: DbTime::from_unix_micros(0),
                        payload: payload.as_slice().to_vec(),
                    };
                    out.push(sql::ReadBack { lease, at: DbTime::from_unix_micros(0), row_count: 0, committed: false });
                }
                Some(Value::Bytes(t)) if t == b"n" && r.len() == 3 => {
                    let at = DbTime::from_unix_micros(sql::int_value(&r[1]).ok_or_else(|| bad("not an integer"))?);
                    let now = DbTime::from_unix_micros(sql::int_value(&r[2]).ok_or_else(|| bad("not an integer"))?);
                    for rb in &mut out[read..] {
                        rb.at = at;
                        rb.lease.now = now;
                    }
                    read = out.len();
                }
                _ => {}
            }
        }
        if read != out.len() {
            return Err(bad("no clock reading after the rows"));
        }
        // The statements read in the primary key's order, which is the
        // names' byte order on this store's tables.
        if !out.is_sorted_by(|a, b| a.lease.name <= b.lease.name) {
            out.sort_by(|a, b| a.lease.name.cmp(&b.lease.name));
        }
        let stray =
            out.iter().any(|rb| items.binary_search_by(|it| it.name.as_slice().cmp(rb.lease.name.as_bytes())).is_err());
        Ok(ReadBacks { op, rows: out, stray })
    }

    /// `name`'s row, or `None` for no row; an error when the batch read
    /// another election's row instead, as the single calls refuse one.
    /// `again`: another item names it too, so it stays for that one.
    pub(crate) fn take(&mut self, name: &[u8], again: bool) -> Result<Option<sql::ReadBack>, StoreError> {
        let found = match self.rows.binary_search_by(|rb| rb.lease.name.as_bytes().cmp(name)) {
            Ok(k) if again => {
                let rb = &self.rows[k];
                Some(sql::ReadBack { lease: rb.lease.clone(), at: rb.at, row_count: rb.row_count, committed: false })
            }
            Ok(k) => {
                // Moved out, but for its name, which keeps the rows in order.
                let rb = &mut self.rows[k];
                let left =
                    Lease { name: rb.lease.name.clone(), holder: String::new(), payload: Vec::new(), ..rb.lease };
                Some(sql::ReadBack {
                    lease: std::mem::replace(&mut rb.lease, left),
                    at: rb.at,
                    row_count: rb.row_count,
                    committed: false,
                })
            }
            Err(_) => None,
        };
        match found {
            Some(rb) => Ok(Some(rb)),
            None if self.stray => Err(StoreError::fatal(format!(
                "mysql {}: the row read back is another election's (does the table's name column ignore case?)",
                self.op
            ))),
            None => Ok(None),
        }
    }
}

/// `inspect_many`: the rows of `names` (sorted, distinct) in one
/// read-only transaction, as the single inspect reads one: a plain read,
/// no lock, `now` the server's clock as each statement read. `refused`
/// holds places in `names`.
pub(crate) fn inspect(table: String, names: Vec<Vec<u8>>) -> Job<Done> {
    Box::new(move |conn, env| {
        let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
        let fixed = 160 + LEASE.len() + 2 * NOW.len() + table.len();
        let each = |k: usize| refs[k].len() * 2 + 5;
        let (groups, too_big) =
            chunks(refs.len(), room(env), &Size { fixed, each: &each, payload: None, shared: false });
        let mut script = Script::new(env.budget);
        script.push(&pin(env));
        script.push(sql::READ_BEGIN);
        for g in groups {
            script.push(&format!(
                "SELECT 'r', {LEASE} FROM {table} {BY_KEY} WHERE name IN ({}); SELECT 'n', {NOW}, {NOW};",
                list(refs[g].iter().copied())
            ));
        }
        script.finish(&[]);
        let rows = script.run(conn)?;
        let refused = too_big.into_iter().map(|(k, len)| (k, too_large("inspect", len, env))).collect();
        Ok(Done { rows, refused })
    })
}

/// The rows `items` name by `(name, fence)`, byte for byte (a hand-made
/// table with a case-insensitive collation could otherwise match another
/// election's row), held by `i`: a `WHERE` whose `name IN (…)` the range
/// optimizer turns into lookups of the primary key, in its order. Not
/// `(name, fence) IN (…)` alone: with one pair MariaDB plans that as a
/// scan of the whole primary key (seen with `EXPLAIN`), and an `UPDATE`
/// planned so locks every row of the table.
fn by_term(items: &[Item], i: &str) -> String {
    use std::fmt::Write;
    let mut pairs = String::new();
    for it in items {
        if !pairs.is_empty() {
            pairs.push_str(", ");
        }
        pairs.push('(');
        sql::hex_into(&mut pairs, &it.name);
        let _ = write!(pairs, ", {})", it.fence);
    }
    format!(
        "name IN ({}) AND (CAST(name AS BINARY), fence) IN ({pairs}) AND CAST(holder AS BINARY) = {i}",
        list(items.iter().map(|it| it.name.as_slice()))
    )
}

/// Bytes of [`by_term`]'s text per item.
fn by_term_each(it: &Item) -> usize {
    it.name.len() * 4 + 34
}

/// `release_many`: each item's term ended as [`sql::release`] ends one
/// (same guard, same writes), in name order.
pub(crate) fn release(table: String, i: String, items: Vec<Item>) -> Job<Done> {
    Box::new(move |conn, env| {
        let (items, held) = begin_without_held("release_many", &items, &table, conn, env)?;
        let fixed = 400 + 5 * AT.len() + HISTORY.len() + table.len() + i.len();
        let each = |k: usize| by_term_each(&items[k]);
        let (groups, too_big) =
            chunks(items.len(), room(env), &Size { fixed, each: &each, payload: None, shared: false });
        let mut script = Script::new(env.budget);
        for g in groups {
            script.push(&format!(
                "UPDATE {table} {BY_KEY} SET renewed_at = GREATEST(renewed_at, {AT}), expires_at = {AT} \
                 WHERE {} AND expires_at > {AT} AND (history IS NULL OR history = {HISTORY});",
                by_term(&items[g], &i)
            ));
        }
        script.finish(&[]);
        let rows = script.run(conn)?;
        let mut refused: Vec<_> =
            too_big.into_iter().map(|(k, len)| (items[k].at, too_large("release", len, env))).collect();
        refused.extend(held);
        Ok(Done { rows, refused })
    })
}

/// What a renewal batch does besides its renewals.
#[derive(Clone, Default)]
pub(crate) struct Also {
    /// Whether the renewals are read back after the `COMMIT` (see
    /// [`committed_checks`]).
    pub check: bool,
    /// A group member's heartbeat statements ([`sql::heartbeat`]),
    /// run in the renewals' transaction after them, so the two are one
    /// transaction: its row `'members', …` comes back among the batch's.
    pub heartbeat: Option<String>,
}

/// `renew_many`: each item renewed as [`sql::renew`] renews one (same
/// guard, same writes), in name order, then every item's row read back
/// by a plain read after all the writes (the transaction's snapshot then
/// holds every renewal of this call; a row it did not renew is lost,
/// whatever it holds now).
///
/// On MariaDB the read-back of a chunk is first a scan of the primary key
/// from its first name to its last for the rows this call renewed
/// (`renewed_at` its instant, `holder` this identity), bounded by `LIMIT
/// ROWS EXAMINED` ([`SCAN_PER_ITEM`] rows an item): a chunk's names lie
/// among the other participants' elections, and reading the rows next to
/// each other costs the server a third of looking each name up (measured:
/// 4.4 against 12–13 ms for 3,334 names among 10,000 rows; the whole
/// renewal 32 against 42 ms). The `UPDATE`'s `ROW_COUNT()` says how many
/// rows the scan must find; a chunk whose scan found fewer (it stopped at
/// its bound, or a hand-made table's collation orders the names otherwise)
/// has its other names looked up as before, in a second query of the same
/// transaction. Which rows count as renewed is decided as before, per row
/// ([`renewed`]); the scan only chooses which rows are read.
///
/// Items that publish one payload (a group's usual case) go in one
/// `UPDATE … WHERE (name, fence) IN (…)` per chunk, which locks in the
/// primary key's order; a chunk whose payloads differ takes its rows'
/// locks in that order first, then updates them from a derived table of
/// its values.
pub(crate) fn renew(table: String, i: String, ttl: Duration, items: Vec<Item>, also: Also) -> Job<Done> {
    Box::new(move |conn, env| {
        let (items, held) = begin_without_held("renew_many", &items, &table, conn, env)?;
        let t = sql::ttl_micros(ttl);
        let fixed = 1200 + 12 * AT.len() + 4 * HISTORY.len() + 3 * table.len() + i.len();
        let each = |k: usize| by_term_each(&items[k]) + 40;
        let payload = |k: usize| items[k].payload.as_slice();
        let size = Size { fixed, each: &each, payload: Some(&payload), shared: true };
        let (groups, too_big) = chunks(items.len(), room(env), &size);
        let mut script = Script::new(env.budget);
        let guard = format!("(expires_at > {AT} OR COALESCE(history <> {HISTORY}, FALSE)) AND renewed_at <= {AT}");
        let mut spans = Vec::new();
        for g in groups {
            let chunk = &items[g.clone()];
            if chunk.iter().all(|it| it.payload == chunk[0].payload) {
                script.push(&format!(
                    "UPDATE {table} {BY_KEY} SET renewed_at = {AT}, payload = {}, \
                     expires_at = GREATEST(expires_at, {AT} + {t}), history = {HISTORY} WHERE {} AND {guard};",
                    sql::hex(&chunk[0].payload),
                    by_term(chunk, &i),
                ));
            } else {
                let names = list(chunk.iter().map(|it| it.name.as_slice()));
                let mut values = String::new();
                for (k, it) in chunk.iter().enumerate() {
                    let (n, p) = (sql::hex(&it.name), sql::hex(&it.payload));
                    if k == 0 {
                        values.push_str(&format!("SELECT {n} AS n, {} AS f, {p} AS p", it.fence));
                    } else {
                        values.push_str(&format!(" UNION ALL SELECT {n}, {}, {p}", it.fence));
                    }
                }
                script.push(&format!(
                    "SELECT 'l', name FROM {table} {BY_KEY} WHERE name IN ({names}) ORDER BY name FOR UPDATE; \
                     UPDATE ({values}) AS v STRAIGHT_JOIN {table} AS le {BY_KEY} ON le.name = v.n \
                     SET le.renewed_at = {AT}, le.payload = v.p, \
                     le.expires_at = GREATEST(le.expires_at, {AT} + {t}), le.history = {HISTORY} \
                     WHERE CAST(le.name AS BINARY) = v.n AND le.fence = v.f AND CAST(le.holder AS BINARY) = {i} \
                     AND (le.expires_at > {AT} OR COALESCE(le.history <> {HISTORY}, FALSE)) AND le.renewed_at <= {AT};"
                ));
            }
            if env.rows_examined {
                script.push("SELECT 'c', ROW_COUNT();");
            }
            spans.push(g);
        }
        let mut rows = Vec::new();
        let mut again: Vec<&[u8]> = Vec::new();
        if env.rows_examined {
            for g in &spans {
                let (first, last) = (sql::hex(&items[g.start].name), sql::hex(&items[g.end - 1].name));
                script.push(&format!(
                    "SELECT 'r', {LEASE} FROM {table} {BY_KEY} WHERE name BETWEEN {first} AND {last} \
                     AND renewed_at = {AT} AND CAST(holder AS BINARY) = {i} LIMIT ROWS EXAMINED {}; SELECT 'e';",
                    g.len() * SCAN_PER_ITEM + 16
                ));
            }
            let scanned = std::mem::replace(&mut script, Script::new(env.budget)).run(conn)?;
            rows = scanned_rows(scanned, &items, &spans, &mut again);
        } else {
            again.extend(items.iter().map(|it| it.name.as_slice()));
        }
        for g in name_chunks(&again, room(env), 200 + LEASE.len() + table.len()) {
            script.push(&format!(
                "SELECT 'r', {LEASE} FROM {table} {BY_KEY} WHERE name IN ({});",
                list(again[g].iter().copied())
            ));
        }
        script.push(&format!("SELECT 'n', {AT}, {NOW};"));
        if let Some(beat) = &also.heartbeat {
            script.push(beat);
        }
        let names: Vec<&[u8]> = items.iter().map(|it| it.name.as_slice()).collect();
        script.finish(&committed_checks(also.check, &table, &i, &names, room(env)));
        rows.extend(script.run(conn)?);
        let mut refused: Vec<_> =
            too_big.into_iter().map(|(k, len)| (items[k].at, too_large("renew", len, env))).collect();
        refused.extend(held);
        Ok(Done { rows, refused })
    })
}

/// Items from which a renewal runs as two halves at once, each a
/// transaction on a connection of its own: a renewal batch is the
/// server's work (seven `UPDATE`s of 500 rows and their read-back for
/// 3,334 items), and on two connections it takes two of the server's
/// threads (measured by hand, 3,334 items among 10,000 rows: 26.5-27.7 ms
/// a renewal as two halves at once against 47-51 ms whole, in one loop).
/// Each half locks its rows in name order and the halves hold disjoint
/// ranges of names, so a batch that locks in name order, as every batch
/// does, still cannot deadlock with them. Each item's outcome is decided
/// by its own row as before; a half that fails fails its own items.
///
/// From 2,000 items, not 1,000 as before issue 35: a group member that
/// leads that many terms already renews them as two batches at two slots
/// of the interval (`GroupMachineConfig::split_renewals_from`, 2,000 by
/// default), so each of its batches (1,667 rows at 10,000 elections over
/// three members) stays one transaction; halves there made each renewal
/// two transactions, four a member per interval where two do.
pub(crate) const HALVES_FROM: usize = 4 * CHUNK;

/// Where a renewal of `items` (in name order) splits into two halves run
/// at once (see [`HALVES_FROM`]), if it does: with that many items and a
/// pool of two connections or more, at the middle or the first place
/// after it where the name changes (an election named twice stays in one
/// half, whose read-back answers both).
pub(crate) fn halves(items: &[Item], pool: usize) -> Option<usize> {
    if items.len() < HALVES_FROM || pool < 2 {
        return None;
    }
    (items.len() / 2..items.len()).find(|&k| items[k - 1].name != items[k].name)
}

/// Rows of the primary key a renewal's scan may examine per item of its
/// chunk (see [`renew`]): a scan row costs the server about a seventh of a
/// lookup by name, so a scan that stops at this bound costs less than the
/// lookups it then leaves to do, and a chunk among up to five other
/// elections per name is read by the scan alone.
const SCAN_PER_ITEM: usize = 6;

/// The rows of a renewal's first query (see [`renew`]) that the read-back
/// keeps: every chunk's scanned rows that name one of its items, when the
/// scan found as many as the chunk's `UPDATE` renewed; else those are
/// dropped and the chunk's names go to `again`, to be looked up. `spans`
/// are the chunks, in order; each `UPDATE` answered a row `'c', count` and
/// each scan ended with a row `'e'`.
fn scanned_rows<'a>(
    rows: Vec<Vec<Value>>, items: &'a [Item], spans: &[Range<usize>], again: &mut Vec<&'a [u8]>,
) -> Vec<Vec<Value>> {
    let counts: Vec<Option<i64>> = tagged(&rows, "c").map(|r| r.first().and_then(sql::int_value)).collect();
    let (mut kept, mut chunk, mut found) = (Vec::new(), 0, Vec::new());
    for r in rows {
        let tag = match r.first() {
            Some(Value::Bytes(t)) => t.as_slice(),
            _ => b"",
        };
        match tag {
            b"r" => {
                let Some(g) = spans.get(chunk) else { continue };
                let named = match r.get(1) {
                    Some(Value::Bytes(n)) => items[g.clone()].binary_search_by(|it| it.name.as_slice().cmp(n)).is_ok(),
                    _ => false,
                };
                if named {
                    found.push(r);
                }
            }
            b"e" => {
                if let Some(g) = spans.get(chunk) {
                    if counts.get(chunk).copied().flatten() == Some(found.len() as i64) {
                        kept.append(&mut found);
                    } else {
                        found.clear();
                        again.extend(items[g.clone()].iter().map(|it| it.name.as_slice()));
                    }
                }
                chunk += 1;
            }
            _ => {}
        }
    }
    // A chunk whose scan did not end (no rows came for it) is looked up.
    for g in spans.iter().skip(chunk) {
        again.extend(items[g.clone()].iter().map(|it| it.name.as_slice()));
    }
    kept
}

/// Whether a read-back row is the renewal this call wrote for an item of
/// `fence`: it names this identity and that fence, and was written at
/// this call's instant (a row the guard refused keeps its earlier
/// `renewed_at`, or got a later one from somebody else).
pub(crate) fn renewed(rb: &sql::ReadBack, identity: &str, fence: u64) -> bool {
    rb.lease.renewed_at == rb.at && rb.lease.holder == identity && rb.lease.fence == fence
}

/// With `check`, the reads after a batch's `COMMIT` that show whether it
/// took (see [`sql::committed`]), one read-only transaction: per group of
/// `names` (the chunks the statements named), whether any of its rows
/// holds this identity and this call's instant. A transaction commits
/// whole or not at all, so one row this call wrote, seen committed, shows
/// every row it wrote committed; and a call whose commit did not take
/// wrote none that anyone sees. Without `check`, none.
fn committed_checks(check: bool, table: &str, i: &str, names: &[&[u8]], room: usize) -> Vec<String> {
    if !check {
        return Vec::new();
    }
    let reads = name_chunks(names, room, 200 + table.len() + i.len() + AT.len())
        .into_iter()
        .map(|g| sql::committed_read(table, &format!("name IN ({})", list(names[g].iter().copied())), i));
    std::iter::once(sql::READ_BEGIN.to_owned()).chain(reads).chain([COMMIT.to_owned()]).collect()
}

/// Whether the reads [`committed_checks`] sent after a batch's `COMMIT`
/// saw any row of this call's committed: if not, none of its claims or
/// renewals counts.
pub(crate) fn took(rows: &[Vec<Value>]) -> bool {
    sql::committed_count(rows) > 0
}

/// The claim's settings for one batch.
pub(crate) struct Claim {
    pub table: String,
    pub identity: String,
    pub ttl: Duration,
    pub failover_rule: bool,
    /// On a multi-primary cluster, the terms table each claim of a new
    /// term also writes (see [`super::cluster`]).
    pub terms: Option<String>,
    /// How long after its expiry a row counts as expired for a claim (see
    /// [`sql::CLAIMABLE`]).
    pub skew: Duration,
    /// Whether the claims are read back after the `COMMIT` (see
    /// [`committed_checks`]).
    pub check: bool,
}

/// The retryable answer of an item whose claim a lock held off.
pub(crate) fn locked() -> StoreError {
    StoreError::retryable(
        "mysql acquire: the row, or the next election's, is locked by another transaction (a lease check in a \
         program's open transaction holds claims off until it ends); not claimed",
    )
}

/// `acquire_many` (see the module's notes): each item claimed as
/// [`sql::acquire`] claims one, with the same conditions on the old row, at
/// the one instant, in two transactions on the session.
///
/// 1. **The look**, which waits only for locks it takes in name order and
///    never while it holds one it took out of that order:
///    - the rows from the one before the batch's first name to the one
///      after its last, by a plain read (no lock): which names have a
///      row, each row's expiry at the call's instant, whether it was
///      written under another server's history and whether it is the
///      caller's; so which items are candidates (no row, or expired) and
///      every name's neighbours;
///    - on servers that have `SKIP LOCKED`, the index entries each
///      candidate's claim changes or inserts next to (an expired row's own
///      and its next neighbour's, a new row's two neighbours'): their rows
///      locked through the primary key in name order, waiting for their
///      writers (another batch's claim, a renewal), which finish in
///      milliseconds (a check does not lock there, except under
///      `SERIALIZABLE`, where every read locks), a second at most (see
///      [`lock_rows`]); then the entries themselves with `FOR UPDATE SKIP
///      LOCKED` through that index. Every writer of an entry holds its
///      row's lock first, which the look now has, so an entry it does not
///      get is a check's: that candidate is left out, answered retryable;
///    - the expired rows inherited from another server's history held for
///      nobody, as the single claim holds them (their entries are the
///      look's: this waits for nothing). Commit.
/// 2. **The claim**, in name order: runs of existing rows the claim may
///    change (expired, or the caller's) as `UPDATE`s with
///    [`sql::claim_assignments`], runs of names without a row as multi-row
///    `INSERT … ON DUPLICATE KEY UPDATE` with the same assignments (a name
///    that got a row meanwhile is decided as the single claim decides it).
///    So every lock the claim may wait for comes in that one order, and
///    two batches never deadlock, also on names no row has yet (a gap
///    locked first and inserted into after, by two at once, would). Then
///    every item's row read back by a plain read: the claim's own writes,
///    and the other rows as last committed (a row the call did not write
///    needs no lock to be reported as it stands). Commit.
///
/// The look's locks are gone before the claim waits for anything. What
/// changed in between (milliseconds: a lease released at an instant
/// before the call's, a row created next to a candidate) was not looked
/// at; such a claim may wait for a check, as a single claim would. Rows
/// that exist are claimed by `UPDATE` because an `INSERT … ON DUPLICATE
/// KEY UPDATE` that finds its row is several times slower (measured here:
/// 3,333 claims of expired rows took about 190 ms that way, 30 to 50 ms as
/// `UPDATE`s).
pub(crate) fn acquire(c: Claim, items: Vec<Item>) -> Job<(Done, HashSet<Vec<u8>>)> {
    Box::new(move |conn, env| acquire_now(&c, &items, conn, env))
}

/// A row as the look saw it: expired at the call's instant, inherited
/// from another server's history, the caller's.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    expired: bool,
    inherited: bool,
    own: bool,
}

fn seen(r: &[Value]) -> Option<(Vec<u8>, Seen)> {
    let s = Seen { expired: flag(r.get(1)?), inherited: flag(r.get(2)?), own: flag(r.get(3)?) };
    Some((r.first().and_then(bytes)?, s))
}

fn acquire_now(c: &Claim, items: &[Item], conn: &mut Conn, env: &Env) -> Result<(Done, HashSet<Vec<u8>>), Failed> {
    let (table, i, t) = (&c.table, &c.identity, sql::ttl_micros(c.ttl));
    let mut names: Vec<&[u8]> = items.iter().map(|it| it.name.as_slice()).collect();
    names.dedup();
    let inherited = if c.failover_rule { format!("COALESCE(history <> {HISTORY}, FALSE)") } else { "FALSE".into() };
    let flags = format!("expires_at <= {CLAIMABLE}, {inherited}, {}", sql::exactly("holder", i));
    let listing = 200 + flags.len() + table.len();

    // The look: every row from the one before the first name to the one
    // after the last, in REPEATABLE READ's snapshot.
    let (lo, hi) = (sql::hex(names[0]), sql::hex(names[names.len() - 1]));
    let mut script = Script::new(env.budget);
    script.push(&pin(env));
    script.push(&sql::claimable(c.skew));
    script.push(BEGIN);
    script.push(&format!(
        "SELECT 'd', name, {flags} FROM {table} {BY_KEY} \
         WHERE name >= COALESCE((SELECT MAX(name) FROM {table} {BY_KEY} WHERE name < {lo}), {lo}) \
         AND name <= COALESCE((SELECT MIN(name) FROM {table} {BY_KEY} WHERE name > {hi}), {hi});"
    ));
    let rows = script.run(conn)?;
    let mut existing: Vec<(Vec<u8>, Seen)> = tagged(&rows, "d").filter_map(seen).collect();
    existing.sort_by(|a, b| a.0.cmp(&b.0));
    existing.dedup_by(|a, b| a.0 == b.0);
    let at = |n: &[u8]| existing.partition_point(|e| e.0.as_slice() < n);
    let found = |n: &[u8]| existing.get(at(n)).filter(|e| e.0 == n).map(|e| e.1);
    let next = |n: &[u8]| existing.get(at(n) + usize::from(found(n).is_some())).map(|e| e.0.as_slice());
    let prev = |n: &[u8]| at(n).checked_sub(1).map(|k| existing[k].0.as_slice());
    let mut now: HashMap<&[u8], Seen> = names.iter().filter_map(|n| found(n).map(|s| (*n, s))).collect();

    // The candidates, each with the index entries its claim needs.
    let mut needs: Vec<(&[u8], Vec<&[u8]>)> = Vec::new();
    for &n in &names {
        match now.get(n) {
            Some(s) if s.expired => needs.push((n, std::iter::once(n).chain(next(n)).collect())),
            Some(_) => {}
            None => needs.push((n, prev(n).into_iter().chain(next(n)).collect())),
        }
    }
    let mut skipped: HashSet<Vec<u8>> = HashSet::new();
    if env.skip_locked && !needs.is_empty() {
        let mut rows: Vec<&[u8]> = needs.iter().flat_map(|(_, e)| e.iter().copied()).collect();
        rows.sort();
        rows.dedup();
        let (locked, held) = lock_rows(&rows, &flags, table, conn, env)?;
        for (n, s) in tagged(&locked, "k").filter_map(seen) {
            if let Ok(k) = names.binary_search(&n.as_slice()) {
                now.insert(names[k], s);
            }
        }
        // A candidate whose row is no longer expired is no longer one; one
        // whose rows another transaction held for long is left out.
        needs.retain(|(n, _)| !matches!(now.get(n), Some(s) if !s.expired));
        needs.retain(|(n, e)| {
            let keep = !e.iter().any(|r| held.contains(r));
            if !keep {
                skipped.insert(n.to_vec());
            }
            keep
        });
        let mut entries: Vec<&[u8]> = needs.iter().flat_map(|(_, e)| e.iter().copied()).collect();
        entries.sort();
        entries.dedup();
        let mut script = Script::new(env.budget);
        for g in name_chunks(&entries, room(env), listing) {
            script.push(&format!(
                "SELECT 'p', name FROM {table} FORCE INDEX ({TERM_INDEX}) WHERE name IN ({}) FOR UPDATE SKIP LOCKED;",
                list(entries[g].iter().copied())
            ));
        }
        match script.run(conn) {
            Ok(rows) => {
                let got: HashSet<Vec<u8>> = tagged(&rows, "p").filter_map(|r| r.first().and_then(bytes)).collect();
                for (n, e) in &needs {
                    if e.iter().any(|e| !got.contains(*e)) {
                        skipped.insert(n.to_vec());
                    }
                }
            }
            // A table without the index (made by hand, or by an older
            // version and never brought up to date): no lease check can
            // lock anything there (`check_lease` refuses such a table), so
            // nothing is held. The statement failed as its index was
            // looked up, before it ran; the transaction goes on as it was.
            Err(Failed { error: mysql::Error::MySqlError(e), .. }) if e.code == 1176 => {}
            Err(f) => return Err(f),
        }
    }
    let mut script = Script::new(env.budget);
    if c.failover_rule {
        let hold: Vec<&[u8]> = names
            .iter()
            .copied()
            .filter(|n| now.get(n).is_some_and(|s| s.expired && s.inherited) && !skipped.contains(*n))
            .collect();
        for g in name_chunks(&hold, room(env) / 2, 600 + table.len()) {
            let l = list(hold[g].iter().copied());
            script.push(&format!(
                "UPDATE {table} {BY_KEY} SET expires_at = GREATEST(expires_at, {AT} + GREATEST({t}, expires_at - \
                 renewed_at)), renewed_at = GREATEST(renewed_at, {AT}), holder = X'', history = {HISTORY} \
                 WHERE name IN ({l}) AND CAST(name AS BINARY) IN ({l}) AND {inherited} AND expires_at <= {CLAIMABLE};"
            ));
        }
    }
    script.push(COMMIT);

    // The claim, in name order, then every item's row read back.
    script.push(BEGIN);
    let claim: Vec<&Item> = items
        .iter()
        .filter(|it| !skipped.contains(&it.name))
        .filter(|it| now.get(it.name.as_slice()).is_none_or(|s| s.expired || s.own))
        .collect();
    let update_len = sql::claim_assignments("TRUE", &format!("NOT {inherited}"), i, t, "VALUES(payload)").len();
    let mut refused = Vec::new();
    let mut k = 0;
    while k < claim.len() {
        let new = !now.contains_key(claim[k].name.as_slice());
        let end =
            claim[k..].iter().position(|it| now.contains_key(it.name.as_slice()) == new).map_or(claim.len(), |p| k + p);
        let run = &claim[k..end];
        let payload = |j: usize| run[j].payload.as_slice();
        let (fixed, each): (usize, Box<dyn Fn(usize) -> usize>) = if new {
            (
                update_len + 2 * (table.len() + 300),
                Box::new(|j: usize| run[j].name.len() * 2 + 2 * i.len() + 8 * AT.len()),
            )
        } else {
            (update_len + 3 * (table.len() + 300), Box::new(|j: usize| run[j].name.len() * 6 + 20))
        };
        let size = Size { fixed, each: &*each, payload: Some(&payload), shared: !new };
        let (groups, too_big) = chunks(run.len(), room(env), &size);
        for g in groups {
            let rows: Vec<(&[u8], &[u8])> =
                run[g].iter().map(|it| (it.name.as_slice(), it.payload.as_slice())).collect();
            script.push(&if new {
                claim_statement(table, i, t, &rows, c.failover_rule)
            } else {
                claim_existing(table, i, t, &rows, c.failover_rule)
            });
        }
        refused.extend(too_big.into_iter().map(|(j, len)| (run[j].at, too_large("acquire", len, env))));
        k = end;
    }
    let read: Vec<&[u8]> = names.iter().copied().filter(|n| !skipped.contains(*n)).collect();
    for g in name_chunks(&read, room(env), 200 + LEASE.len() + table.len()) {
        script.push(&format!(
            "SELECT 'r', {LEASE} FROM {table} {BY_KEY} WHERE name IN ({});",
            list(read[g].iter().copied())
        ));
    }
    script.push(&format!("SELECT 'n', {AT}, {NOW};"));
    let claimed: Vec<&[u8]> = claim.iter().map(|it| it.name.as_slice()).collect();
    if let Some(terms) = &c.terms {
        for g in name_chunks(&claimed, room(env), 400 + 2 * table.len() + i.len()) {
            let names = list(claimed[g].iter().copied());
            script.push(&super::cluster::claim_terms(terms, table, &format!("name IN ({names})"), i));
        }
    }
    script.finish(&committed_checks(c.check, table, i, &claimed, room(env)));
    let rows = script.run(conn)?;
    Ok((Done { rows, refused }, skipped))
}

/// The start of a renew or release batch: the session pinned, the
/// transaction begun and, where the server has `SKIP LOCKED`, every item's
/// row locked in name order without waiting (`FOR UPDATE SKIP LOCKED`).
/// A row another transaction holds is tried again after a short pause
/// that doubles each time (2 ms to 50 ms), for at most [`HELD_RETRIES_FOR`]
/// or half the time left: another member's claim batch holds rows for
/// milliseconds. One still held then (an operator's `SELECT … FOR UPDATE`,
/// a long transaction) is left out of the batch and answered alone with a
/// retryable error: it costs its own term's renewal, not every term of the
/// batch its timeout, and the batch never waits on a lock. A row that is
/// not there is not held: the batch answers it as before. Returns the
/// items to write and those answers.
#[allow(clippy::type_complexity)]
fn begin_without_held(
    op: &str, items: &[Item], table: &str, conn: &mut Conn, env: &Env,
) -> Result<(Vec<Item>, Vec<(usize, StoreError)>), Failed> {
    let mut script = Script::new(env.budget);
    script.push(&pin(env));
    script.push(BEGIN);
    script.run(conn)?;
    if !env.skip_locked || items.is_empty() {
        return Ok((items.to_vec(), Vec::new()));
    }
    let mut left: Vec<&[u8]> = items.iter().map(|it| it.name.as_slice()).collect();
    left.sort();
    left.dedup();
    let (mut pause, mut give_up) = (Duration::from_millis(2), None);
    loop {
        let mut script = Script::new(env.budget);
        for g in name_chunks(&left, room(env), 200 + table.len()) {
            let names = list(left[g].iter().copied());
            script.push(&format!(
                "SELECT 'k', name FROM {table} {BY_KEY} WHERE name IN ({names}) ORDER BY name FOR UPDATE SKIP LOCKED;"
            ));
        }
        let rows = script.run(conn)?;
        let got: HashSet<Vec<u8>> = tagged(&rows, "k").filter_map(|r| r.first().and_then(bytes)).collect();
        left.retain(|n| !got.contains(*n));
        if left.is_empty() {
            break;
        }
        let now = Instant::now();
        let until = *give_up
            .get_or_insert_with(|| now + (env.deadline.saturating_duration_since(now) / 2).min(HELD_RETRIES_FOR));
        if now + pause >= until {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    // Of the rows not locked, those that exist are held by another
    // transaction (a plain read does not wait).
    let mut held: HashSet<Vec<u8>> = HashSet::new();
    if !left.is_empty() {
        let mut script = Script::new(env.budget);
        for g in name_chunks(&left, room(env), 200 + table.len()) {
            let names = list(left[g].iter().copied());
            script.push(&format!("SELECT 'x', name FROM {table} {BY_KEY} WHERE name IN ({names});"));
        }
        let rows = script.run(conn)?;
        held.extend(tagged(&rows, "x").filter_map(|r| r.first().and_then(bytes)));
    }
    let (free, busy): (Vec<&Item>, Vec<&Item>) = items.iter().partition(|it| !held.contains(&it.name));
    let answers = busy
        .into_iter()
        .map(|it| {
            let name = String::from_utf8_lossy(&it.name);
            let e = StoreError::retryable(format!(
                "mysql {op}: the row of election {name:?} is locked by another transaction; not written, not waited for"
            ));
            (it.at, e)
        })
        .collect();
    Ok((free.into_iter().cloned().collect(), answers))
}

/// How long a renew or release batch keeps trying again to lock a row
/// another transaction holds (see [`begin_without_held`]).
const HELD_RETRIES_FOR: Duration = Duration::from_millis(500);

/// The look's locks on `rows` (sorted) through the primary key, in name
/// order, one query per [`CHUNK`]: every row found (tagged `k`, with
/// `flags`), and the rows another transaction held for longer than a
/// second. Each lock waits a second at most (the server's smallest
/// bound), which a writer of these rows (a claim, a renewal, a release,
/// all short transactions) does not last; a chunk that waits longer is
/// taken again with `SKIP LOCKED`, and what that does not get was held
/// by something slower (a program's own lock on the row, a transaction
/// under `SERIALIZABLE` that read it): a candidate needing it is left out
/// rather than the whole batch waiting. The locks are taken in name order
/// either way, so the look still waits only in that order. The call's own
/// bound comes back after.
#[allow(clippy::type_complexity)]
fn lock_rows<'a>(
    rows: &[&'a [u8]], flags: &str, table: &str, conn: &mut Conn, env: &Env,
) -> Result<(Vec<Vec<Value>>, HashSet<&'a [u8]>), Failed> {
    let run = |conn: &mut Conn, q: &str| query(conn, q).map_err(|e| Failed::sending(e, q));
    let mut locked = Vec::new();
    let mut held = HashSet::new();
    run(conn, "SET SESSION innodb_lock_wait_timeout = 1")?;
    for g in name_chunks(rows, room(env), 200 + flags.len() + table.len()) {
        let names = list(rows[g.clone()].iter().copied());
        let q =
            format!("SELECT 'k', name, {flags} FROM {table} {BY_KEY} WHERE name IN ({names}) ORDER BY name FOR UPDATE");
        match query(conn, &q) {
            Ok(r) => locked.extend(r),
            Err(mysql::Error::MySqlError(e)) if e.code == 1205 => {
                let got = run(conn, &format!("{q} SKIP LOCKED"))?;
                let found: HashSet<Vec<u8>> = tagged(&got, "k").filter_map(|r| r.first().and_then(bytes)).collect();
                held.extend(rows[g].iter().copied().filter(|r| !found.contains(*r)));
                locked.extend(got);
            }
            Err(e) => return Err(Failed::sending(e, &q)),
        }
    }
    let s = sql::lock_wait_secs(env.deadline.saturating_duration_since(Instant::now()));
    run(conn, &format!("SET SESSION innodb_lock_wait_timeout = {s}"))?;
    Ok((locked, held))
}

/// The claim of `rows` (name, payload) that have no row (as the look
/// saw it), for the identity literal `i`: one `INSERT … ON DUPLICATE KEY
/// UPDATE` with [`sql::claim_update`]'s assignments, the values' own name
/// and payload through `VALUES()`: a new row is written as the single
/// claim writes one, and a name that got a row meanwhile gets exactly the
/// single claim's changes. `rows` in name order (the order it locks in).
pub(crate) fn claim_statement(table: &str, i: &str, t: u128, rows: &[(&[u8], &[u8])], failover_rule: bool) -> String {
    let inherited = if failover_rule { format!("COALESCE(history <> {HISTORY}, FALSE)") } else { "FALSE".into() };
    let update =
        sql::claim_update("CAST(name AS BINARY) = VALUES(name)", &format!("NOT {inherited}"), i, t, "VALUES(payload)");
    let mut values = String::new();
    for (n, p) in rows {
        if !values.is_empty() {
            values.push_str(", ");
        }
        values.push_str(&format!(
            "({}, {i}, GREATEST(1, {AT}), {AT}, {AT}, {AT} + {t}, {}, 1, {HISTORY})",
            sql::hex(n),
            sql::hex(p)
        ));
    }
    format!(
        "INSERT INTO {table} (name, holder, fence, acquired_at, renewed_at, expires_at, payload, terms, history) \
         VALUES {values} {update};"
    )
}

/// The claim of existing `rows` (name, payload, in name order) as an
/// `UPDATE` of just those rows (named byte for byte) with
/// [`sql::claim_assignments`]: one statement when they publish one
/// payload; otherwise their locks taken in name order first, then an
/// update from a derived table of their values.
pub(crate) fn claim_existing(table: &str, i: &str, t: u128, rows: &[(&[u8], &[u8])], failover_rule: bool) -> String {
    let inherited = if failover_rule { format!("COALESCE(history <> {HISTORY}, FALSE)") } else { "FALSE".into() };
    let not_inherited = format!("NOT {inherited}");
    let names = list(rows.iter().map(|r| r.0));
    if rows.iter().all(|r| r.1 == rows[0].1) {
        let set = sql::claim_assignments("TRUE", &not_inherited, i, t, &sql::hex(rows[0].1));
        return format!(
            "UPDATE {table} {BY_KEY} SET {set} WHERE name IN ({names}) AND CAST(name AS BINARY) IN ({names});"
        );
    }
    let mut values = String::new();
    for (k, (n, p)) in rows.iter().enumerate() {
        let (n, p) = (sql::hex(n), sql::hex(p));
        if k == 0 {
            values.push_str(&format!("SELECT {n} AS n, {p} AS p"));
        } else {
            values.push_str(&format!(" UNION ALL SELECT {n}, {p}"));
        }
    }
    let set = sql::claim_assignments("TRUE", &not_inherited, i, t, "v.p");
    format!(
        "SELECT 'l', name FROM {table} {BY_KEY} WHERE name IN ({names}) ORDER BY name FOR UPDATE; \
         UPDATE ({values}) AS v STRAIGHT_JOIN {table} {BY_KEY} ON {table}.name = v.n SET {set} \
         WHERE CAST({table}.name AS BINARY) = v.n;"
    )
}

/// Turns a read-back into the answer of one claim, as the single
/// `acquire` decides it: a row that names this identity was claimed or
/// extended by this call, and must be what it wrote; any other row is the
/// race lost, reported as it stands.
pub(crate) fn claimed(
    rb: Result<Option<sql::ReadBack>, StoreError>, identity: &str, ttl: Duration, payload: &[u8],
) -> Result<Lease, StoreError> {
    let Some(rb) = rb? else {
        return Err(StoreError::retryable("mysql acquire: no row after the write; outcome unknown"));
    };
    if rb.lease.holder == identity {
        return sql::check_written("acquire", rb, identity, ttl, payload, None);
    }
    Ok(rb.lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str, fence: u64, payload: &[u8]) -> Item {
        Item { at: 0, name: name.as_bytes().to_vec(), fence, payload: payload.to_vec() }
    }

    /// A batch's session gives up on its client within the call's own
    /// bound (and its end puts the server's defaults back).
    #[test]
    fn a_batch_bounds_how_long_the_server_waits_for_it() {
        let env = Env {
            budget: 1 << 20,
            skip_locked: true,
            rows_examined: true,
            deadline: Instant::now() + Duration::from_secs(8),
        };
        let p = pin(&env);
        assert!(p.contains("innodb_lock_wait_timeout = 5, lock_wait_timeout = 5;"), "{p}");
        assert!(p.ends_with("SET SESSION wait_timeout = 5, net_read_timeout = 5, net_write_timeout = 5;"), "{p}");
        let u = unpin();
        assert!(u.starts_with(
            "SET SESSION wait_timeout = DEFAULT, net_read_timeout = DEFAULT, net_write_timeout = DEFAULT;"
        ));
        assert!(u.ends_with(&sql::unpin()));
    }

    #[test]
    fn a_large_renewal_splits_in_halves_between_two_names() {
        let names: Vec<String> = (0..2_001).map(|k| format!("e{k:04}")).collect();
        let mut items: Vec<Item> = names.iter().map(|n| item(n, 1, b"")).collect();
        assert_eq!(halves(&items[..1_999], 4), None, "fewer than HALVES_FROM");
        assert_eq!(halves(&items[..1_667], 4), None, "a group member's half of 10,000 over three: whole");
        assert_eq!(halves(&items, 1), None, "a pool of one");
        assert_eq!(halves(&items, 2), Some(1_000));
        // The election at the middle named twice: both in the second half.
        items[1_000] = item(&names[999], 1, b"");
        assert_eq!(halves(&items, 2), Some(1_001));
        // Every name the same from the middle on: no split.
        let same: Vec<Item> = (0..2_000).map(|k| item(if k < 1_000 { &names[k] } else { "z" }, 1, b"")).collect();
        assert_eq!(halves(&same, 2), Some(1_000));
        let all: Vec<Item> = (0..2_000).map(|_| item("z", 1, b"")).collect();
        assert_eq!(halves(&all, 2), None);
    }

    #[test]
    fn chunks_hold_at_most_chunk_items_within_room_in_order() {
        let each = |_: usize| 10;
        let size = Size { fixed: 100, each: &each, payload: None, shared: false };
        let (groups, big) = chunks(1234, usize::MAX, &size);
        assert!(big.is_empty());
        assert_eq!(groups, vec![0..500, 500..1000, 1000..1234]);
        let (groups, _) = chunks(10, 100 + 3 * 10, &size);
        assert_eq!(groups, vec![0..3, 3..6, 6..9, 9..10], "three items fit beside the fixed text");
        assert_eq!(chunks(0, 1000, &size).0, Vec::<Range<usize>>::new());
    }

    #[test]
    fn an_item_too_large_for_any_statement_is_refused_alone() {
        let payloads: Vec<Vec<u8>> = vec![vec![1; 10], vec![2; 10], vec![3; 1000], vec![4; 10]];
        let payload = |k: usize| payloads[k].as_slice();
        let each = |_: usize| 10;
        let size = Size { fixed: 100, each: &each, payload: Some(&payload), shared: false };
        let (groups, big) = chunks(4, 500, &size);
        assert_eq!(groups, vec![0..2, 3..4]);
        assert_eq!(big, vec![(2, 100 + 10 + 2000 + 40)]);
    }

    #[test]
    fn a_shared_payload_counts_once() {
        let same = vec![b"p".repeat(100); 5];
        let payload = |k: usize| same[k].as_slice();
        let each = |_: usize| 10;
        // Five items of one 100-byte payload: 100 + 5 * 10 + 203 bytes when
        // shared, 100 + 5 * (10 + 240) when not.
        let shared = Size { fixed: 100, each: &each, payload: Some(&payload), shared: true };
        assert_eq!(chunks(5, 400, &shared).0, vec![0..5]);
        let apart = Size { fixed: 100, each: &each, payload: Some(&payload), shared: false };
        assert_eq!(chunks(5, 400, &apart).0, vec![0..1, 1..2, 2..3, 3..4, 4..5]);
        // A different payload ends the sharing.
        let mixed = [b"p".repeat(100), b"p".repeat(100), b"q".repeat(100)];
        let payload = |k: usize| mixed[k].as_slice();
        let shared = Size { fixed: 100, each: &each, payload: Some(&payload), shared: true };
        assert_eq!(chunks(3, 400, &shared).0, vec![0..2, 2..3]);
    }

    #[test]
    fn scripts_pack_statements_in_order_within_the_budget() {
        let mut s = Script::new(25);
        for st in ["aaaaaaaaaa;", "bbbbbbbbbb;", "cccccccccc;", "a statement longer than the budget;", "d;"] {
            s.push(st);
        }
        assert_eq!(
            s.queries,
            ["aaaaaaaaaa; bbbbbbbbbb;", "cccccccccc;", "a statement longer than the budget;", "d;"],
            "in order, each query within the budget unless one statement alone is longer"
        );
    }

    #[test]
    fn renewals_name_their_rows_byte_for_byte_by_name_and_fence() {
        let items = [item("it's", 7, b""), item("b\\c", 8, b"")];
        let w = by_term(&items, "X'61'");
        assert_eq!(
            w,
            "name IN (X'69742773', X'625c63') AND (CAST(name AS BINARY), fence) IN ((X'69742773', 7), (X'625c63', \
             8)) AND CAST(holder AS BINARY) = X'61'"
        );
        assert!(w.len() <= 200 + items.iter().map(by_term_each).sum::<usize>());
    }

    /// The claim of existing rows: one `UPDATE` naming them by the
    /// primary key when they share a payload; their locks in name order
    /// first, then an update from their values, when not.
    #[test]
    fn claims_of_existing_rows_update_only_them() {
        let one = claim_existing("`t`", "X'61'", 5, &[(b"a", b"p"), (b"b", b"p")], true);
        assert!(one.starts_with("UPDATE `t` FORCE INDEX (PRIMARY) SET fence = IF((TRUE AND NOT COALESCE("), "{one}");
        assert!(one.ends_with("WHERE name IN (X'61', X'62') AND CAST(name AS BINARY) IN (X'61', X'62');"), "{one}");
        assert_eq!(one.matches("X'70'").count(), 1, "the payload once: {one}");
        let two = claim_existing("`t`", "X'61'", 5, &[(b"a", b"p"), (b"b", b"q")], false);
        assert!(two.starts_with("SELECT 'l', name FROM `t` FORCE INDEX (PRIMARY) WHERE name IN (X'61', X'62') ORDER BY name FOR UPDATE; UPDATE (SELECT X'61' AS n, X'70' AS p UNION ALL SELECT X'62', X'71') AS v STRAIGHT_JOIN `t` FORCE INDEX (PRIMARY) ON `t`.name = v.n SET"), "{two}");
        assert!(two.contains("NOT FALSE") && two.ends_with("WHERE CAST(`t`.name AS BINARY) = v.n;"), "{two}");
        let new = claim_statement("`t`", "X'61'", 5, &[(b"a", b"p"), (b"b", b"q")], true);
        assert!(new.contains("VALUES (X'61', X'61', GREATEST(1, @leaderelection_now), @leaderelection_now, @leaderelection_now, @leaderelection_now + 5, X'70', 1, @leaderelection_history), (X'62',"), "{new}");
        assert!(
            new.contains(
                "ON DUPLICATE KEY UPDATE fence = IF((CAST(name AS BINARY) = VALUES(name) AND NOT COALESCE(history <>"
            ),
            "{new}"
        );
    }
}
