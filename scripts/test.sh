#!/usr/bin/env bash
# The project's one test command (README "Try it", docs/testing.md). Run from the repository root.
# It installs and starts what the database suites need, then runs every suite
# once, instrumented for coverage, and ends with the line coverage of src/,
# failing below the floor.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each section's header says when it began, in seconds since the run began,
# so a log shows where a run's time went (CI must stay under 30 min).
section() { echo "== $* [t+${SECONDS} s]"; }

section "loom: the guard/term hand-off and the driver's decisions in every interleaving (src/guard.rs, src/handoff_loom.rs); beside it, publishable: package contents, docs without warnings, rust-version, cargo publish --dry-run (scripts/publish-check.sh)"
# Both before coverage is set up, each in a target directory of its own, so
# no instrumented flags reach them (the publish check also clears them
# itself), and a package that cannot be published fails the run in its
# first minutes. They run side by side: much of the publish check is
# rustdoc on one crate, a registry index and a Python script, which leave
# a core idle that loom's release build takes. The publish check's output
# follows loom's. (Alone, the publish check takes about 3 min from a fresh
# clone on an idle 2-core machine, 30 s once built; docs/testing.md,
# Publishing.)
publish_log="$(mktemp /tmp/leaderelection-publish.XXXXXX)"
LE_PUBLISH_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/publish" bash scripts/publish-check.sh >"$publish_log" 2>&1 &
publish_pid=$!
trap 'kill "$publish_pid" 2>/dev/null || true' EXIT
# A release build of its own with --cfg loom.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/loom" \
    cargo test --release -p leaderelection --lib loom
section "publishable (scripts/publish-check.sh, run beside loom): its output"
publish_status=0
wait "$publish_pid" || publish_status=$?
trap - EXIT
cat "$publish_log"
rm -f "$publish_log"
if [ "$publish_status" -ne 0 ]; then
    echo "scripts/test.sh: the publish check failed (exit $publish_status); its output is above" >&2
    exit "$publish_status"
fi
# ---- end of publish check ----

# Coverage: installs llvm-22 and cargo-llvm-cov if missing. `show-env` makes
# every cargo command below build the workspace's crates with
# -C instrument-coverage (dependencies stay plain) into a target directory of
# their own, so plain builds elsewhere never mix with instrumented ones. Each
# test binary then runs once and leaves its profile for the report at the end.
# Doctests are built by rustdoc, which is not instrumented on stable: they run,
# but count for nothing.
source scripts/coverage-tools.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/llvm-cov-target"
source <(cargo llvm-cov show-env --sh)
cargo llvm-cov clean --workspace   # stale profiles and binaries would skew the report

section "unit, simulation, doc and MemStore tests (default features)"
# The CLI's suites need the servers; they run after the MySQL section.
cargo test --all-targets --workspace --exclude leaderelection-cli
cargo test --doc
# The Rust blocks of README.md and docs/*.md (src/lib.rs, `mod doctests`):
# they use both database stores, so they compile only with both features;
# they are no_run, so no server is needed.
cargo test -p leaderelection --features postgres,mysql --doc -- doctests

section "feature metrics: the elector's figures through the metrics facade (tests/metrics.rs)"
cargo test -p leaderelection --features metrics --test metrics

section "PostgreSQL store: unit, doc, acceptance suite (MemStore, direct, PgBouncer) and electors"
# Installs/starts PostgreSQL and PgBouncer (transaction mode) and exports
# LE_PG_DSN and LE_PGBOUNCER_DSN.
source scripts/db.sh
cargo test --features postgres,storetest --lib postgres
cargo test --features postgres,storetest --test postgres_api   # no server needed
cargo test --features postgres,storetest --doc -- postgres storetest
cargo test --features postgres,storetest --test storetest_memstore --test storetest_postgres --test postgres_elector --test postgres_pause --test postgres_first_errors --test postgres_check --test postgres_batch --test store_forwarding --test postgres_limits --test cov_storetest --test cov_postgres --test release_feed

section "MySQL/MariaDB store: unit, doc, acceptance suite and electors (MariaDB)"
# Installs/starts MariaDB on 127.0.0.1:3306 and a private mariadbd (port 3316,
# TLS on) for the SIGSTOP and TLS tests; exports LE_MYSQL_URL,
# LE_MYSQL_PAUSE_URL, LE_MYSQL_PAUSE_PID_FILE and LE_MYSQL_TLS_CA.
source scripts/mysql.sh
cargo test --features mysql,storetest --lib -- mysql lockfeed
cargo test --features mysql,storetest --doc -- mysql
cargo test --features mysql,storetest --test storetest_mysql --test mysql_pool --test mysql_elector --test mysql_pause --test mysql_check --test mysql_memory --test mysql_borrowed --test mysql_limits --test mysql_validation --test mysql_transactions --test release_feed_mysql

section "both stores: AnyStore from connect(), lease-check refusals, calls before ensure_schema"
cargo test --features postgres,mysql,storetest --test any_store --test check_errors --test missing_table

section "MariaDB Galera: a three-node multi-primary cluster of the test's own (tests/galera.rs)"
# Installs galera-4 and rsync; the test starts its cluster on loopback ports.
# --nocapture keeps its figures (`galera …` lines) in the log.
source scripts/cluster.sh
cargo test --features mysql,storetest --test galera -- --nocapture

section "the leaderelection command-line tool (cli/): the real binary on PostgreSQL and MariaDB"
cargo test -p leaderelection-cli

section "chaos suite (tests/chaos): its proxy, servers and oracle, then every scenario on every path"
# Each scenario is a live fleet behind fault proxies, on the shared servers
# (network faults) or on servers of its own (tests/support/pg_server.rs,
# maria_server.rs); they mostly wait, so many run at once. --nocapture keeps
# each scenario's figures (`chaos <path>/<scenario> …` lines) in the log.
cargo test --features postgres,mysql,storetest --test chaos_faults --test chaos_oracle --test chaos_pg_server --test chaos_maria_server
cargo test --features postgres,mysql,storetest --test chaos -- --test-threads 8 --nocapture
# Lease-checked writes (issue 17): fleets of worker processes writing a ledger,
# their leaders stopped, cut off and killed mid-transaction (`chaos-ledger …`
# lines). Alone: it stops and kills processes and waits out idle timeouts.
cargo test --features postgres,mysql,storetest --test chaos_ledger -- --test-threads 4 --nocapture
# Replicated servers (issue 18): primaries killed, standbys promoted,
# switchovers, a standby cut off before the kill (`failover …` figures).
cargo test --features postgres,mysql,storetest --test failover_servers -- --test-threads 8 --nocapture
# The same failovers under a fleet judged by the chaos oracle, with the
# failover rule's negative control (`chaos-failover …` lines).
cargo test --features postgres,mysql,storetest --test chaos_failover -- --test-threads 8 --nocapture
# A PostgreSQL server's history is its system, timeline and start (issue 34):
# a logical-replication cutover and a restored snapshot under the chaos
# oracle, with the timeline-only stamp as their negative control
# (`pg history …` lines).
cargo test --features postgres,mysql,storetest --test pg_history -- --test-threads 3 --nocapture
# A Patroni-managed pair (etcd, two nodes, all on loopback) under the chaos
# oracle: switchover, failover and a killed primary (`chaos-patroni …`).
cargo test --features postgres,mysql,storetest --test chaos_patroni -- --nocapture
# Many elections per process (issue 20): per path, three worker processes each
# running a Group with a fair share over the same 1,000 elections, each behind a
# fault proxy of its own, through a silent and a resetting partition, a SIGSTOP,
# a SIGKILL and a fresh process joining, judged per election by the oracle,
# with its negative control (`chaos-group …` lines). One fleet per path at once:
# each is three processes sampling 1,000 guards on this two-core machine.
cargo test --features postgres,mysql,storetest --test chaos_group -- --test-threads 3 --nocapture

section "examples"
cargo run --quiet --example quickstart
# The programs the crate is for (issue 35, item 5), several copies at once
# against PostgreSQL, PgBouncer and MariaDB, their output and the worker's
# ledger checked (scripts/examples.sh).
bash scripts/examples.sh

section "line coverage of src/ (fails below 97 %)"
# Only the library's own sources count: not its tests, examples or fuzz
# targets, not a workspace member such as sim/, not the registry (the
# default filter of cargo-llvm-cov already drops tests/, examples/,
# *_tests.rs, dependencies and non-default members). The floor is for the
# library's src/: the command-line tool in cli/ is tested by running its
# binary, which is not instrumented for this report.
root_re="$(printf '%s' "$PWD" | sed 's/[].[*^$()+?{}|\\]/\\&/g')"
cargo llvm-cov report --show-missing-lines --fail-under-lines 97 \
    --ignore-filename-regex "^$root_re/(tests|examples|benches|fuzz|sim|cli)/"

section "done"
