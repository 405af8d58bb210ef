#!/usr/bin/env bash
# From a fresh machine to the service doing its main job: builds, starts the local databases,
# creates the dev inbox (acting as the DB owner), feeds it with the upstream simulator, and
# runs msgexchange in the foreground. Watch http://127.0.0.1:9464/metrics; Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo build --workspace
bin=target/debug/msgexchange
export MSGX_INBOX__URL=${MSGX_INBOX__URL:-mysql://root@127.0.0.1:3306/msgx_inbox}
export MSGX_STORE__URL=${MSGX_STORE__URL:-postgres://postgres@127.0.0.1:5432/msgx}
# Short enough that a newcomer sees permanent holes released within the demo. Rows behind a
# rolled-back id wait this long (holes seen together wait once, side by side).
export MSGX_PIPELINE__MAX_COMMIT_DELAY=${MSGX_PIPELINE__MAX_COMMIT_DELAY:-10s}
# An unknown-type message holds the FIFO head until it is poison; keep that short in the demo.
export MSGX_PROCESSING__HEAD_DEADLINE=${MSGX_PROCESSING__HEAD_DEADLINE:-30s}

"$bin" dev inbox-fixture
"$bin" dev simulate-upstream --rate "${DEMO_RATE:-20}" --connections 8 --hold-max 3s \
  --rollback-fraction 0.003 --unknown-type-fraction 0.002 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
echo "simulator running (pid $sim); starting msgexchange — metrics at http://127.0.0.1:9464/metrics"
"$bin" run
