#!/usr/bin/env bash
# (Re)starts the local PostgreSQL and MariaDB idempotently and waits until both answer.
# Used by scripts/test.sh, scripts/demo.sh and .ci/run on a machine of the rust-svc kind.
set -euo pipefail

start_pg() {
  if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then return 0; fi
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    local ver
    ver=$(ls /etc/postgresql | sort -V | tail -n 1)
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  fi
}

start_mariadb() {
  if mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then return 0; fi
  if [ -x /usr/sbin/mariadbd ]; then
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
  fi
}

start_pg
start_mariadb
for _ in $(seq 1 60); do
  if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "services.sh: PostgreSQL or MariaDB did not come up on 127.0.0.1" >&2
pg_isready -h 127.0.0.1 -p 5432 || true
mariadb-admin -h 127.0.0.1 -uroot ping || true
exit 1
