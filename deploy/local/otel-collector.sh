#!/usr/bin/env bash
# Checks deploy/otel-collector/config.yaml with the collector itself: the local stack's Jaeger v2
# binary is an OpenTelemetry Collector distribution (collector v0.139.0 components: otlp
# receiver, memory_limiter, tail_sampling, batch, otlphttp exporter), so its `validate` command
# is what `otelcol-contrib validate` does. `validate` decodes the configuration but does not
# build the tail-sampling policies (an unknown policy type or OTTL that does not parse passes
# it), so the check then starts the collector on loopback ports until its pipelines are running.
# usage: deploy/local/otel-collector.sh check
set -euo pipefail
COMPONENT=otel-collector
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CONFIG="$HERALD_ROOT/deploy/otel-collector/config.yaml"
BIN="$HERALD_LOCAL_DIR/jaeger/bin/jaeger"
LOG="$HERALD_LOCAL_DIR/otel-collector-check.log"
# Loopback ports of the check run (the config's defaults are for a pod).
GRPC_PORT=19317
HTTP_PORT=19318
METRICS_PORT=19888
START_TIMEOUT=30

do_check() {
  "$HERALD_LOCAL_SCRIPTS/jaeger.sh" install >/dev/null
  export OTLP_LISTEN_HOST=127.0.0.1 OTLP_GRPC_PORT=$GRPC_PORT OTLP_HTTP_PORT=$HTTP_PORT \
    METRICS_HOST=127.0.0.1 METRICS_PORT=$METRICS_PORT TRACES_BACKEND=http://127.0.0.1:9
  mkdir -p "$HERALD_LOCAL_DIR"
  if ! "$BIN" validate --config "file:$CONFIG" >"$LOG" 2>&1; then
    tail_log "$LOG"
    die "validate refused $CONFIG"
  fi
  for p in $GRPC_PORT $HTTP_PORT $METRICS_PORT; do
    port_open "$p" && die "port $p is in use: cannot start the check run"
  done
  "$BIN" --config "file:$CONFIG" >"$LOG" 2>&1 &
  local pid=$! t0 ready=0
  t0="$(now_s)"
  while [ $(( $(now_s) - t0 )) -lt "$START_TIMEOUT" ]; do
    if grep -q "Everything is ready" "$LOG"; then ready=1; break; fi
    pid_alive "$pid" || break
    sleep 0.2
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [ "$ready" != 1 ]; then
    tail_log "$LOG"
    die "the collector did not start its pipelines with $CONFIG"
  fi
  say "valid, and its pipelines start ($CONFIG)"
}

case "${1:-}" in
  check) do_check ;;
  *) echo "usage: $0 check" >&2; exit 2 ;;
esac
