#!/usr/bin/env bash
# A PostgreSQL server of its own for the tests, the benchmarks and a
# replicated control plane on one machine: made in a folder (initdb, as an
# unprivileged user), listening on 127.0.0.1 only, on a free port, with a
# password of its own (SCRAM). Nothing of the system's PostgreSQL service
# is used or started.
#
#   scripts/postgres.sh start DIR   make (if new) and start the server in DIR;
#                                   prints its URL (also in DIR/url)
#   scripts/postgres.sh stop DIR    stop it (fast shutdown; its postmaster's
#                                   PID is killed if that does not end it)
#   scripts/postgres.sh kill DIR    SIGKILL its postmaster (a crash)
#   scripts/postgres.sh url DIR     print the URL of a server made in DIR
#
# With PG_TLS=1 at its first start the server also speaks TLS, with a
# certificate for 127.0.0.1 from a CA of its own (DIR/ca.pem, for
# `sslrootcert`).
#
# The binaries are Debian's (package postgresql, installed by
# scripts/install-deps.sh); PG_BIN overrides where they are.
set -euo pipefail

usage() { echo "usage: $0 start|stop|kill|url DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd="$1"
dir="$2"

bin="${PG_BIN:-}"
if [ -z "$bin" ]; then
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ]; then bin="$d"; break; fi
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "$0: no PostgreSQL server binaries (initdb) found; run scripts/install-deps.sh" >&2
  exit 1
fi

# initdb and the server refuse to run as root: as root, run them as the
# package's own unprivileged user.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

data="$dir/data"
pidfile="$data/postmaster.pid"

postmaster_pid() {
  [ -f "$pidfile" ] && head -1 "$pidfile" || true
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

case "$cmd" in
  start)
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres: "$dir"
      # A private temporary folder (mode 0700) is let be passed through,
      # not read, so the server's user reaches its own folder inside.
      parent="$(dirname "$(realpath "$dir")")"
      runuser -u postgres -- test -x "$parent" || chmod o+x "$parent"
      runuser -u postgres -- test -w "$dir" \
        || { echo "$0: user postgres cannot reach $dir" >&2; exit 1; }
    fi
    chmod 700 "$dir"
    if [ ! -f "$data/PG_VERSION" ]; then
      pw="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
      as_owner sh -c "umask 077; printf '%s\n' '$pw' > '$dir/pwfile'"
      as_owner "$bin/initdb" -D "$data" -U talos --pwfile="$dir/pwfile" \
        --auth=scram-sha-256 --no-locale -E UTF8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
      as_owner rm -f "$dir/pwfile"
      printf '%s\n' "$pw" > "$dir/password"
      chmod 600 "$dir/password"
      if [ "${PG_TLS:-0}" = 1 ]; then
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
          -subj "/CN=talos test postgres CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
          -subj "/CN=127.0.0.1" -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > "$dir/ext.cnf"
        openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
          -CAcreateserial -days 2 -extfile "$dir/ext.cnf" -out "$dir/server.crt" 2>/dev/null
        rm -f "$dir/ca.key" "$dir/server.csr" "$dir/ext.cnf" "$dir/ca.srl"
        cp "$dir/server.crt" "$dir/server.key" "$data/"
        if [ "$(id -u)" -eq 0 ]; then chown postgres: "$data/server.crt" "$data/server.key"; fi
        chmod 600 "$data/server.key"
        rm -f "$dir/server.key"
        printf "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n" \
          | as_owner tee -a "$data/postgresql.conf" >/dev/null
      fi
    fi
    pw="$(cat "$dir/password")"
    port=""
    [ -f "$dir/port" ] && port="$(cat "$dir/port")"
    for attempt in 1 2 3 4 5; do
      [ -n "$port" ] || port="$(free_port)"
      if as_owner "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 start \
          -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='$dir' \
              -c fsync=on -c max_connections=200" >/dev/null; then
        break
      fi
      # The port was taken meanwhile: another one.
      port=""
      if [ "$attempt" -eq 5 ]; then tail -20 "$dir/server.log" >&2; exit 1; fi
    done
    echo "$port" > "$dir/port"
    url="postgres://talos:$pw@127.0.0.1:$port/postgres"
    printf '%s\n' "$url" > "$dir/url"
    chmod 600 "$dir/url"
    printf '%s\n' "$url"
    ;;
  stop)
    pid="$(postmaster_pid)"
    [ -n "$pid" ] || exit 0
    as_owner "$bin/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    ;;
  kill)
    pid="$(postmaster_pid)"
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
    ;;
  url)
    cat "$dir/url"
    ;;
  *) usage ;;
esac
