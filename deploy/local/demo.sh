#!/usr/bin/env bash
# `make demo`: runs `herald run --roles ingest,relay,deliver` (sending through a toxiproxy
# proxy in front of moto) and `herald run --roles reconcile` on the local stack in the
# background, drives them with target/debug/herald-demo (sample sellers and orders, one
# e-mail made unknown and settled by SES's events), prints the resulting intents, then
# stops herald with SIGTERM (it drains and exits 0).
# Usage: demo.sh HERALD_BIN CONFIG_FILE
set -euo pipefail
COMPONENT=demo
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bin="$1" config="$2"
demo_bin="$(dirname "$bin")/herald-demo"
mkdir -p "$HERALD_LOCAL_DIR/demo"
log="$HERALD_LOCAL_DIR/demo/herald.log"

# The SES event queue the reconcile role reads, and a toxiproxy proxy in front of moto for
# the senders (the demo holds SES's answers once, to make one e-mail `unknown`).
# moto's SNS delivers both forms (the demo publishes one event of each) and signs nothing
# verifiable: the envelope topic is named, its signatures go unchecked (README, "Provider
# evidence: who may write to the queue").
setup_out="$("$demo_bin" setup)"
queue_url="${setup_out%%$'\n'*}"
topic_arn="${setup_out#*$'\n'}"
export HERALD_RECONCILE__QUEUE_URL="$queue_url"
export HERALD_RECONCILE__SNS_TOPIC_ARNS="[\"$topic_arn\"]"
export HERALD_RECONCILE__SNS_SIGNATURES=unchecked
export HERALD_RECONCILE__RAW_DELIVERY=true
say "starting herald run --roles ingest,relay,deliver, sending through toxiproxy (log: $log)"
HERALD_AWS__ENDPOINT_URL=http://127.0.0.1:14567 \
  "$bin" --config "$config" run --roles ingest,relay,deliver </dev/null >"$log" 2>&1 &
herald_pid=$!
reconcile_log="$HERALD_LOCAL_DIR/demo/reconcile.log"
say "starting herald run --roles reconcile on $queue_url (log: $reconcile_log)"
HERALD_ADMIN__LISTEN=127.0.0.1:19465 \
  "$bin" --config "$config" run --roles reconcile </dev/null >"$reconcile_log" 2>&1 &
reconcile_pid=$!
stop_herald() {
  for pid in "$herald_pid" "$reconcile_pid"; do
    if kill -0 "$pid" 2>/dev/null; then
      say "stopping herald $pid (SIGTERM: drain, commit offsets, exit)"
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
}
trap stop_herald EXIT

if ! "$demo_bin"; then
  warn "demo failed; last lines of the herald log:"
  tail -n 30 "$log" >&2
  exit 1
fi
