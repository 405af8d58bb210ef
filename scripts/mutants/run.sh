#!/usr/bin/env bash
# The mutant run of issue 52 item 5: each mutant of scripts/mutants/catalogue.tsv (one small
# patch of a decision rule) is applied, the chaos binary rebuilt, the operator-action CI set
# run against it, and the patch reverted; which checks killed it is recorded from the run's
# violation lines. Not part of scripts/test.sh: each mutant is a rebuild plus a chaos run.
#
#   scripts/mutants/run.sh                  every mutant of the catalogue
#   scripts/mutants/run.sh 01-mark-early 13-hole-released-at-once
#
# MUTANT_FULL=1 runs the whole CI set per mutant (the kill table's "every check" column);
# by default the run stops at the first failed sequence (a mutant is killed once one plan
# breaks). Results: target/mutants/<id>.log and a row per mutant in target/mutants/results.tsv.
# The working tree's src/ and actors/ must be clean: the script refuses otherwise, and reverts
# its patch on every exit.
#
# A sequence that failed only because an operator CLI could not open the store (PostgreSQL
# busy with other tests: "pool timed out while waiting for an open connection") is not a kill:
# the run goes on past it, and a mutant nothing else failed is "inconclusive(env)".
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=scripts/mutants
out=target/mutants
mkdir -p "$out"
if ! git diff --quiet -- src actors; then
  echo "run.sh: src/ or actors/ has local changes; commit or stash them first" >&2
  exit 2
fi
ids=("$@")
if [ ${#ids[@]} -eq 0 ]; then
  mapfile -t ids < <(grep -v '^#' "$dir/catalogue.tsv" | cut -f1)
fi
applied=""
revert() {
  if [ -n "$applied" ]; then
    git apply -R "$dir/$applied.patch"
    applied=""
  fi
}
trap revert EXIT
test_cmd=(cargo test -p msgx-actors --test chaos -- operator_actions_against_a_live_pipeline --nocapture)

# Which checks a log's violations name, with how many lines each: the sampler's checks by
# their own names, the other violation lines by what they judge.
checks_of() {
  {
    grep -oE 'sampler: FIRST [a-z_]+' "$1" | sed -E 's/sampler: FIRST /sampler:/'
    grep -E 'ops: VIOLATION' "$1" | grep -v 'ops: VIOLATION sampler:' |
      sed -E 's/.*ops: VIOLATION //' | awk '
      /^verify --kafka/ { print "verify"; next }
      /predicted idle/ { print "idle-is-no-op"; next }
      /predicted effective/ { print "effect"; next }
      /the model predicts|model rules it out|the model expected|the model allows|model predicts no such/ { print "reference-model"; next }
      /purge/ { print "purge-check"; next }
      /replay/ { print "replay-check"; next }
      /skip/ { print "skip-check"; next }
      /did not settle/ { print "settle"; next }
      /held|hole|W [0-9]/ { print "held-commit-judge"; next }
      /panicked/ { print "panic"; next }
      /event|topic|record|duplicate/ { print "events-check"; next }
      { print "other" }'
  } | sort | uniq -c | sort -rn | awk '{printf "%s%s(%d)", sep, $2, $1; sep=", "}'
}

# Violation lines other than an operator CLI's store-connect timeout (see the header).
real_violations() {
  grep -E 'ops: VIOLATION' "$1" | grep -vc 'pool timed out while waiting for an open connection' || true
}

for id in "${ids[@]}"; do
  patch="$dir/$id.patch"
  [ -f "$patch" ] || { echo "run.sh: no $patch" >&2; exit 2; }
  git apply "$patch"
  applied="$id"
  log="$out/$id.log"
  start=$(date +%s)
  echo "== $id: building and running the CI set (log $log)"
  if ! cargo build -q -p msgx-actors --test chaos --bins >"$log" 2>&1; then
    verdict="build-failed"
  else
    # Own process group, so the run (cargo, the test, the instances it started) can be
    # stopped at its first failed sequence.
    setsid "${test_cmd[@]}" >>"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      if [ "${MUTANT_FULL:-0}" != 1 ] && [ "$(real_violations "$log")" -gt 0 ]; then
        sleep 2
        kill -TERM -- "-$pid" 2>/dev/null || true
        break
      fi
      sleep 5
    done
    wait "$pid" && rc=0 || rc=$?
    if [ "$(real_violations "$log")" -gt 0 ]; then
      verdict="killed"
    elif grep -qE 'ops: [a-z0-9]+ FAILED in|test result: FAILED' "$log"; then
      verdict="inconclusive(env)"
    elif [ "$rc" -eq 0 ]; then
      verdict="SURVIVED"
    else
      verdict="error(rc=$rc)"
    fi
  fi
  secs=$(($(date +%s) - start))
  first=$(grep -m1 -E 'ops: [a-z0-9]+ FAILED in' "$log" | sed -E 's/^ops: ([a-z0-9]+) FAILED.*/\1/' || true)
  checks=$(checks_of "$log" || true)
  printf '%s\t%s\t%s\t%ss\t%s\t%s\n' "$id" "$verdict" "${first:--}" "$secs" \
    "${checks:--}" "$(git rev-parse --short HEAD)" | tee -a "$out/results.tsv"
  revert
done
