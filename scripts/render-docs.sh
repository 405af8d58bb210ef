#!/usr/bin/env bash
# Renders every generated part of the docs, then checks them as the test run does:
#   - docs/architecture.md's actor table (from the actors' code),
#   - docs/metrics.md (from src/telemetry, prometheus/alerts.yml and the dashboards),
#   - the generated top of each alert page docs/alerts/<alert>.md (from prometheus/alerts.yml
#     and the dashboards; telemetry::tests::alert_pages),
#   - docs/img/dashboard-*.png and docs/img/rendered.json (scripts/render_dashboards.py, from
#     grafana/dashboards/msgexchange.json and the scenario data docs/img/scenario.json).
# The unit tests fail while any of them is stale (actors/src/rendered_docs.rs says which test
# checks what); docs/architecture.md's crate table is written by hand and only checked.
#
#   scripts/render-docs.sh              # everything, from the recorded scenario
#   scripts/render-docs.sh --scenario   # first records the scenario again (about 5 minutes;
#                                       # prometheus, tansu): when the dashboard asks for data
#                                       # the recorded scenario lacks
# Needs python3 with matplotlib (pip install matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--scenario" ]; then
  cargo test --workspace --test observability -- --ignored scenario_for_pictures --nocapture
fi
python3 scripts/render_dashboards.py
MSGX_WRITE_DOCS=1 cargo test --workspace --lib -- architecture_doc metrics_doc alert_pages
# What the test run will say.
cargo test --workspace --lib -- architecture_doc metrics_doc alert_pages dashboard_pictures
