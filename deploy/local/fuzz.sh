#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time (SECONDS each, default 60):
# libFuzzer, seeded from fuzz/corpus/<target>/ (read only); what it discovers goes to
# .local/fuzz/<target>/, a crash to fuzz/artifacts/<target>/ and a non-zero exit.
# cargo-fuzz is installed (pinned) on first use by tool.sh; the fuzz crate's own dependencies
# (fuzz/Cargo.lock) are fetched first. On a stable toolchain the build needs
# RUSTC_BOOTSTRAP=1 for cargo-fuzz's -Z flags, and runs without a sanitizer.
set -euo pipefail
COMPONENT=fuzz
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds="${1:-60}"
"$HERALD_LOCAL_SCRIPTS/tool.sh" cargo-fuzz

cd "$HERALD_ROOT"
say "cargo fetch --locked (fuzz/Cargo.lock)"
cargo fetch --locked --manifest-path fuzz/Cargo.toml
export RUSTC_BOOTSTRAP=1
targets=$(cargo fuzz list)
failed=()
for t in $targets; do
  mkdir -p ".local/fuzz/$t"
  log=".local/fuzz/$t.log"
  say "$t: ${seconds}s (log: $log)"
  if ! cargo fuzz run --sanitizer none "$t" ".local/fuzz/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 >"$log" 2>&1; then
    failed+=("$t")
    grep -E "panicked|SUMMARY|Test unit written" "$log" | head -n 5 || true
  fi
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  say "$t: ${runs:-?} inputs run, corpus $(find ".local/fuzz/$t" -type f | wc -l) discovered + $(find "fuzz/corpus/$t" -type f | wc -l) seeds"
done
if [ ${#failed[@]} -gt 0 ]; then
  die "crashes in: ${failed[*]} (inputs under fuzz/artifacts/)"
fi
say "every target ran ${seconds}s without a crash"
