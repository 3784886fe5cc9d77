#!/usr/bin/env bash
# The project measuring itself (BENCHMARKS.md):
#   bash scripts/bench.sh            # every row, about 17 minutes on 2 cores
#   bash scripts/bench.sh --quick    # shorter trials, no row 6
# Starts the servers (scripts/db.sh, scripts/mysql.sh), runs rows 1-5 and 7-10 with
#   cargo run --release --example bench --features postgres,mysql
# then row 6 (clean release builds, each into a fresh CARGO_TARGET_DIR under
# /tmp), and prints ONE Markdown table: row, measured, target, verdict.
# Exit status: 2 on a safety violation (two leaders of one election at once,
# a fence that did not increase), 1 when something could not be measured,
# 0 otherwise; a missed speed target is a MISSED verdict, not a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=()
[ "${1:-}" = "--quick" ] && quick=(--quick)

# shellcheck source=db.sh
source scripts/db.sh || exit 1
# shellcheck source=mysql.sh
source scripts/mysql.sh || exit 1

# Rows 9 and 12 with 100 followers in processes of their own need ~300 sessions
# on PostgreSQL, and the shared server allows 100: a private throwaway
# cluster (scripts/db.sh's le_db_private_cluster) on 127.0.0.1:5443 with
# max_connections=500, durable like the shared one (fsync on). Exports
# LE_BENCH_PG_MANY_DSN; without it row 9 measures 25 followers and row 12 40 on the
# shared server. Idempotent: a cluster already answering is reused.
le_bench_pg_many() {
    local port="${LE_BENCH_PG_MANY_PORT:-5443}"
    le_db_private_cluster "${TMPDIR:-/tmp}/leaderelection-pgmany" "$port" \
        "-c max_connections=500 -c fsync=on -c synchronous_commit=on" || return 1
    export LE_BENCH_PG_MANY_DSN="postgres://postgres@127.0.0.1:$port/postgres"
    echo "bench.sh: LE_BENCH_PG_MANY_DSN=$LE_BENCH_PG_MANY_DSN" >&2
}
le_bench_pg_many || echo "bench.sh: no private cluster; rows 9 and 12 measure 25 and 40 follower processes on the shared server" >&2

work="$(mktemp -d /tmp/leaderelection-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)

# Build first, so compiling is not part of any row; row 10 runs the tool's
# release build.
cargo build --release --example bench --example bench_child --features postgres,mysql || exit 1
cargo build --release -p leaderelection-cli || exit 1
export LE_CLI_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/leaderelection"
cargo run -q --release --example bench --features postgres,mysql -- "${quick[@]}" >"$work/table.md"
status=$?

# Row 6: crates compiled ("Compiling" lines) and wall time of a clean release
# build of each configuration, one after another.
build_row() {
    local label="$1"
    shift
    local dir="$work/target-$RANDOM"
    local t0 t1
    t0=$(date +%s.%N)
    if ! CARGO_TARGET_DIR="$dir" cargo build --release "$@" >"$work/build.log" 2>&1; then
        echo "bench.sh: cargo build --release $* failed:" >&2
        tail -n 20 "$work/build.log" >&2
        echo "| 6. clean release build, $label | build failed | — | FAILED |" >>"$work/table.md"
        [ "$status" -eq 0 ] && status=1
        return
    fi
    t1=$(date +%s.%N)
    local crates
    crates=$(grep -c '^ *Compiling ' "$work/build.log")
    printf '| 6. clean release build, %s | %s crates, %.0f s | — | — |\n' "$label" "$crates" "$(echo "$t1 - $t0" | bc)" \
        >>"$work/table.md"
    rm -rf "$dir"
}
if [ "${#quick[@]}" -eq 0 ]; then
    echo "bench.sh: row 6, clean release builds" >&2
    build_row "library, default features (\`-p leaderelection\`)" -p leaderelection
    build_row "\`--features postgres\`" -p leaderelection --features postgres
    build_row "\`--features mysql\`" -p leaderelection --features mysql
    build_row "the CLI (\`-p leaderelection-cli\`)" -p leaderelection-cli
fi

echo
cat "$work/table.md"
echo
echo "bench.sh: $(( $(date +%s) - started )) s in all; exit status $status"
exit "$status"
