#!/usr/bin/env bash
# What the cluster suites need beyond the single servers (issue 34). Source it
# (scripts/test.sh does):
#   source scripts/cluster.sh
# It installs with apt-get what is missing: galera-4 (the Galera provider
# MariaDB loads for a multi-primary cluster), rsync (the state transfer a
# joining node takes), faketime (libfaketime, for a node whose clock is
# off), patroni and etcd-server (a Patroni-managed PostgreSQL pair). The tests start their clusters themselves
# (tests/support/galera.rs), on loopback ports of their own; nothing runs
# after this script.

le_cluster_main() {
    local missing=()
    [ -f /usr/lib/galera/libgalera_smm.so ] || missing+=(galera-4)
    command -v rsync >/dev/null 2>&1 || missing+=(rsync)
    [ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
    [ -x /usr/bin/patroni ] || missing+=(patroni)
    [ -x /usr/bin/etcd ] || missing+=(etcd-server)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "cluster.sh: installing ${missing[*]}" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null \
            || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >/dev/null; } \
            || { echo "cluster.sh: cannot install ${missing[*]}" >&2; return 1; }
    fi
}

le_cluster_main
