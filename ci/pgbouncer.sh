#!/usr/bin/env bash
# PgBouncer for tests, in transaction pooling mode, running deploy/pgbouncer.ini
# as it is, with only what is local to this machine added (port, trust on
# loopback, log and pid files). PgBouncer refuses to run as root: it runs as
# the postgres user from a directory of its own.
#
#   ci/pgbouncer.sh start DIR PORT [UPSTREAM_PORT]  start it; prints its server URL
#   ci/pgbouncer.sh stop DIR                        stop it
set -euo pipefail
cd "$(dirname "$0")/.."

command=${1:?start or stop}
dir=${2:?a directory for its files}

case "$command" in
  start)
    port=${3:?a port to listen on}
    upstream=${4:-5432}
    if ! command -v pgbouncer >/dev/null; then
      apt-get install -y pgbouncer >/dev/null
    fi
    mkdir -p "$dir"
    cp deploy/pgbouncer.ini "$dir/deploy.ini"
    sed -i "s/^\* = host=127.0.0.1 port=5432$/* = host=127.0.0.1 port=$upstream/" "$dir/deploy.ini"
    printf '"postgres" ""\n' >"$dir/userlist.txt"
    # No section header: these lines continue the [pgbouncer] section that
    # the included file ends with (a second header would reset it).
    cat >"$dir/pgbouncer.ini" <<EOF
%include $dir/deploy.ini
listen_port = $port
auth_type = trust
auth_file = $dir/userlist.txt
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
unix_socket_dir =
EOF
    chown -R postgres "$dir"
    ulimit -n 4096 2>/dev/null || true
    runuser -u postgres -- pgbouncer -d "$dir/pgbouncer.ini"
    for _ in $(seq 1 50); do
      if pg_isready -h 127.0.0.1 -p "$port" -q 2>/dev/null; then
        echo "postgres://postgres@127.0.0.1:$port"
        exit 0
      fi
      sleep 0.1
    done
    echo "PgBouncer did not start on port $port; its log:" >&2
    cat "$dir/pgbouncer.log" >&2 || true
    exit 1
    ;;
  stop)
    if [ -f "$dir/pgbouncer.pid" ]; then
      kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
    fi
    ;;
  *)
    echo "usage: $0 start DIR PORT [UPSTREAM_PORT] | stop DIR" >&2
    exit 2
    ;;
esac
