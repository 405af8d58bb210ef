#!/usr/bin/env bash
# Builds the previous release's `msgexchange` (a git commit or tag) once and caches it; prints
# the binary's path. The upgrade test (tests/upgrade.rs) runs it against the new schema and the
# new binary against its data: every migration must keep the previous release working
# (docs/architecture.md, "Schema changes: expand, then contract").
#
#   scripts/prev_release.sh            # the release in PREV_RELEASE below (or $MSGX_PREV_RELEASE)
#
# The source comes from `git archive` (no checkout, no worktree: the repository's state is not
# touched; a shallow clone needs `git fetch --unshallow` first). It is built with the test
# profile (dev) into the caller's target dir (CARGO_TARGET_DIR, else target/), right after the
# test build there (scripts/test.sh): the release builds from its own Cargo.lock, and where its
# dependencies' versions and features match the test build's they are reused (for 6d86680 only
# the sqlx crates, which this tree patches, and its two own crates compile). The binary is
# renamed `msgexchange-prev` in the copy so it never replaces this workspace's msgexchange.
# Cache: target/package-build/prev-release/<commit>/msgexchange. scripts/test.sh builds it before
# the tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The commit before issue 30 (lease before migrate, fail-closed defaults). Move it to the last
# release when one is cut (a tag works too).
PREV_RELEASE=${MSGX_PREV_RELEASE:-6d8668077f3b299b22e0eebd7752f9c36c3172b5}
commit=$(git rev-parse --verify "${PREV_RELEASE}^{commit}")
# The cache has one place whatever the target dir: the upgrade test calls this script in the
# test's environment and must find the binary test.sh built.
target=${CARGO_TARGET_DIR:-$root/target}
cache=$root/target/package-build/prev-release/$commit
bin=$cache/msgexchange
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root/target/package-build/prev-release"
# One build at a time (tests run in parallel).
exec 9>"$root/target/package-build/prev-release/.lock"
flock 9
if [ ! -x "$bin" ]; then
  src=$root/target/package-build/prev-release/src-$commit
  rm -rf "$src"
  mkdir -p "$src"
  git archive "$commit" | tar -x -C "$src"
  # The copy's binary gets its own name: cargo copies a built binary to target/debug/<name>,
  # which must stay this workspace's.
  perl -0pi -e 's/\[\[bin\]\]\nname = "msgexchange"/[[bin]]\nname = "msgexchange-prev"/' \
    "$src/actors/Cargo.toml"
  grep -q 'name = "msgexchange-prev"' "$src/actors/Cargo.toml"
  echo "prev_release: building msgexchange at $commit (test profile, $target)" >&2
  cargo build --locked --quiet --manifest-path "$src/Cargo.toml" --target-dir "$target" \
    -p msgx-actors --bin msgexchange-prev >&2
  mkdir -p "$cache"
  cp "$target/debug/msgexchange-prev" "$bin.tmp"
  mv "$bin.tmp" "$bin"
  rm -rf "$src"
fi
echo "$bin"
