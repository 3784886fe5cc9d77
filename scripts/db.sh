#!/usr/bin/env bash
# Database servers for the PostgreSQL suites. Source it (scripts/test.sh does):
#   source scripts/db.sh
# It installs what is missing (postgresql, pgbouncer, and libssl-dev and
# pkg-config for the TLS build) with apt-get, starts
# PostgreSQL if it is down, creates the `test` database and the `root` role,
# writes a pgbouncer.ini (transaction mode, 127.0.0.1, its own port) under a
# temporary directory, starts PgBouncer as user `postgres`, and exports:
#   LE_PG_DSN          PostgreSQL, direct
#   LE_PGBOUNCER_DSN   the same database through PgBouncer in transaction mode
# and, for the SIGSTOP test, a private cluster (LE_PG_PAUSE_DSN, LE_PG_PAUSE_DATA;
# see the last section).
# Safe to run twice: a PgBouncer already answering on the port is reused.

# Whether pid $1 is alive and its command line contains $2 (a pid read from
# a file an earlier boot wrote may now belong to anything).
le_db_pid_runs() {
    [ -n "$1" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# Stops a PgBouncer an earlier run started from $1/pgbouncer.ini: the one its
# pid file names, only if that pid is still a pgbouncer (pids are reused
# after a reboot), and any other started from the same file; waits until gone.
le_db_stop_bouncer() {
    local dir="$1" pid pids i
    pids="$(pgrep -f "pgbouncer.* $dir/pgbouncer.ini" || true)"
    if [ -f "$dir/pgbouncer.pid" ]; then
        pid="$(cat "$dir/pgbouncer.pid" 2>/dev/null || true)"
        if le_db_pid_runs "$pid" pgbouncer; then
            pids="$pids $pid"
        fi
    fi
    [ -n "${pids// /}" ] || return 0
    # SIGCONT first: a bouncer left stopped would never act on the SIGTERM.
    kill -CONT $pids 2>/dev/null || true
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 1 25); do kill -0 $pids 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
}

# What a failed PgBouncer start printed, and the end of its log.
le_db_bouncer_diagnose() {
    local dir="$1"
    sed 's/^/db.sh:   /' "$dir/start.out" >&2 2>/dev/null || true
    tail -n 20 "$dir/pgbouncer.log" 2>/dev/null | sed 's/^/db.sh:   log: /' >&2 || true
}

le_db_main() {
    local pg_port=5432
    local bouncer_port="${LE_PGBOUNCER_PORT:-6439}"
    local dir="${TMPDIR:-/tmp}/leaderelection-pgbouncer"

    local missing=()
    command -v pg_ctlcluster >/dev/null 2>&1 || missing+=(postgresql)
    command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
    command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
    # The postgres feature builds native-tls against the system OpenSSL.
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    [ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "db.sh: installing ${missing[*]}" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null \
            || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null; } \
            || { echo "db.sh: cannot install ${missing[*]}" >&2; return 1; }
    fi

    # PostgreSQL: start the cluster if nothing answers on the port.
    if ! pg_isready -q -h 127.0.0.1 -p "$pg_port"; then
        local ver
        ver="$(ls /etc/postgresql | sort -V | tail -n1)"
        echo "db.sh: starting PostgreSQL $ver" >&2
        pg_ctlcluster --skip-systemctl-redirect "$ver" main start || return 1
        local i
        for i in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p "$pg_port" && break; sleep 0.2; done
        pg_isready -q -h 127.0.0.1 -p "$pg_port" || { echo "db.sh: PostgreSQL did not come up" >&2; return 1; }
    fi
    # The role and database the suites use (trust auth on 127.0.0.1).
    runuser -u postgres -- psql -qAt -h 127.0.0.1 -p "$pg_port" -d postgres \
        -c "DO \$\$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'root') THEN CREATE ROLE root SUPERUSER LOGIN; END IF; END\$\$" \
        >/dev/null || return 1
    if [ "$(runuser -u postgres -- psql -qAt -h 127.0.0.1 -p "$pg_port" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'test'")" != 1 ]; then
        runuser -u postgres -- createdb -h 127.0.0.1 -p "$pg_port" -O root test 2>/dev/null || true
    fi

    # PgBouncer in transaction mode, reused when it already answers. Anything
    # an earlier run left (a pid file naming a pid since reused, a bouncer
    # that is stopped or gone deaf, a log owned by someone else) is cleared
    # first, and a failed start prints why instead of only where to look.
    if ! pg_isready -q -t 3 -h 127.0.0.1 -p "$bouncer_port" -d test; then
        le_db_stop_bouncer "$dir"
        rm -rf "$dir"
        mkdir -p "$dir"
        cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$pg_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
server_login_retry = 1
server_connect_timeout = 5
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
        printf '"root" ""\n"postgres" ""\n"le_limited" ""\n"le_nobody" ""\n' >"$dir/userlist.txt"
        chown -R postgres: "$dir"
        # Something else on the port that does not answer: say what it is.
        if ss -Hltn "sport = :$bouncer_port" 2>/dev/null | grep -q .; then
            echo "db.sh: port $bouncer_port is taken by something that does not answer as PgBouncer:" >&2
            ss -Hltnp "sport = :$bouncer_port" >&2 || true
            echo "db.sh: stop it, or choose another port with LE_PGBOUNCER_PORT" >&2
            return 1
        fi
        local bouncer
        bouncer="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
        if ! runuser -u postgres -- "$bouncer" -d "$dir/pgbouncer.ini" >"$dir/start.out" 2>&1; then
            echo "db.sh: pgbouncer did not start ($bouncer -d $dir/pgbouncer.ini as postgres):" >&2
            le_db_bouncer_diagnose "$dir"
            return 1
        fi
        local i
        for i in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p "$bouncer_port" -d test && break; sleep 0.2; done
        if ! pg_isready -q -h 127.0.0.1 -p "$bouncer_port" -d test; then
            echo "db.sh: pgbouncer does not answer on $bouncer_port:" >&2
            le_db_bouncer_diagnose "$dir"
            return 1
        fi
    fi

    export LE_PG_DSN="postgres://root@127.0.0.1:$pg_port/test"
    export LE_PGBOUNCER_DSN="postgres://root@127.0.0.1:$bouncer_port/test"
    echo "db.sh: LE_PG_DSN=$LE_PG_DSN LE_PGBOUNCER_DSN=$LE_PGBOUNCER_DSN" >&2
}

le_db_main || { echo "db.sh: database setup failed" >&2; return 1 2>/dev/null || exit 1; }

# ---------------------------------------------------------------------------
# A private throwaway PostgreSQL cluster in $1 on 127.0.0.1:$2 (its own
# socket directory, trust auth), started with the server options $3; used
# by the pause cluster below and by scripts/bench.sh. Idempotent: a cluster
# already answering is reused; one a previous run left stopped (SIGSTOP)
# is continued first; a missing one is created.
le_db_private_cluster() {
    local dir="$1" port="$2" extra="$3"
    local ver bin
    ver="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
    bin="/usr/lib/postgresql/$ver/bin"

    # A previous run killed before its thaw: continue the postmaster and all
    # its children, or pg_isready below would hang on the stopped server.
    # Only if that pid is still this cluster's postmaster: after a reboot the
    # pid may belong to anything (a backend of the shared server, say, which
    # the `pg_ctl stop` below would then signal), and the file is stale.
    if [ -f "$dir/postmaster.pid" ]; then
        local pm
        pm="$(head -n1 "$dir/postmaster.pid")"
        if le_db_pid_runs "$pm" "$dir"; then
            kill -CONT "$pm" $(pgrep -P "$pm") 2>/dev/null || true
        else
            echo "db.sh: removing the stale $dir/postmaster.pid (pid ${pm:-none} is not its postmaster)" >&2
            rm -f "$dir/postmaster.pid"
        fi
    fi

    if ! pg_isready -q -t 2 -h 127.0.0.1 -p "$port"; then
        if [ ! -f "$dir/PG_VERSION" ]; then
            rm -rf "$dir"
            mkdir -p "$dir"
            chown postgres: "$dir"
            chmod 700 "$dir"
            echo "db.sh: creating the private PostgreSQL $ver cluster in $dir" >&2
            runuser -u postgres -- "$bin/initdb" -D "$dir" -A trust -U postgres --no-sync >/dev/null \
                || { echo "db.sh: initdb failed in $dir" >&2; return 1; }
        fi
        local opts="-p $port -k $dir -c listen_addresses=127.0.0.1 $extra"
        if ! runuser -u postgres -- "$bin/pg_ctl" -D "$dir" -o "$opts" -l "$dir/log" start -w -t 30 >/dev/null; then
            # A half-dead server from an earlier run: stop it hard and retry.
            runuser -u postgres -- "$bin/pg_ctl" -D "$dir" stop -m immediate -w -t 10 >/dev/null 2>&1 || true
            runuser -u postgres -- "$bin/pg_ctl" -D "$dir" -o "$opts" -l "$dir/log" start -w -t 30 >/dev/null \
                || { echo "db.sh: the private cluster did not start; see $dir/log" >&2; return 1; }
        fi
        pg_isready -q -t 5 -h 127.0.0.1 -p "$port" \
            || { echo "db.sh: the private cluster does not answer on $port" >&2; return 1; }
    fi
}

# The private cluster for tests/postgres_pause.rs, which freezes the server
# with SIGSTOP. It must never be the shared server above: other suites use
# that one at the same time. Exports:
#   LE_PG_PAUSE_DSN    postgres://postgres@127.0.0.1:PORT/postgres
#   LE_PG_PAUSE_DATA   its data directory (postmaster.pid names the postmaster)
le_db_pause_main() {
    local port="${LE_PG_PAUSE_PORT:-5441}"
    local dir="${TMPDIR:-/tmp}/leaderelection-pgpause"
    le_db_private_cluster "$dir" "$port" "-c fsync=off -c synchronous_commit=on" || return 1
    export LE_PG_PAUSE_DSN="postgres://postgres@127.0.0.1:$port/postgres"
    export LE_PG_PAUSE_DATA="$dir"
    echo "db.sh: LE_PG_PAUSE_DSN=$LE_PG_PAUSE_DSN LE_PG_PAUSE_DATA=$LE_PG_PAUSE_DATA" >&2
}

le_db_pause_main || { echo "db.sh: private cluster setup failed" >&2; return 1 2>/dev/null || exit 1; }
