#!/usr/bin/env bash
# Local toxiproxy (TCP fault injection) with its HTTP API on 127.0.0.1:18474.
# usage: deploy/local/toxiproxy.sh install|start|stop|status|restart
# The server is built with `go install` into .local/toxiproxy/bin. It keeps proxies in memory
# only and this script creates none: tests create (and delete) their own through the API.
set -euo pipefail
COMPONENT=toxiproxy
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TOXI_PORT=18474
TOXI_VERSION=v2.12.0
TOXI_SPEC="github.com/Shopify/toxiproxy/v2/cmd/server@$TOXI_VERSION"
TOXI_DIR="$HERALD_LOCAL_DIR/toxiproxy"
TOXI_BIN_DIR="$TOXI_DIR/bin"
TOXI_BIN="$TOXI_BIN_DIR/toxiproxy-server"
TOXI_MARKER="$TOXI_BIN_DIR/.installed"
TOXI_LOG="$TOXI_DIR/toxiproxy.log"
TOXI_PID="$TOXI_DIR/toxiproxy.pid"
START_TIMEOUT=30
STOP_TIMEOUT=10

toxi_pid() { live_pid "$TOXI_PID" "$TOXI_BIN" "-port $TOXI_PORT"; }

is_installed() {
  [ -x "$TOXI_BIN" ] && [ "$(cat "$TOXI_MARKER" 2>/dev/null)" = "$TOXI_SPEC" ]
}

do_install() {
  if is_installed; then
    say "already installed ($TOXI_SPEC)"
    return 0
  fi
  go_toolchain toxiproxy 1.22 "$TOXI_DIR"
  local go="$GO" extra_flags="$GO_EXTRA_FLAGS"
  say "building $TOXI_SPEC with $("$go" version | awk '{print $3}') (first run only)"
  local t0; t0="$(now_s)"
  mkdir -p "$TOXI_BIN_DIR"
  local goflags; goflags="$("$go" env GOFLAGS 2>/dev/null || true)"
  rm -f "$TOXI_MARKER" "$TOXI_BIN_DIR/server"
  if ! GOBIN="$TOXI_BIN_DIR" GOFLAGS="${goflags:+$goflags }-mod=mod$extra_flags" \
      "$go" install "$TOXI_SPEC" >"$TOXI_DIR/install.log" 2>&1; then
    tail_log "$TOXI_DIR/install.log"
    die "go install $TOXI_SPEC failed"
  fi
  [ -x "$TOXI_BIN_DIR/server" ] || die "go install succeeded but $TOXI_BIN_DIR/server is missing"
  mv -f "$TOXI_BIN_DIR/server" "$TOXI_BIN"
  echo "$TOXI_SPEC" >"$TOXI_MARKER"
  say "installed in $(( $(now_s) - t0 ))s ($TOXI_BIN)"
}

# http_status PATH : print the HTTP status code of GET http://127.0.0.1:$TOXI_PORT/PATH
# (bash /dev/tcp: curl may be absent).
http_status() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n" "$1" "$0" >&3
    IFS=" " read -r _ code _ <&3 || exit 1
    echo "$code"
  ' "$TOXI_PORT" "$1" 2>/dev/null
}

# Ready = GET /version answers 200.
is_ready() { [ "$(http_status /version)" = 200 ]; }

do_start() {
  local pid
  if pid="$(toxi_pid)"; then
    say "already running (pid $pid, API port $TOXI_PORT)"
    return 0
  fi
  is_installed || do_install
  port_open "$TOXI_PORT" && die "port $TOXI_PORT is already in use by another process"
  say "starting, API on 127.0.0.1:$TOXI_PORT"
  local t0; t0="$(now_s)"
  mkdir -p "$TOXI_DIR"
  printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$TOXI_LOG"
  spawn_detached "$TOXI_LOG" "$TOXI_PID" "$TOXI_BIN" -host 127.0.0.1 -port "$TOXI_PORT"
  pid="$(read_pidfile "$TOXI_PID")"
  local deadline=$(( t0 + START_TIMEOUT ))
  while ! is_ready; do
    if ! pid_alive "$pid"; then
      tail_log "$TOXI_LOG"
      rm -f "$TOXI_PID"
      die "toxiproxy-server exited during startup"
    fi
    if [ "$(now_s)" -ge "$deadline" ]; then
      tail_log "$TOXI_LOG"
      die "not ready after ${START_TIMEOUT}s (pid $pid left running; '$0 stop' to kill it)"
    fi
    sleep 0.25
  done
  say "ready in $(( $(now_s) - t0 ))s (pid $pid, API port $TOXI_PORT)"
}

do_stop() {
  local pid stopped=0 p
  if pid="$(toxi_pid)"; then
    say "stopping (pid $pid)"
    stop_pid "$pid" "$STOP_TIMEOUT" TERM
    stopped=1
  fi
  for p in $(find_pids "$TOXI_BIN"); do
    say "killing leftover toxiproxy-server pid $p"
    stop_pid "$p" 5 TERM
    stopped=1
  done
  rm -f "$TOXI_PID"
  if [ "$stopped" = 1 ]; then
    wait_port_free "$TOXI_PORT" 10 || die "port $TOXI_PORT still in use after stop"
    say "stopped"
  else
    say "not running"
  fi
}

do_status() {
  local pid
  if pid="$(toxi_pid)" && is_ready; then
    echo "toxiproxy: running  127.0.0.1:$TOXI_PORT (pid $pid)"
  elif [ -n "${pid:-}" ]; then
    echo "toxiproxy: starting 127.0.0.1:$TOXI_PORT (pid $pid, not answering yet)"
    return 1
  else
    echo "toxiproxy: stopped  127.0.0.1:$TOXI_PORT"
    return 3
  fi
}

dispatch "$@"
