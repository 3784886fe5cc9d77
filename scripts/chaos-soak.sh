#!/usr/bin/env bash
# The chaos soak, opt-in (docs/failure-modes.md): ten minutes of random
# faults on each path (PostgreSQL direct, through PgBouncer, MariaDB; the
# three run at once), with participants crashed, stopped and replaced
# mid-flight, then the longer fleet scenarios the CI run has too: a rolling
# restart of the whole fleet, more participants than PgBouncer has server
# connections, and two elections in one table with one of them broken.
#   bash scripts/chaos-soak.sh                 # ~11 minutes
#   LE_CHAOS_SOAK_SECS=120 bash scripts/chaos-soak.sh
#   LE_CHAOS_SEED=<seed printed by a run> ...   # replay one run's faults
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/db.sh
source scripts/mysql.sh
cargo test --features postgres,mysql,storetest --test chaos -- --include-ignored --test-threads 12 --nocapture \
    soak rolling_restart more_participants two_elections
