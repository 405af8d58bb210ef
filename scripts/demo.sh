#!/usr/bin/env bash
# From a fresh machine to the service doing its main job: builds, starts the local databases,
# creates the dev inbox (acting as the DB owner), feeds it with the upstream simulator, and
# runs msgexchange in the foreground. Ctrl-C stops both.
#
# What to look at (README, "The demo"): in another terminal
#   target/debug/msgexchange status --watch      (the script prints the line to paste)
# and http://127.0.0.1:9464/metrics. The pipeline is healthy most of the time (backlog near
# zero, drain estimate a few seconds); now and then one of the incidents below shows for a few
# seconds and clears on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
# The demo runs `dev inbox-fixture` and `dev simulate-upstream`: the dev-tools feature (which
# the Debian package's build never has). The tests' build has it too, in the same profile and
# target dir with the same dependency features: after scripts/test.sh this builds nothing.
cargo build --locked -p msgx-actors --features dev-tools --bin msgexchange
bin=${CARGO_TARGET_DIR:-target}/debug/msgexchange
export MSGX_INBOX__URL=${MSGX_INBOX__URL:-mysql://root@127.0.0.1:3306/msgx_inbox}
export MSGX_STORE__URL=${MSGX_STORE__URL:-postgres://postgres@127.0.0.1:5432/msgx}
# What the fail-closed defaults require (docs/operations.md, "Defaults that fail closed"): the
# in-process mock Kafka cluster, said explicitly (its events vanish when the demo stops), and
# the first start's cutover choice — the simulator fills the inbox before the service starts,
# and `zero` processes all of it (applied once on the fresh store, ignored afterwards).
export MSGX_KAFKA__BROKERS=${MSGX_KAFKA__BROKERS:-embedded}
export MSGX_PIPELINE__CUTOVER_WATERMARK=${MSGX_PIPELINE__CUTOVER_WATERMARK-zero}

# The mix, at DEMO_RATE=20 msg/s (the incidents scale with the rate):
# - hole: 0.3 % of the inserts roll back (one every ~17 s); the rows behind it wait
#   max_commit_delay (4 s) for it, then the hole is released (status: "hole", W stops then jumps).
# - late arrival: 1 % of the transactions hold their commit up to 6 s; those held longer than
#   max_commit_delay (+ a poll) commit after their hole was released and arrive LATE (one every
#   ~20 s; msgx_inbox_permanent_holes_released_total, then the late detector's counters).
# - poison head: 0.08 % of the messages are of an unknown type (one every ~60 s); it holds the
#   FIFO head, retried from 2 s on, until head_deadline (10 s) makes it DEAD(EXHAUSTED) and the
#   queue drains the ~200 messages that waited behind it in a second or two (status: head
#   FAILED, backlog rising, then back to ~0).
# - daily schedule: 0.02 % of the messages are a huge (1 MiB, ~2,900 flights) schedule (one every
#   ~4 min); the FIFO waits while it is applied (seconds on a quiet machine, ~20 s on a loaded
#   one; the simulator's default of 0.1 % would make that every 50 s).
# A head_deadline below the mean gap between unknown-type messages is what keeps the queue
# healthy: with 0.2 % at 20 msg/s (one every 25 s) and a 30 s deadline the head was blocked
# more often than not and the backlog only grew.
export MSGX_PIPELINE__MAX_COMMIT_DELAY=${MSGX_PIPELINE__MAX_COMMIT_DELAY:-4s}
export MSGX_PROCESSING__HEAD_DEADLINE=${MSGX_PROCESSING__HEAD_DEADLINE:-10s}
export MSGX_PROCESSING__RETRY_INITIAL=${MSGX_PROCESSING__RETRY_INITIAL:-2s}
# The drain estimate divides the backlog by the rate over this window; the default 5m window
# is mostly empty in a fresh demo, which made the estimate minutes for a few messages.
export MSGX_PROCESSING__DRAIN_RATE_WINDOW=${MSGX_PROCESSING__DRAIN_RATE_WINDOW:-30s}

"$bin" dev inbox-fixture
"$bin" dev simulate-upstream --rate "${DEMO_RATE:-20}" --connections 8 \
  --hold-fraction 0.01 --hold-max 6s --rollback-fraction 0.003 \
  --unknown-type-fraction 0.0008 --huge-fraction 0.0002 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
echo "simulator running (pid $sim); starting msgexchange — metrics at http://127.0.0.1:9464/metrics"
echo "watch it: MSGX_INBOX__URL=$MSGX_INBOX__URL MSGX_STORE__URL=$MSGX_STORE__URL" \
  "MSGX_PROCESSING__DRAIN_RATE_WINDOW=$MSGX_PROCESSING__DRAIN_RATE_WINDOW $bin status --watch"
"$bin" run
