#!/usr/bin/env bash
# The project's one test command (README "Test"). Run from the repository root.
# It installs and starts what the database suites need, then runs every suite.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit, simulation, doc and MemStore tests (default features)"
cargo test --all-targets
cargo test --doc

echo "== PostgreSQL store: unit, doc, acceptance suite (MemStore, direct, PgBouncer) and electors"
# Installs/starts PostgreSQL and PgBouncer (transaction mode) and exports
# LE_PG_DSN and LE_PGBOUNCER_DSN.
source scripts/db.sh
cargo test --features postgres,storetest --lib postgres
cargo test --features postgres,storetest --doc -- postgres storetest
cargo test --features postgres,storetest --test storetest_memstore --test storetest_postgres --test postgres_elector --test postgres_pause --test postgres_first_errors

echo "== MySQL/MariaDB store: unit, doc, acceptance suite and electors (MariaDB)"
# Installs/starts MariaDB on 127.0.0.1:3306 and a private mariadbd (port 3316,
# TLS on) for the SIGSTOP and TLS tests; exports LE_MYSQL_URL,
# LE_MYSQL_PAUSE_URL, LE_MYSQL_PAUSE_PID_FILE and LE_MYSQL_TLS_CA.
source scripts/mysql.sh
cargo test --features mysql,storetest --lib mysql
cargo test --features mysql,storetest --doc -- mysql
cargo test --features mysql,storetest --test storetest_mysql --test mysql_elector --test mysql_pause

echo "== examples"
cargo run --quiet --example quickstart
