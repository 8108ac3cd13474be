#!/usr/bin/env bash
# Local Jaeger (v2, all-in-one, in-memory) on 127.0.0.1: OTLP gRPC 14317, OTLP HTTP 14318,
# query API + UI 16686, query gRPC 16685. Nothing else listens (see deploy/local/jaeger/config.yaml).
# usage: deploy/local/jaeger.sh install|start|stop|status|restart
# The binary is built from the Go module (`go build ./cmd/jaeger`, first run only) into
# .local/jaeger/bin. Traces live in memory only (at most 100000) and are gone on stop. Such a
# build serves the query API and a placeholder page at / (the UI assets are not in the module).
set -euo pipefail
COMPONENT=jaeger
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

JAEGER_OTLP_GRPC_PORT=14317
JAEGER_OTLP_HTTP_PORT=14318
JAEGER_QUERY_PORT=16686
JAEGER_QUERY_GRPC_PORT=16685
JAEGER_PORTS=("$JAEGER_OTLP_GRPC_PORT" "$JAEGER_OTLP_HTTP_PORT" "$JAEGER_QUERY_PORT" "$JAEGER_QUERY_GRPC_PORT")
JAEGER_VERSION=v1.75.0
JAEGER_MODULE=github.com/jaegertracing/jaeger
JAEGER_SPEC="$JAEGER_MODULE/cmd/jaeger@$JAEGER_VERSION"
JAEGER_CONFIG="$HERALD_LOCAL_SCRIPTS/jaeger/config.yaml"
JAEGER_DIR="$HERALD_LOCAL_DIR/jaeger"
JAEGER_BIN_DIR="$JAEGER_DIR/bin"
JAEGER_BIN="$JAEGER_BIN_DIR/jaeger"
JAEGER_MARKER="$JAEGER_BIN_DIR/.installed"
JAEGER_LOG="$JAEGER_DIR/jaeger.log"
JAEGER_PID="$JAEGER_DIR/jaeger.pid"
START_TIMEOUT=60
STOP_TIMEOUT=15

jaeger_pid() { live_pid "$JAEGER_PID" "$JAEGER_BIN" "--config $JAEGER_CONFIG"; }

is_installed() {
  [ -x "$JAEGER_BIN" ] && [ "$(cat "$JAEGER_MARKER" 2>/dev/null)" = "$JAEGER_SPEC" ]
}

do_install() {
  if is_installed; then
    say "already installed ($JAEGER_SPEC)"
    return 0
  fi
  go_toolchain jaeger 1.24 "$JAEGER_DIR"
  local go="$GO" extra_flags="$GO_EXTRA_FLAGS"
  say "building $JAEGER_SPEC with $("$go" version | awk '{print $3}') (first run only: several minutes on 2 cores)"
  local t0; t0="$(now_s)"
  mkdir -p "$JAEGER_BIN_DIR"
  rm -f "$JAEGER_MARKER" "$JAEGER_BIN"
  # `go install $JAEGER_SPEC` is refused ("The go.mod file for the module providing named packages
  # contains one or more replace directives"), so fetch the module and build cmd/jaeger inside it,
  # with the exact dependency versions of its own go.mod/go.sum (what `go install` would pick).
  # -mod=readonly there, not -mod=mod: the module cache is read-only and go.sum is complete.
  local goflags; goflags="$("$go" env GOFLAGS 2>/dev/null || true)"
  local src
  if ! src="$(GOFLAGS="${goflags:+$goflags }$extra_flags" "$go" mod download -json "$JAEGER_MODULE@$JAEGER_VERSION" 2>"$JAEGER_DIR/install.log")"; then
    printf '%s\n' "$src" >>"$JAEGER_DIR/install.log"
    tail_log "$JAEGER_DIR/install.log"
    die "go mod download $JAEGER_MODULE@$JAEGER_VERSION failed"
  fi
  src="$(printf '%s\n' "$src" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  { [ -n "$src" ] && [ -f "$src/go.mod" ]; } || die "go mod download did not report the module directory"
  if ! (cd "$src" && GOFLAGS="${goflags:+$goflags }-mod=readonly$extra_flags" \
      "$go" build -o "$JAEGER_BIN" ./cmd/jaeger) >>"$JAEGER_DIR/install.log" 2>&1; then
    tail_log "$JAEGER_DIR/install.log"
    die "go build of $JAEGER_SPEC failed"
  fi
  [ -x "$JAEGER_BIN" ] || die "go build succeeded but $JAEGER_BIN is missing"
  echo "$JAEGER_SPEC" >"$JAEGER_MARKER"
  say "installed in $(( $(now_s) - t0 ))s ($JAEGER_BIN)"
}

# http_status PATH : print the HTTP status code of GET http://127.0.0.1:$JAEGER_QUERY_PORT/PATH
# (bash /dev/tcp: curl may be absent).
http_status() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n" "$1" "$0" >&3
    IFS=" " read -r _ code _ <&3 || exit 1
    echo "$code"
  ' "$JAEGER_QUERY_PORT" "$1" 2>/dev/null
}

# Ready = the query API answers GET /api/services with 200 (storage and query are up; the
# receivers are started before the query extension reports in).
is_ready() { [ "$(http_status /api/services)" = 200 ]; }

# The config a running Jaeger was started with (its hash, written at start): a Jaeger
# started before the config changed (a pull) is restarted rather than left running it.
config_stamp() { sha256sum "$JAEGER_CONFIG" | awk '{print $1}'; }

do_start() {
  local pid p
  if pid="$(jaeger_pid)"; then
    if [ "$(cat "$JAEGER_DIR/config.sha256" 2>/dev/null)" = "$(config_stamp)" ]; then
      say "already running (pid $pid, OTLP 127.0.0.1:$JAEGER_OTLP_GRPC_PORT/$JAEGER_OTLP_HTTP_PORT, query 127.0.0.1:$JAEGER_QUERY_PORT)"
      return 0
    fi
    say "running with an older $JAEGER_CONFIG: restarting (its in-memory traces are dropped)"
    do_stop
  fi
  is_installed || do_install
  [ -f "$JAEGER_CONFIG" ] || die "config file $JAEGER_CONFIG is missing"
  for p in "${JAEGER_PORTS[@]}"; do
    port_open "$p" && die "port $p is already in use by another process"
  done
  say "starting, OTLP on 127.0.0.1:$JAEGER_OTLP_GRPC_PORT (gRPC) / 127.0.0.1:$JAEGER_OTLP_HTTP_PORT (HTTP), query on 127.0.0.1:$JAEGER_QUERY_PORT"
  local t0; t0="$(now_s)"
  mkdir -p "$JAEGER_DIR"
  printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$JAEGER_LOG"
  config_stamp >"$JAEGER_DIR/config.sha256"
  spawn_detached "$JAEGER_LOG" "$JAEGER_PID" "$JAEGER_BIN" --config "$JAEGER_CONFIG"
  pid="$(read_pidfile "$JAEGER_PID")"
  local deadline=$(( t0 + START_TIMEOUT ))
  while ! is_ready; do
    if ! pid_alive "$pid"; then
      tail_log "$JAEGER_LOG"
      rm -f "$JAEGER_PID"
      die "jaeger exited during startup"
    fi
    if [ "$(now_s)" -ge "$deadline" ]; then
      tail_log "$JAEGER_LOG"
      die "not ready after ${START_TIMEOUT}s (pid $pid left running; '$0 stop' to kill it)"
    fi
    sleep 0.25
  done
  wait_for_port "$JAEGER_OTLP_HTTP_PORT" 10 || { tail_log "$JAEGER_LOG"; die "OTLP HTTP port $JAEGER_OTLP_HTTP_PORT not open"; }
  say "ready in $(( $(now_s) - t0 ))s (pid $pid, query API port $JAEGER_QUERY_PORT)"
}

do_stop() {
  local pid stopped=0 p
  if pid="$(jaeger_pid)"; then
    say "stopping (pid $pid)"
    stop_pid "$pid" "$STOP_TIMEOUT" TERM
    stopped=1
  fi
  for p in $(find_pids "$JAEGER_BIN"); do
    say "killing leftover jaeger pid $p"
    stop_pid "$p" 5 TERM
    stopped=1
  done
  rm -f "$JAEGER_PID"
  if [ "$stopped" = 1 ]; then
    for p in "${JAEGER_PORTS[@]}"; do
      wait_port_free "$p" 10 || die "port $p still in use after stop"
    done
    say "stopped"
  else
    say "not running"
  fi
}

do_status() {
  local pid
  if pid="$(jaeger_pid)" && is_ready; then
    echo "jaeger:   running  127.0.0.1:$JAEGER_QUERY_PORT (pid $pid, OTLP $JAEGER_OTLP_GRPC_PORT/$JAEGER_OTLP_HTTP_PORT)"
  elif [ -n "${pid:-}" ]; then
    echo "jaeger:   starting 127.0.0.1:$JAEGER_QUERY_PORT (pid $pid, not answering yet)"
    return 1
  else
    echo "jaeger:   stopped  127.0.0.1:$JAEGER_QUERY_PORT"
    return 3
  fi
}

dispatch "$@"
