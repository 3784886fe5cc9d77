#!/usr/bin/env bash
# Database servers for the MySQL/MariaDB suites. Source it (scripts/test.sh does):
#   source scripts/mysql.sh
# It installs mariadb-server and mariadb-client with apt-get when missing,
# starts the shared server on 127.0.0.1:3306 if it is down, creates the `test`
# database, and starts a PRIVATE mariadbd (its own data directory, port and
# socket, TLS on with the host's snakeoil certificate for "localhost") for
# the tests that freeze the server with SIGSTOP or need TLS. Exports:
#   LE_MYSQL_URL             mysql://root@127.0.0.1:3306/test   (shared server)
#   LE_MYSQL_PAUSE_URL       mysql://root@127.0.0.1:PORT/test    (private server)
#   LE_MYSQL_PAUSE_PID_FILE  the private server's pid file
#   LE_MYSQL_TLS_CA          the CA file that signs the private server's certificate
# Safe to run twice: servers already answering are reused; a private server
# a previous run left stopped (SIGSTOP) is continued first.

le_mysql_main() {
    local missing=()
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
    command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "mysql.sh: installing ${missing[*]}" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null \
            || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null; } \
            || { echo "mysql.sh: cannot install ${missing[*]}" >&2; return 1; }
    fi

    local ping="mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root --connect-timeout=2 ping"
    if ! $ping >/dev/null 2>&1; then
        echo "mysql.sh: starting MariaDB" >&2
        service mariadb start >/dev/null 2>&1 || service mysql start >/dev/null 2>&1 \
            || { mkdir -p /run/mysqld && chown mysql: /run/mysqld && (setsid /usr/sbin/mariadbd --user=mysql >/dev/null 2>&1 &); }
        local i
        for i in $(seq 1 100); do $ping >/dev/null 2>&1 && break; sleep 0.2; done
        $ping >/dev/null 2>&1 || { echo "mysql.sh: MariaDB does not answer on 127.0.0.1:3306" >&2; return 1; }
    fi
    mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE IF NOT EXISTS test" \
        || { echo "mysql.sh: cannot create the test database (root without a password over TCP?)" >&2; return 1; }
    export LE_MYSQL_URL="mysql://root@127.0.0.1:3306/test"
    echo "mysql.sh: LE_MYSQL_URL=$LE_MYSQL_URL" >&2
}

le_mysql_private_main() {
    local port="${LE_MYSQL_PAUSE_PORT:-3316}"
    local dir="${LE_MYSQL_PAUSE_DIR:-/tmp/mysql}"
    local ping="mariadb-admin --protocol=tcp -h 127.0.0.1 -P $port -u root --connect-timeout=2 ping"

    # A previous run killed before its thaw: continue the server first.
    if [ -f "$dir/mariadbd.pid" ]; then
        local pid
        pid="$(cat "$dir/mariadbd.pid")"
        [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -CONT "$pid" 2>/dev/null
    fi

    if ! $ping >/dev/null 2>&1; then
        mkdir -p "$dir"
        if [ ! -d "$dir/data/mysql" ]; then
            echo "mysql.sh: creating the private MariaDB in $dir" >&2
            rm -rf "$dir/data"
            mariadb-install-db --no-defaults --user=mysql --datadir="$dir/data" --skip-test-db \
                --auth-root-authentication-method=socket >"$dir/install.log" 2>&1 \
                || { echo "mysql.sh: mariadb-install-db failed; see $dir/install.log" >&2; return 1; }
        fi
        # TLS with the host's snakeoil certificate ("localhost"), readable by mysql.
        if [ -f /etc/ssl/certs/ssl-cert-snakeoil.pem ] && [ -f /etc/ssl/private/ssl-cert-snakeoil.key ]; then
            cp /etc/ssl/certs/ssl-cert-snakeoil.pem "$dir/cert.pem"
            cp /etc/ssl/private/ssl-cert-snakeoil.key "$dir/key.pem"
        fi
        # A tmpdir of its own: at start mariadbd removes the `#sql…` files it
        # finds in its tmpdir, which in a shared /tmp can be the shared
        # server's live temporary tables.
        mkdir -p "$dir/tmp"
        chown -R mysql: "$dir"
        chmod 600 "$dir/key.pem" 2>/dev/null || true
        local tls=()
        [ -f "$dir/cert.pem" ] && tls=(--ssl-cert="$dir/cert.pem" --ssl-key="$dir/key.pem")
        (setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$dir/data" \
            --port="$port" --bind-address=127.0.0.1 --socket="$dir/mariadbd.sock" \
            --pid-file="$dir/mariadbd.pid" --log-error="$dir/error.log" --skip-name-resolve \
            --tmpdir="$dir/tmp" --innodb-buffer-pool-size=32M --skip-log-bin --max-connections=200 "${tls[@]}" \
            >/dev/null 2>&1 &)
        local i
        for i in $(seq 1 100); do
            mariadb-admin --socket="$dir/mariadbd.sock" -u root ping >/dev/null 2>&1 && break
            sleep 0.2
        done
        mariadb --socket="$dir/mariadbd.sock" -u root -e "
            CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
            GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
            CREATE DATABASE IF NOT EXISTS test;" \
            || { echo "mysql.sh: the private MariaDB did not come up; see $dir/error.log" >&2; return 1; }
        $ping >/dev/null 2>&1 || { echo "mysql.sh: the private MariaDB does not answer on $port" >&2; return 1; }
    fi
    export LE_MYSQL_PAUSE_URL="mysql://root@127.0.0.1:$port/test"
    export LE_MYSQL_PAUSE_PID_FILE="$dir/mariadbd.pid"
    export LE_MYSQL_TLS_CA="/etc/ssl/certs/ssl-cert-snakeoil.pem"
    echo "mysql.sh: LE_MYSQL_PAUSE_URL=$LE_MYSQL_PAUSE_URL LE_MYSQL_PAUSE_PID_FILE=$LE_MYSQL_PAUSE_PID_FILE" >&2
}

le_mysql_main || { echo "mysql.sh: database setup failed" >&2; return 1 2>/dev/null || exit 1; }
le_mysql_private_main || { echo "mysql.sh: private server setup failed" >&2; return 1 2>/dev/null || exit 1; }
