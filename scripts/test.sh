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

echo "== examples"
cargo run --quiet --example quickstart
