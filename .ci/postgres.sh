#!/usr/bin/env bash
# Throwaway PostgreSQL for the sqljournal tests.
#
#   eval "$(bash .ci/postgres.sh)"       # start (or reuse) it; sets IDEMRETRY_PG_DSN
#   bash .ci/postgres.sh stop            # stop it and delete its files
#
# Installs Debian's postgresql when no server binaries are found (needs root),
# runs a private cluster as user postgres (when started as root) in
# $IDEMRETRY_PG_BASE (default /tmp/idemretry-pg as root, where user postgres
# can reach it, else ${TMPDIR:-/tmp}/idemretry-pg-$UID) on 127.0.0.1 and a
# free port, trust auth on loopback only, and prints export lines for the
# caller to eval. Only the export lines go to stdout; progress goes to stderr.
# Idempotent: a second start reuses the running cluster.
set -euo pipefail

if [ "$(id -u)" -eq 0 ]; then
  base=${IDEMRETRY_PG_BASE:-/tmp/idemretry-pg}
else
  base=${IDEMRETRY_PG_BASE:-${TMPDIR:-/tmp}/idemretry-pg-$(id -u)}
fi
data=$base/data
dbname=idemretry
log() { printf 'postgres.sh: %s\n' "$*" >&2; }

# as_pg runs a command as the cluster's owner: postgres when we are root
# (initdb refuses to run as root), else ourselves.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd "$base" && runuser -u postgres -- "$@")
  else
    (cd "$base" && "$@")
  fi
}

# find_bindir prints the newest installed server's bin directory.
find_bindir() {
  local d
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r | while read -r b; do
    if [ -x "$b/initdb" ] && [ -x "$b/pg_ctl" ]; then echo "$b"; fi
  done)
  d=${d%%$'\n'*} # the newest; reading every line spares the pipe a SIGPIPE
  [ -n "$d" ] && echo "$d"
}

install_server() {
  if [ "$(id -u)" -ne 0 ]; then
    log "PostgreSQL server is not installed and we are not root"; exit 1
  fi
  log "installing Debian's postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold postgresql >&2
}

print_env() {
  local port; port=$(cat "$base/port")
  echo "export IDEMRETRY_PG_DSN='postgres://postgres@127.0.0.1:$port/$dbname?sslmode=disable'"
  echo "export IDEMRETRY_PG_BASE='$base'"
  echo "# stop with: bash .ci/postgres.sh stop"
}

running() {
  [ -f "$base/port" ] && [ -d "$data" ] &&
    as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1 &&
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$(cat "$base/port")"
}

# port_free reports whether nothing listens on 127.0.0.1:$1 (bash's /dev/tcp
# needs no extra tool). A race with another process is caught by pg_ctl
# failing to start, and the caller then tries another port.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ours reports whether $base is missing or was made by this script: only
# then may it be deleted, whatever IDEMRETRY_PG_BASE says.
ours() { [ ! -e "$base" ] || [ -f "$base/.idemretry-pg" ]; }

remove_base() {
  ours || { log "$base was not made by this script; not touching it"; exit 1; }
  rm -rf "$base"
}

stop() {
  if [ -d "$data" ] && bindir=$(find_bindir); then
    as_pg "$bindir/pg_ctl" -D "$data" -m fast -w stop >&2 || true
  fi
  remove_base
  log "stopped; removed $base"
}

start() {
  bindir=$(find_bindir) || { install_server; bindir=$(find_bindir); }
  if running; then
    log "reusing the cluster on port $(cat "$base/port")"
    print_env; return
  fi
  # Whatever is left is a dead or half-made cluster: start over.
  if [ -d "$data" ]; then as_pg "$bindir/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true; fi
  remove_base
  mkdir -p "$base"
  touch "$base/.idemretry-pg"
  chmod 700 "$base"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$base"

  log "initdb in $data ($("$bindir/postgres" --version))"
  # --no-sync and fsync=off: a throwaway cluster needs no crash safety, and
  # a commit still means what it means to the client (synchronous_commit
  # stays at its default).
  as_pg "$bindir/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-locale --no-sync >/dev/null
  cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base'
max_connections = 300
fsync = off
full_page_writes = off
CONF
  # Trust on loopback only; nothing else may connect.
  printf '%s\n' 'local all all trust' 'host all all 127.0.0.1/32 trust' >"$data/pg_hba.conf"

  local port tries=0
  while :; do
    tries=$((tries + 1))
    if [ "$tries" -gt 20 ]; then
      log "could not start; see $base/server.log"; cat "$base/server.log" >&2 || true; exit 1
    fi
    port=$(( 20000 + RANDOM % 40000 ))
    port_free "$port" || continue
    if as_pg "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 -o "-p $port" start >/dev/null; then
      break
    fi
    log "start on port $port failed; trying another"
  done
  echo "$port" >"$base/port"

  for _ in $(seq 1 60); do
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" && break
    sleep 0.5
  done
  "$bindir/pg_isready" -h 127.0.0.1 -p "$port" >&2
  as_pg "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres "$dbname"
  log "ready on 127.0.0.1:$port"
  print_env
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) log "usage: $0 [start|stop]"; exit 2 ;;
esac
