#!/usr/bin/env bash
# The Debian package a site installs (docs/operations/installing.md): the CycloneDX SBOM of
# this build (scripts/sbom.py, from Cargo.lock) in target/sbom/, then `cargo deb`, which ships
# it with the binary. Honours CARGO_TARGET_DIR for the build; extra arguments go to cargo deb.
set -euo pipefail
cd "$(dirname "$0")/.."
# Not under target/release/: cargo-deb takes an asset there for a build product of another
# package and then builds the whole workspace, which turns the test harness's `dev-tools`
# feature on in the packaged binary (the package test refuses that).
mkdir -p target/sbom
python3 scripts/sbom.py --out target/sbom/msgexchange.cdx.json
# The docs book as HTML (docs/book.toml writes target/book; the package installs it under
# /usr/share/doc/msgexchange/html, where the alerts' runbook_url points). Needs mdbook
# (scripts/test.sh installs the pinned version).
mdbook build docs
cargo deb -p msgx-actors --locked "$@"
