#!/usr/bin/env bash
# The examples as their users would run them: several copies of each
# program at once against the shared servers, their output (and, for the
# worker, the ledger it wrote) checked. Run from anywhere, after
# scripts/db.sh and scripts/mysql.sh (it needs LE_PG_DSN, LE_PGBOUNCER_DSN,
# LE_MYSQL_URL, and psql and mysql for the ledger); scripts/test.sh runs it
# under its coverage environment. Every wait has a deadline; a failed check
# prints the programs' output and exits 1.
#
#   cron_batch      3 copies per slot, 2 slots: each slot done once, skipped twice
#   worker          2 workers writing a ledger, the leader SIGKILLed mid-run:
#                   one writer per fence, fences never go back, the survivor takes over
#   sharded_worker  3 processes over 1,000 partitions: fair shares, none owned twice;
#                   one shuts down, the other two own all 1,000
#   leader_reader   3 replicas read the leader's payload; the leader stops,
#                   every reader reads its successor's
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LE_PG_DSN:?source scripts/db.sh first (it starts PostgreSQL and PgBouncer)}"
: "${LE_PGBOUNCER_DSN:?source scripts/db.sh first (it starts PostgreSQL and PgBouncer)}"
: "${LE_MYSQL_URL:?source scripts/mysql.sh first (it starts MariaDB)}"

started=$SECONDS
# The test profile and feature set scripts/test.sh builds its chaos suites
# with, so under it this only links the examples.
cargo build --quiet --profile test --features postgres,mysql,storetest \
    --example cron_batch --example worker --example sharded_worker --example leader_reader
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/examples"
run="x$$"   # election, slot and table names of this run only
work=$(mktemp -d)
# Every program started, by pid, in a file: the checks run in subshells.
kill_started() { # those still running, and only if the pid is still one of ours
    local p
    while read -r p; do
        case $({ tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null) in
            "$bin/"*) kill -9 "$p" 2>/dev/null || true ;;
        esac
    done <"$work/pids"
}
cleanup() {
    [ -e "$work/pids" ] && kill_started
    [ -n "${LE_EXAMPLES_KEEP:-}" ] && echo "examples: logs kept in $work" || rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "examples: FAILED: $*" >&2
    kill_started
    for f in "$work"/*/*.log; do
        [ -e "$f" ] && { echo "---- $f" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# wait_until SECONDS WHAT COMMAND...: runs COMMAND every 100 ms until it
# succeeds, failing with WHAT once SECONDS have passed.
wait_until() {
    local limit=$1 what=$2 t0
    shift 2
    t0=$(now)
    until "$@"; do
        if awk -v a="$t0" -v b="$(now)" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
            fail "$what: not within ${limit}s"
        fi
        sleep 0.1
    done
}
has() { # LOG PATTERN [COUNT]: the log has COUNT (1) lines matching PATTERN
    local n
    n=$(grep -c -- "$2" "$1" 2>/dev/null || true)
    [ "${n:-0}" -ge "${3:-1}" ]
}
gone() { ! kill -0 "$1" 2>/dev/null; }
# Waits for process $1 to exit and fails unless it exited 0.
reap() {
    wait_until "$2" "$3 exits" gone "$1"
    wait "$1" || fail "$3 exited $?"
}
start() { # start LOG PROGRAM ARGS...: runs an example in the background; $! is its pid
    local log=$1 prog=$2
    shift 2
    "$bin/$prog" "$@" >"$log" 2>&1 &
    echo $! >>"$work/pids"
}

# sql DSN QUERY: tab-separated rows, through psql or mysql.
sql() {
    case "$1" in
        mysql://*)
            [[ "$1" =~ ^mysql://([^:@/]+)(:([^@]*))?@([^:/]+)(:([0-9]+))?/([^?]+) ]] || fail "cannot read $1"
            MYSQL_PWD="${BASH_REMATCH[3]}" mysql -N -B -u "${BASH_REMATCH[1]}" -h "${BASH_REMATCH[4]}" \
                -P "${BASH_REMATCH[6]:-3306}" "${BASH_REMATCH[7]}" -e "$2" ;;
        *) psql "$1" -X -At -F $'\t' -c "$2" ;;
    esac
}

cron_batch() { # LABEL DSN
    local l=$1 dsn=$2 d="$work/cron-$1" slot i did skipped
    mkdir -p "$d"
    for slot in 1 2; do
        local t0 ps=()
        t0=$(now)
        for i in 1 2 3; do
            start "$d/s$slot-host-$i.log" cron_batch --dsn "$dsn" --id "host-$i" --name "ex-cron-$run-$l" \
                --slot "$run-slot-$slot" --lease 4s --wait 30s --work 500ms
            ps+=($!)
        done
        for i in 1 2 3; do reap "${ps[$((i - 1))]}" 40 "cron_batch $l slot $slot host-$i"; done
        did=$(cat "$d"/s$slot-*.log | grep -c " did slot $run-slot-$slot .*outcome=0" || true)
        skipped=$(cat "$d"/s$slot-*.log | grep -c " skipped slot $run-slot-$slot: done by fence=" || true)
        [ "$did" = 1 ] && [ "$skipped" = 2 ] ||
            fail "cron_batch $l slot $slot: $did copies did the work and $skipped skipped (want 1 and 2)"
        echo "examples cron_batch $l: slot $slot done once ($(grep -l ' did slot' "$d"/s$slot-*.log |
            xargs -n1 basename | sed 's/^s[0-9]-//; s/\.log$//')), skipped twice, all 3 copies done in $(since "$t0")s"
    done
}

worker() { # LABEL DSN
    local l=$1 dsn=$2 d="$work/worker-$1" ledger="ex_ledger_${run}_$1" w1 w2 t_kill
    mkdir -p "$d"
    local common=(--dsn "$dsn" --name "ex-worker-$run-$l" --ledger "$ledger" --lease 4s --every 100ms)
    start "$d/worker-1.log" worker "${common[@]}" --id worker-1 --for 60s
    w1=$!
    wait_until 15 "worker $l: worker-1 leads" has "$d/worker-1.log" "worker-1 leads term fence="
    start "$d/worker-2.log" worker "${common[@]}" --id worker-2 --for 14s
    w2=$!
    wait_until 15 "worker $l: worker-1 writes 10 rows" has "$d/worker-1.log" "worker-1 wrote seq=" 10
    { kill -9 "$w1" && wait "$w1"; } 2>/dev/null || true
    t_kill=$(now)
    wait_until 15 "worker $l: worker-2 takes over" has "$d/worker-2.log" "worker-2 leads term fence="
    local takeover
    takeover=$(since "$t_kill")
    wait_until 15 "worker $l: worker-2 writes 10 rows" has "$d/worker-2.log" "worker-2 wrote seq=" 10
    reap "$w2" 30 "worker $l worker-2"
    has "$d/worker-2.log" "worker-2 stopped after" || fail "worker $l: worker-2 did not stop cleanly"
    sql "$dsn" "SELECT worker, fence FROM $ledger ORDER BY id" >"$d/ledger.tsv"
    sql "$dsn" "DROP TABLE $ledger" >/dev/null
    # One writer per fence, fences never going back, worker-1 then worker-2.
    awk -F '\t' -v l="$l" -v takeover="$takeover" '
        NR > 1 && $2 + 0 < fence + 0 { print "worker " l ": fence went back at row " NR; bad = 1 }
        ($2 in owner) && owner[$2] != $1 { print "worker " l ": fence " $2 " written by two workers"; bad = 1 }
        NR > 1 && $1 != who && $2 == fence { print "worker " l ": writer changed within a term at row " NR; bad = 1 }
        { owner[$2] = $1; if ($1 != who) order = order " " $1; who = $1; fence = $2; rows[$1]++ }
        END {
            if (order != " worker-1 worker-2") { print "worker " l ": writers in order" order ", want worker-1 worker-2"; bad = 1 }
            if (bad) exit 1
            printf "examples worker %s: ledger rows worker-1 %d then worker-2 %d, fences never back, one writer per fence; worker-1 SIGKILLed, worker-2 led %ss later\n", l, rows["worker-1"], rows["worker-2"], takeover
        }' "$d/ledger.tsv" || fail "worker $l: the ledger breaks the rule (above; rows in $d/ledger.tsv)"
}

# Every partition owned, none twice, no process above BOUND, by each log's
# last line (`<id> owns N of 1000 partitions (share S): 3,7,...`); a line
# still being written (N is not its list's length) is not read yet. The
# counts seen go to $d/split.
shares_ok() { # BOUND LOG...
    local bound=$1 f
    shift
    : >"$d/owned"
    : >"$d/split"
    for f in "$@"; do
        grep ' owns ' "$f" | tail -n 1 | awk -F ': ' -v bound="$bound" -v sf="$d/split" -v of="$d/owned" '{
            split($1, w, " "); n = ($2 == "") ? 0 : split($2, p, ",")
            if (n != w[3] || n > bound) exit 1
            printf "%s ", n >> sf
            for (i = 1; i <= n; i++) print p[i] >> of
        } END { if (NR == 0) exit 1 }' || return 1
    done
    [ "$(sort -n "$d/owned" | uniq | wc -l)" = 1000 ] && [ "$(wc -l <"$d/owned")" = 1000 ]
}

sharded_worker() { # LABEL DSN
    local l=$1 dsn=$2 d="$work/sharded-$1" s1 s2 s3 t0 t_stop
    mkdir -p "$d"
    local common=(--dsn "$dsn" --name "ex-shards-$run-$l" --lease 4s)
    t0=$(now)
    start "$d/shard-1.log" sharded_worker "${common[@]}" --id shard-1 --for 60s
    s1=$!
    start "$d/shard-2.log" sharded_worker "${common[@]}" --id shard-2 --for 60s
    s2=$!
    start "$d/shard-3.log" sharded_worker "${common[@]}" --id shard-3 --for 10s
    s3=$!
    # Fair share among three: at most ceil(1000 / 3) = 334 each.
    wait_until 9 "sharded_worker $l: 3 processes own 1,000 partitions, at most 334 each, none twice" \
        shares_ok 334 "$d/shard-1.log" "$d/shard-2.log" "$d/shard-3.log"
    echo "examples sharded_worker $l: 3 processes own $(cat "$d/split")of 1,000 (bound 334), none twice, after $(since "$t0")s"
    reap "$s3" 15 "sharded_worker $l shard-3"
    t_stop=$(now)
    has "$d/shard-3.log" "shard-3 handed back" || fail "sharded_worker $l: shard-3 did not hand back"
    wait_until 15 "sharded_worker $l: after shard-3 left, 2 processes own 1,000 partitions, at most 500 each" \
        shares_ok 500 "$d/shard-1.log" "$d/shard-2.log"
    echo "examples sharded_worker $l: shard-3 shut down ($(grep 'handed back' "$d/shard-3.log" | awk '{ print $4 }') handed back); 2 processes own $(cat "$d/split")of 1,000 $(since "$t_stop")s later, none twice"
    { kill "$s1" "$s2" && wait "$s1" "$s2"; } 2>/dev/null || true
}

# Every reader's last read names LEADER, in leader= and in the payload.
all_read() { # LEADER LOG...
    local leader=$1 f
    shift
    for f in "$@"; do
        grep ' reads ' "$f" | tail -n 1 | grep -q " reads leader=$leader fence=[0-9]* payload=leader=$leader serves " ||
            return 1
    done
}
new_leader() { # LOG...: the one replica other than replica-1 that leads, if any
    grep -h ' leads term ' "$@" | awk '$1 != "replica-1" { print $1 }' | sort -u
}
has_new_leader() { [ -n "$(new_leader "$@")" ]; }

leader_reader() { # LABEL DSN
    local l=$1 dsn=$2 d="$work/reader-$1" r1 r2 r3 t_stop next
    mkdir -p "$d"
    local common=(--dsn "$dsn" --name "ex-reader-$run-$l" --lease 4s)
    start "$d/replica-1.log" leader_reader "${common[@]}" --id replica-1 --for 8s
    r1=$!
    wait_until 15 "leader_reader $l: replica-1 leads" has "$d/replica-1.log" "replica-1 leads term fence="
    start "$d/replica-2.log" leader_reader "${common[@]}" --id replica-2 --for 14s
    r2=$!
    start "$d/replica-3.log" leader_reader "${common[@]}" --id replica-3 --for 14s
    r3=$!
    wait_until 7 "leader_reader $l: all 3 replicas read replica-1's payload" \
        all_read replica-1 "$d/replica-1.log" "$d/replica-2.log" "$d/replica-3.log"
    echo "examples leader_reader $l: 3 replicas read leader=replica-1 and its payload"
    reap "$r1" 15 "leader_reader $l replica-1"
    t_stop=$(now)
    wait_until 10 "leader_reader $l: a new leader" has_new_leader "$d/replica-2.log" "$d/replica-3.log"
    next=$(new_leader "$d/replica-2.log" "$d/replica-3.log")
    [ "$(echo "$next" | wc -l)" = 1 ] || fail "leader_reader $l: two new leaders: $next"
    wait_until 10 "leader_reader $l: both readers read $next's payload" \
        all_read "$next" "$d/replica-2.log" "$d/replica-3.log"
    echo "examples leader_reader $l: replica-1 stopped; $(since "$t_stop")s later both readers read leader=$next and its payload"
    reap "$r2" 15 "leader_reader $l replica-2"
    reap "$r3" 15 "leader_reader $l replica-3"
}

# Each check on each path at once (names are per path and per run).
each() { # CHECK PATH...
    local check=$1 jobs=() p
    shift
    for p in "$@"; do
        case $p in
            pg) "$check" pg "$LE_PG_DSN" & ;;
            pgbouncer) "$check" pgbouncer "$LE_PGBOUNCER_DSN" & ;;
            maria) "$check" maria "$LE_MYSQL_URL" & ;;
        esac
        jobs+=($!)
    done
    for p in "${jobs[@]}"; do wait "$p" || exit 1; done
}

# `bash scripts/examples.sh worker` runs one check; no argument runs all.
checks=("$@")
[ $# -gt 0 ] || checks=(cron_batch worker sharded_worker leader_reader)
for check in "${checks[@]}"; do
    case $check in
        cron_batch | worker) each "$check" pg pgbouncer maria ;;
        sharded_worker | leader_reader) each "$check" pg maria ;;
        *) fail "no check named $check" ;;
    esac
done
echo "examples: every check passed in $((SECONDS - started))s"
