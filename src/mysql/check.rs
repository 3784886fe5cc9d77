//! Lease checks in the program's own transactions (see
//! [`MySqlStore::check_lease`]).

use std::time::Instant;

use mysql::prelude::Queryable;

use super::{cluster, sql, MySqlStore};
use crate::guard::{LeaderGuard, LeaseCheck};
use crate::store::StoreError;

impl MySqlStore {
    /// The lease check as one statement for any driver (sqlx, diesel, the
    /// `mysql_async` crate), to run inside the transaction that writes:
    ///
    /// ```sql
    /// SELECT 1 FROM `leader_election` AS term FORCE INDEX (leaderelection_term)
    ///   WHERE term.name = ? AND CAST(term.holder AS BINARY) = ? AND term.fence = ?
    ///   AND (SELECT lease.expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    ///        FROM `leader_election` AS lease WHERE lease.name = term.name)
    ///   LOCK IN SHARE MODE
    /// ```
    ///
    /// with the parameters, in order, the election's name, the identity
    /// (both as bytes or text) and the fence (an unsigned 64-bit integer),
    /// from [`LeaderGuard::lease_check`]. One row back: the term still
    /// holds the lease on the database's clock, and until the transaction
    /// ends no claim of a new term can commit (it waits), while the
    /// holder's renewals go through. No row: roll back.
    ///
    /// It locks an entry of the index `leaderelection_term` on `(name,
    /// fence, holder)` that [`ensure_schema`](MySqlStore::ensure_schema) and
    /// [`schema`](MySqlStore::schema) make; without it the statement fails
    /// (error 1176) rather than check without holding anything off.
    ///
    /// This is the check for one server, or a replication topology with one
    /// writable node. On a multi-primary cluster (Galera, Group Replication
    /// in multi-primary mode) no lock reaches another node: use
    /// [`lease_check_sql_multi_primary`](MySqlStore::lease_check_sql_multi_primary)
    /// there.
    pub fn lease_check_sql(&self) -> String {
        sql::lease_check(&self.quoted)
    }

    /// The lease check for a multi-primary cluster (MariaDB Galera, MySQL
    /// Group Replication in multi-primary mode) as one statement for any
    /// driver, to run inside the transaction that writes:
    ///
    /// ```sql
    /// UPDATE `leader_election_terms` FORCE INDEX (PRIMARY) SET checks = checks + 1
    ///   WHERE name = ? AND CAST(holder AS BINARY) = ? AND fence = ?
    /// ```
    ///
    /// with the same parameters as [`lease_check_sql`](MySqlStore::lease_check_sql).
    /// One row changed: the term is still the election's latest, and a
    /// claim of a new term, which writes the same row, cannot commit
    /// before this transaction does: the cluster certifies the two against
    /// each other and rolls one back (your `COMMIT` then fails with 1213).
    /// No row changed: roll back. It does not read the expiry (a read of
    /// the lease row there would lock it, and hold the holder's renewals
    /// up); [`check_lease`](MySqlStore::check_lease) reads it after this
    /// statement. Concurrent checked transactions of one term write the
    /// same row, so they are ordered too. It needs the table
    /// `{table}_terms` ([`ensure_schema`](MySqlStore::ensure_schema) makes
    /// it), and every participant's store must know the cluster is one
    /// (they ask the server; see [`MySqlBuilder::multi_primary`](super::MySqlBuilder::multi_primary)),
    /// so that their claims write that row.
    pub fn lease_check_sql_multi_primary(&self) -> Result<String, StoreError> {
        Ok(cluster::check_write(&self.terms()?))
    }

    /// The lease check of `check`'s term with its values written in, as one
    /// statement that fails by itself when the term no longer holds the
    /// lease, for the `mariadb` and `mysql` clients, which stop a script at
    /// its first error (and roll back the open transaction as they
    /// disconnect); `run` gives it to its child in
    /// `LEADERELECTION_CHECK_SQL`. Outside a stored program neither server
    /// raises an error of one's choosing, so a lost lease shows as error
    /// 1242 (SQLSTATE 21000, "Subquery returns more than 1 row"); a table
    /// without the index fails with 1176. While the term holds the lease it
    /// returns one row, `leaderelection: lease held`. The values are hex
    /// literals: the text is safe to paste.
    ///
    /// # Errors
    ///
    /// A fatal error when the name or identity is longer than its column.
    ///
    /// On a multi-primary cluster it is two statements (the check's write,
    /// see [`lease_check_sql_multi_primary`](MySqlStore::lease_check_sql_multi_primary),
    /// then the row or the error), and asking the server which it is takes
    /// a round trip the first time.
    pub fn lease_check_literal(&self, check: &LeaseCheck<'_>) -> Result<String, StoreError> {
        if self.is_multi_primary("lease_check_literal", Instant::now() + self.ddl_timeout)? {
            return cluster::check_literal(&self.terms()?, &self.quoted, check.name, check.identity, check.fence);
        }
        sql::lease_check_literal(&self.quoted, check.name, check.identity, check.fence)
    }

    /// Runs the lease check of `guard`'s term in `conn`, your open
    /// transaction on the election's database (a `mysql::Transaction`, or
    /// a connection inside `START TRANSACTION`): it verifies on the
    /// database's clock that the lease row still names this term's
    /// identity and fence and has not expired, and then, until your
    /// transaction ends, no claim of a new term can commit. So a leader
    /// paused anywhere after the check (a garbage-collection stall,
    /// `SIGSTOP`, a frozen VM) either commits before its successor's
    /// claim, or its commit fails; the holder's own renewals are not held
    /// up.
    ///
    /// Keep checked transactions short: while one is open a successor
    /// waits for it. Under `READ COMMITTED` and `REPEATABLE READ` the
    /// holder's renewals go through; under `SERIALIZABLE` every read locks,
    /// so renewals wait for the checked transaction too, and a long one
    /// costs the leader its lease. Under `REPEATABLE READ` the expiry is
    /// read from the transaction's snapshot: check before the snapshot is
    /// older than a lease (first, or soon after the first read). With
    /// `autocommit` on and no transaction open, the lock ends with the
    /// statement and holds nothing off. The clock is the session's
    /// (`UTC_TIMESTAMP`): a session whose `timestamp` was set checks the
    /// expiry against that, while the hold on claims does not depend on it.
    /// A transaction left open by a paused or cut-off program holds the
    /// successor off until the server ends it: set `idle_transaction_timeout`
    /// (MariaDB) or a short `wait_timeout` on the connection that checks.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use leaderelection::mysql::MySqlStore;
    /// use leaderelection::{Config, Elector};
    /// use mysql::prelude::Queryable;
    ///
    /// let url = "mysql://app:secret@db.internal:3306/app";
    /// let store = MySqlStore::connect(url)?;
    /// store.ensure_schema()?;
    /// let elector = Elector::start(Config::new(store.clone(), "invoice-reconciler"))?;
    /// let guard = elector.wait_leader()?;
    /// let pool = mysql::Pool::new(url)?;
    /// let mut conn = pool.get_conn()?;
    /// let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
    /// store.check_lease(&mut tx, &guard)?; // no other term can commit a claim before this commits
    /// tx.exec_drop("UPDATE invoices SET state = 'sent' WHERE id = ?", (42,))?;
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
    /// the statement fails.
    pub fn check_lease(&self, conn: &mut impl Queryable, guard: &LeaderGuard) -> Result<(), StoreError> {
        let check = guard.lease_check_for("mysql")?;
        let params = (check.name.as_bytes(), check.identity.as_bytes(), check.fence);
        if self.is_multi_primary("check_lease", Instant::now() + self.ddl_timeout)? {
            return self.check_lease_multi_primary(conn, params);
        }
        match conn.exec_first::<i64, _, _>(self.lease_check_sql(), params) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(StoreError::lease_check_failed()),
            Err(mysql::Error::MySqlError(e)) if e.code == 1176 => Err(StoreError::fatal(format!(
                "mysql check_lease: the table {} has no index {} on (name, fence, holder), so a check would hold no \
                 claim off; run MySqlStore::ensure_schema, or: {}",
                self.quoted,
                sql::TERM_INDEX,
                sql::add_term_index(&self.quoted)
            ))),
            Err(e) => Err(sql::classify("check_lease", &e)),
        }
    }

    /// [`check_lease`](MySqlStore::check_lease) on a multi-primary cluster:
    /// the write of the term's row in `{table}_terms` (which holds the next
    /// claim off, see [`lease_check_sql_multi_primary`](MySqlStore::lease_check_sql_multi_primary)),
    /// then a plain read of the lease row: still this term's, not expired
    /// on this node's clock.
    fn check_lease_multi_primary(
        &self, conn: &mut impl Queryable, params: (&[u8], &[u8], u64),
    ) -> Result<(), StoreError> {
        let terms = self.terms()?;
        let changed = conn
            .exec_iter(cluster::check_write(&terms), params)
            .map(|r| r.affected_rows())
            .map_err(|e| self.explain_missing_terms(sql::classify("check_lease", &e)))?;
        if changed != 1 {
            return Err(StoreError::lease_check_failed());
        }
        match conn.exec_first::<i64, _, _>(cluster::check_read(&self.quoted), params) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(StoreError::lease_check_failed()),
            Err(e) => Err(sql::classify("check_lease", &e)),
        }
    }
}
