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

# Row 9 with 100 followers in processes of their own needs ~200 sessions
# on PostgreSQL, and the shared server allows 100: a private throwaway
# cluster (as scripts/db.sh makes its pause cluster) on 127.0.0.1:5443 with
# max_connections=300, durable like the shared one (fsync on). Exports
# LE_BENCH_PG_MANY_DSN; without it the row measures 40 followers on the
# shared server. Idempotent: a cluster already answering is reused.
le_bench_pg_many() {
    local port="${LE_BENCH_PG_MANY_PORT:-5443}"
    local dir="${TMPDIR:-/tmp}/leaderelection-pgmany"
    local ver bin
    ver="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
    bin="/usr/lib/postgresql/$ver/bin"
    if ! pg_isready -q -t 2 -h 127.0.0.1 -p "$port"; then
        if [ ! -f "$dir/PG_VERSION" ]; then
            rm -rf "$dir"
            mkdir -p "$dir"
            chown postgres: "$dir"
            chmod 700 "$dir"
            echo "bench.sh: creating the private PostgreSQL $ver cluster in $dir" >&2
            runuser -u postgres -- "$bin/initdb" -D "$dir" -A trust -U postgres --no-sync >/dev/null \
                || { echo "bench.sh: initdb failed in $dir" >&2; return 1; }
        fi
        # A pid file left by a killed server would stop pg_ctl start.
        if [ -f "$dir/postmaster.pid" ] && ! kill -0 "$(head -n1 "$dir/postmaster.pid")" 2>/dev/null; then
            rm -f "$dir/postmaster.pid"
        fi
        local opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300"
        opts+=" -c fsync=on -c synchronous_commit=on"
        if ! runuser -u postgres -- "$bin/pg_ctl" -D "$dir" -o "$opts" -l "$dir/log" start -w -t 30 >/dev/null; then
            runuser -u postgres -- "$bin/pg_ctl" -D "$dir" stop -m immediate -w -t 10 >/dev/null 2>&1 || true
            runuser -u postgres -- "$bin/pg_ctl" -D "$dir" -o "$opts" -l "$dir/log" start -w -t 30 >/dev/null \
                || { echo "bench.sh: the private cluster did not start; see $dir/log" >&2; return 1; }
        fi
        pg_isready -q -t 5 -h 127.0.0.1 -p "$port" \
            || { echo "bench.sh: the private cluster does not answer on $port" >&2; return 1; }
    fi
    export LE_BENCH_PG_MANY_DSN="postgres://postgres@127.0.0.1:$port/postgres"
    echo "bench.sh: LE_BENCH_PG_MANY_DSN=$LE_BENCH_PG_MANY_DSN" >&2
}
le_bench_pg_many || echo "bench.sh: no private cluster; row 9 measures 40 follower processes on the shared server" >&2

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
