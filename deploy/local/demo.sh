#!/usr/bin/env bash
# `make demo`: runs `herald run --roles ingest,relay,deliver` on the local stack in the background,
# drives it with target/debug/herald-demo (sample sellers and orders), prints the
# resulting intents, then stops herald with SIGTERM (it drains and exits 0).
# Usage: demo.sh HERALD_BIN CONFIG_FILE
set -euo pipefail
COMPONENT=demo
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bin="$1" config="$2"
demo_bin="$(dirname "$bin")/herald-demo"
mkdir -p "$HERALD_LOCAL_DIR/demo"
log="$HERALD_LOCAL_DIR/demo/herald.log"

say "starting herald run --roles ingest,relay,deliver (log: $log)"
"$bin" --config "$config" run --roles ingest,relay,deliver </dev/null >"$log" 2>&1 &
herald_pid=$!
stop_herald() {
  if kill -0 "$herald_pid" 2>/dev/null; then
    say "stopping herald (SIGTERM: drain, commit offsets, exit)"
    kill -TERM "$herald_pid" 2>/dev/null || true
    wait "$herald_pid" 2>/dev/null || true
  fi
}
trap stop_herald EXIT

if ! "$demo_bin"; then
  warn "demo failed; last lines of the herald log:"
  tail -n 30 "$log" >&2
  exit 1
fi
