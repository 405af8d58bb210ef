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

wait_up() {
  for _ in $(seq 1 60); do
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  echo "services.sh: PostgreSQL or MariaDB did not come up on 127.0.0.1" >&2
  pg_isready -h 127.0.0.1 -p 5432 || true
  mariadb-admin -h 127.0.0.1 -uroot ping || true
  exit 1
}

# TLS for tests/db_tls.rs: a self-signed test CA (and a second, unrelated "wrong" CA), a server
# certificate for localhost / 127.0.0.1 and a client certificate for $TLS_CERT_USER, made once
# under $TLS_DIR. Both servers serve it and verify client certificates against the test CA.
# Each gets one user that may connect only over TLS and one that needs the client certificate
# too (PostgreSQL `clientcert=verify-full`, MariaDB `REQUIRE X509`); passwords all digits on
# purpose: a secret is never reinterpreted as a number. Every other user connects as before.
TLS_DIR=/var/lib/msgx-test-tls
TLS_USER=msgxt_tls_only
TLS_CERT_USER=msgxt_tls_cert
TLS_PASSWORD=0012345678
# 1 when make_test_tls (re)made the files: the servers reload them.
TLS_FRESH=0

# The CA's key is kept (root only) since the client certificate: a set made before it (no
# ca.key, no client.crt) is made again as a whole, so one CA signs everything.
make_test_tls() {
  local f complete=1
  for f in ca.crt ca.key other-ca.crt server.crt client.crt client.key; do
    [ -s "$TLS_DIR/$f" ] || complete=0
  done
  if [ "$complete" = 1 ]; then return 0; fi
  local tmp
  tmp=$(mktemp -d)
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=msgx test CA" \
    -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=msgx unrelated CA" \
    -keyout "$tmp/other-ca.key" -out "$tmp/other-ca.crt" 2>/dev/null
  issue_cert "$tmp" server "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1" serverAuth
  # PostgreSQL's clientcert=verify-full matches the certificate's CN to the user name.
  issue_cert "$tmp" client "/CN=$TLS_CERT_USER" "subjectAltName=DNS:$TLS_CERT_USER" clientAuth
  mkdir -p "$TLS_DIR"
  chmod 755 "$TLS_DIR"
  install -m 644 "$tmp/ca.crt" "$tmp/other-ca.crt" "$tmp/server.crt" "$tmp/client.crt" "$TLS_DIR/"
  install -m 600 "$tmp/ca.key" "$tmp/client.key" "$TLS_DIR/"
  # Each server insists on owning its key (PostgreSQL refuses a key others can read).
  install -m 600 -o postgres "$tmp/server.key" "$TLS_DIR/pg-server.key"
  install -m 600 -o mysql "$tmp/server.key" "$TLS_DIR/my-server.key"
  rm -rf "$tmp"
  TLS_FRESH=1
}

# issue_cert DIR NAME SUBJECT SAN USAGE: DIR/NAME.{key,crt} signed by DIR/ca.*.
issue_cert() {
  local dir=$1 name=$2
  openssl req -newkey rsa:2048 -nodes -subj "$3" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  printf '%s\n' "$4" "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
    "extendedKeyUsage=$5" >"$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 3650 -extfile "$dir/$name.ext" -out "$dir/$name.crt" 2>/dev/null
}

pg_sql() { psql -h 127.0.0.1 -U postgres -qAtc "$1"; }

# PostgreSQL reloads certificates and pg_hba.conf without a restart.
pg_tls() {
  local hba reload=$TLS_FRESH
  if [ "$(pg_sql 'SHOW ssl_cert_file')" != "$TLS_DIR/server.crt" ] || [ "$(pg_sql 'SHOW ssl')" != on ] \
    || [ "$(pg_sql 'SHOW ssl_ca_file')" != "$TLS_DIR/ca.crt" ]; then
    pg_sql "ALTER SYSTEM SET ssl_cert_file = '$TLS_DIR/server.crt'"
    pg_sql "ALTER SYSTEM SET ssl_key_file = '$TLS_DIR/pg-server.key'"
    # The CA client certificates are checked against (only where pg_hba.conf asks for one).
    pg_sql "ALTER SYSTEM SET ssl_ca_file = '$TLS_DIR/ca.crt'"
    pg_sql "ALTER SYSTEM SET ssl = on"
    reload=1
  fi
  hba=$(pg_sql 'SHOW hba_file')
  # First match wins: these lines come before the trust lines.
  if ! grep -q "$TLS_USER" "$hba"; then
    sed -i "1i hostnossl all $TLS_USER all reject\nhostssl all $TLS_USER all scram-sha-256" "$hba"
    reload=1
  fi
  if ! grep -q "$TLS_CERT_USER" "$hba"; then
    sed -i "1i hostnossl all $TLS_CERT_USER all reject\nhostssl all $TLS_CERT_USER all scram-sha-256 clientcert=verify-full" "$hba"
    reload=1
  fi
  if [ "$reload" = 1 ]; then pg_sql "SELECT pg_reload_conf()" >/dev/null; fi
  # The certificate user may use the TLS user's test databases (a member of its role).
  pg_sql "DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$TLS_USER') THEN
    CREATE ROLE $TLS_USER LOGIN PASSWORD '$TLS_PASSWORD'; END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$TLS_CERT_USER') THEN
    CREATE ROLE $TLS_CERT_USER LOGIN PASSWORD '$TLS_PASSWORD' IN ROLE $TLS_USER; END IF; END \$\$"
}

my_sql() { mariadb -h 127.0.0.1 -uroot -N -e "$1"; }

# MariaDB reads ssl_cert/ssl_key/ssl_ca only at start (FLUSH SSL reloads them only when SSL
# was on at start): the snippet is written once and the server restarted only while SSL is off.
my_tls() {
  local conf=/etc/mysql/conf.d/msgx-test-tls.cnf
  mkdir -p /etc/mysql/conf.d
  printf '%s\n' "# msgexchange scripts/services.sh: TLS for the tests (tests/db_tls.rs)" "[mysqld]" \
    "ssl_ca = $TLS_DIR/ca.crt" "ssl_cert = $TLS_DIR/server.crt" "ssl_key = $TLS_DIR/my-server.key" >"$conf.new"
  if cmp -s "$conf.new" "$conf"; then rm -f "$conf.new"; else mv "$conf.new" "$conf"; fi
  grep -q '^!includedir /etc/mysql/conf.d' /etc/mysql/my.cnf || printf '\n!includedir /etc/mysql/conf.d/\n' >>/etc/mysql/my.cnf
  if [ "$(my_sql "SHOW VARIABLES LIKE 'have_ssl'" | awk '{print $2}')" != YES ]; then
    echo "services.sh: restarting MariaDB once to turn TLS on ($(date -u +%H:%M:%S) UTC)" >&2
    mariadb-admin -h 127.0.0.1 -uroot shutdown
    for _ in $(seq 1 150); do
      start-stop-daemon --status --exec /usr/sbin/mariadbd || break
      sleep 0.2
    done
    start_mariadb
    wait_up
  elif [ "$TLS_FRESH" = 1 ]; then
    # SSL was on at start: FLUSH SSL re-reads the (re)made files.
    my_sql "FLUSH SSL"
  fi
  my_sql "CREATE USER IF NOT EXISTS '$TLS_USER'@'%' IDENTIFIED BY '$TLS_PASSWORD' REQUIRE SSL;
    GRANT ALL PRIVILEGES ON \`msgxt\\_tls\\_%\`.* TO '$TLS_USER'@'%';
    CREATE USER IF NOT EXISTS '$TLS_CERT_USER'@'%' IDENTIFIED BY '$TLS_PASSWORD' REQUIRE X509;
    GRANT ALL PRIVILEGES ON \`msgxt\\_tls\\_%\`.* TO '$TLS_CERT_USER'@'%'"
}

start_pg
start_mariadb
wait_up
if command -v openssl >/dev/null 2>&1; then
  make_test_tls
  pg_tls
  my_tls
else
  echo "services.sh: no openssl: the servers stay without TLS (tests/db_tls.rs skips, or fails under CI=true)" >&2
fi
