//! Lease checks in the program's own transactions (see
//! [`PostgresStore::check_lease`]).

use std::sync::atomic::Ordering;

use postgres::types::Type;

use super::{fence_index, sql, PostgresStore};
use crate::guard::{LeaderGuard, LeaseCheck};
use crate::store::StoreError;

impl PostgresStore {
    /// The lease check as one statement for any driver (sqlx, diesel,
    /// tokio-postgres, a pooler), to run inside the transaction that writes:
    ///
    /// ```sql
    /// SELECT 1 FROM "public"."leader_election" WHERE name = $1 AND holder = $2 AND fence = $3
    ///   AND expires_at > pg_catalog.clock_timestamp() FOR KEY SHARE
    /// ```
    ///
    /// with `$1` the election's name (`text`), `$2` the identity (`text`)
    /// and `$3` the fence (`bigint`), from [`LeaderGuard::lease_check`]. One
    /// row back: the term still holds the lease on the database's clock,
    /// and until the transaction ends no claim of a new term can commit (it
    /// waits), while the holder's renewals go through. No row: roll back.
    /// It needs the unique index on `(name, fence)` that
    /// [`ensure_schema`](PostgresStore::ensure_schema) makes; without it the
    /// check blocks no claim ([`check_lease`](PostgresStore::check_lease)
    /// looks for it; with this statement, make sure it exists).
    pub fn lease_check_sql(&self) -> String {
        sql::lease_check(&self.qualified)
    }

    /// The lease check of `check`'s term with its values written in, as one
    /// statement that fails by itself (SQLSTATE `LE001`, or `LE002` when the
    /// index it needs is missing) when the term no longer holds the lease:
    /// for `psql` and other tools that cannot look at a row count, as
    /// `run` gives it to its child in `LEADERELECTION_CHECK_SQL`. The values
    /// are escaped literals; the text is safe to paste.
    ///
    /// # Errors
    ///
    /// A fatal error when the table name leaves no room for the index's
    /// name, or a value cannot be written (NUL).
    pub fn lease_check_literal(&self, check: &LeaseCheck<'_>) -> Result<String, StoreError> {
        let (_, index) = self.fence_index()?;
        sql::lease_check_literal(&self.qualified, &self.schema, &index, check.name, check.identity, check.fence)
    }

    /// Runs the lease check of `guard`'s term in `client`, your open
    /// transaction on the election's database (a `postgres::Transaction`,
    /// or a `Client` inside `BEGIN`): it verifies on the database's clock
    /// that the lease row still names this term's identity and fence and
    /// has not expired, and then, until your transaction ends, no claim of
    /// a new term can commit. So a leader paused anywhere after the check
    /// (a garbage-collection stall, `SIGSTOP`, a frozen VM) either commits
    /// before its successor's claim, or its commit fails; the holder's own
    /// renewals are not held up. Check after the writes' last read and
    /// before `COMMIT`, or first: either way the lock lasts until the end.
    ///
    /// Keep checked transactions short: while one is open a successor
    /// waits for it (and its claim may time out and be retried). Any
    /// isolation level works; under `REPEATABLE READ` and `SERIALIZABLE` a
    /// row a claim changed since the snapshot fails the check with a
    /// serialization error (40001) instead.
    ///
    /// The first check of a store makes sure the unique index it needs
    /// exists (one catalog read, in your transaction).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use leaderelection::postgres::PostgresStore;
    /// use leaderelection::{Config, Elector};
    ///
    /// let store = PostgresStore::connect("postgres://app@db.internal/app")?;
    /// store.ensure_schema()?;
    /// let elector = Elector::start(Config::new(store.clone(), "invoice-reconciler"))?;
    /// let guard = elector.wait_leader()?;
    /// let mut client = postgres::Client::connect("postgres://app@db.internal/app", postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// store.check_lease(&mut tx, &guard)?; // no other term can commit a claim before this commits
    /// tx.execute("UPDATE invoices SET state = 'sent' WHERE id = $1", &[&42i64])?;
    /// tx.commit()?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) when the term
    /// no longer holds the lease (by this process's clock already, or by
    /// the database's): roll back. A fatal error when the index is missing
    /// or the guard is a test term's; the server's error, classified, when
    /// the statement fails (then the transaction is aborted anyway).
    pub fn check_lease(
        &self, client: &mut impl postgres::GenericClient, guard: &LeaderGuard,
    ) -> Result<(), StoreError> {
        let check = guard.lease_check_for("postgres")?;
        if !self.fence_index_seen.load(Ordering::Acquire) {
            let (_, index) = self.fence_index()?;
            let q = sql::has_fence_index(&self.schema, &index)?;
            let rows = client.simple_query(&q).map_err(|e| classify(&e))?;
            if sql::first_text(&rows) != Some("1") {
                return Err(StoreError::fatal(format!(
                    "postgres check_lease: the unique index {index} on (name, fence) is missing, so a check would \
                     hold no claim off; run PostgresStore::ensure_schema (or the DDL of PostgresStore::schema)"
                )));
            }
            self.fence_index_seen.store(true, Ordering::Release);
        }
        let fence =
            i64::try_from(check.fence).map_err(|_| StoreError::fatal("postgres check_lease: fence out of range"))?;
        let params: [(&(dyn postgres::types::ToSql + Sync), Type); 3] =
            [(&check.name, Type::TEXT), (&check.identity, Type::TEXT), (&fence, Type::INT8)];
        let rows = client.query_typed(&self.lease_check_sql(), &params).map_err(|e| classify(&e))?;
        if rows.is_empty() {
            return Err(StoreError::lease_check_failed());
        }
        Ok(())
    }

    /// The index lease checks need, qualified and bare, or why there is none.
    fn fence_index(&self) -> Result<(String, String), StoreError> {
        fence_index(&self.schema, &self.table).ok_or_else(|| {
            StoreError::fatal(format!(
                "postgres: the index {}_name_fence that lease checks need would be longer than 63 bytes; use a \
                 shorter election table name",
                self.table
            ))
        })
    }
}

fn classify(e: &postgres::Error) -> StoreError {
    sql::classify("check_lease", e)
}
