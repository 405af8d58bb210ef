#!/usr/bin/env bash
# The Debian package a site installs (docs/operations.md "Installing"): the CycloneDX SBOM of
# this build (scripts/sbom.py, from Cargo.lock) beside the release binary, then `cargo deb`,
# which ships both. Honours CARGO_TARGET_DIR; extra arguments go to cargo deb.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
python3 scripts/sbom.py --out "$target/release/msgexchange.cdx.json"
cargo deb -p msgx-actors --locked "$@"
