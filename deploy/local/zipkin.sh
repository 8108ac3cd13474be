#!/usr/bin/env bash
# Local Zipkin server on 127.0.0.1:19411: the trace UI (http://127.0.0.1:19411/zipkin/) and its
# query API (/api/v2/trace/<trace id>). Nothing else listens.
# usage: deploy/local/zipkin.sh install|start|stop|status|restart
#
# How spans reach it: Herald exports OTLP to Jaeger (deploy/local/jaeger.sh), whose collector
# pipeline also writes every span, as Zipkin v2 JSON, to the Kafka topic `zipkin`
# (deploy/local/jaeger/config.yaml); this server's Kafka collector reads that topic. Zipkin has
# no OTLP endpoint, and Herald keeps one export (OTLP). So Zipkin starts after Kafka, and
# creates the topic it reads. Spans live in memory only (MEM_MAX_SPANS) and are gone on stop.
#
# The server is Zipkin's own executable jar from Maven (io.zipkin:zipkin-server, classifier
# exec, Java 17), installed into .local/zipkin on first use.
set -euo pipefail
COMPONENT=zipkin
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ZIPKIN_PORT=19411
ZIPKIN_VERSION=3.5.1
ZIPKIN_ARTIFACT="io.zipkin:zipkin-server:$ZIPKIN_VERSION:jar:exec"
ZIPKIN_TOPIC=zipkin
KAFKA_BOOTSTRAP=127.0.0.1:19092
ZIPKIN_DIR="$HERALD_LOCAL_DIR/zipkin"
ZIPKIN_JAR="$ZIPKIN_DIR/zipkin-server-$ZIPKIN_VERSION-exec.jar"
ZIPKIN_LOG="$ZIPKIN_DIR/zipkin.log"
ZIPKIN_PID="$ZIPKIN_DIR/zipkin.pid"
ZIPKIN_HEAP_OPTS="${HERALD_ZIPKIN_HEAP_OPTS:--Xms64m -Xmx384m}"
START_TIMEOUT=90
STOP_TIMEOUT=15

zipkin_pid() { live_pid "$ZIPKIN_PID" "$ZIPKIN_JAR"; }

ensure_tools() {
  if ! command -v java >/dev/null 2>&1; then
    say "installing Java 17 (Debian package)"
    apt_install openjdk-17-jre-headless
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    say "installing Maven (Debian package)"
    apt_install maven
  fi
}

is_installed() { [ -s "$ZIPKIN_JAR" ]; }

do_install() {
  if is_installed; then
    say "already installed ($ZIPKIN_ARTIFACT)"
    return 0
  fi
  require_root
  ensure_tools
  say "fetching $ZIPKIN_ARTIFACT via Maven (first run only, 131 MB)"
  local t0; t0="$(now_s)"
  mkdir -p "$ZIPKIN_DIR"
  rm -rf "$ZIPKIN_DIR/jar.tmp"
  if ! mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
      -Dartifact="$ZIPKIN_ARTIFACT" -DoutputDirectory="$ZIPKIN_DIR/jar.tmp" \
      >"$ZIPKIN_DIR/mvn.log" 2>&1; then
    tail_log "$ZIPKIN_DIR/mvn.log"
    die "maven could not fetch $ZIPKIN_ARTIFACT"
  fi
  # Moved into place whole, so a fetch cut short never passes for an installed jar.
  mv "$ZIPKIN_DIR/jar.tmp/$(basename "$ZIPKIN_JAR")" "$ZIPKIN_JAR" || die "maven produced no $(basename "$ZIPKIN_JAR")"
  rm -rf "$ZIPKIN_DIR/jar.tmp"
  say "installed in $(( $(now_s) - t0 ))s ($ZIPKIN_JAR)"
}

# Ready = GET /health answers 200: storage and the Kafka collector report UP (the collector
# is DOWN while it cannot reach the broker, and /health then answers 503).
is_ready() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  [ "$(timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET /health HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n" "$0" >&3
    IFS=" " read -r _ code _ <&3 || exit 1
    echo "$code"
  ' "$ZIPKIN_PORT" 2>/dev/null)" = 200 ]
}

do_start() {
  local pid
  if pid="$(zipkin_pid)"; then
    say "already running (pid $pid, UI http://127.0.0.1:$ZIPKIN_PORT/zipkin/)"
    return 0
  fi
  is_installed || do_install
  ensure_tools
  port_open "$ZIPKIN_PORT" && die "port $ZIPKIN_PORT is already in use by another process"
  "$HERALD_LOCAL_SCRIPTS/kafka.sh" status >/dev/null ||
    die "Kafka is not running: Zipkin reads its spans from Kafka's topic $ZIPKIN_TOPIC (start kafka first)"
  "$HERALD_LOCAL_SCRIPTS/kafka.sh" topic "$ZIPKIN_TOPIC" 1
  say "starting, UI and API on 127.0.0.1:$ZIPKIN_PORT, spans from Kafka topic $ZIPKIN_TOPIC"
  local t0; t0="$(now_s)"
  printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$ZIPKIN_LOG"
  # Armeria's port list replaces Zipkin's default (*:9411) with one listener on loopback.
  # shellcheck disable=SC2086
  spawn_detached "$ZIPKIN_LOG" "$ZIPKIN_PID" \
    env STORAGE_TYPE=mem MEM_MAX_SPANS=200000 KAFKA_BOOTSTRAP_SERVERS="$KAFKA_BOOTSTRAP" \
    KAFKA_TOPIC="$ZIPKIN_TOPIC" KAFKA_GROUP_ID=zipkin \
    java $ZIPKIN_HEAP_OPTS -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -jar "$ZIPKIN_JAR" \
    '--armeria.ports[0].ip=127.0.0.1' "--armeria.ports[0].port=$ZIPKIN_PORT" \
    '--armeria.ports[0].protocols[0]=http'
  pid="$(read_pidfile "$ZIPKIN_PID")"
  local deadline=$(( t0 + START_TIMEOUT ))
  while ! is_ready; do
    if ! pid_alive "$pid"; then
      tail_log "$ZIPKIN_LOG"
      rm -f "$ZIPKIN_PID"
      die "zipkin exited during startup"
    fi
    if [ "$(now_s)" -ge "$deadline" ]; then
      tail_log "$ZIPKIN_LOG"
      die "not ready after ${START_TIMEOUT}s (pid $pid left running; '$0 stop' to kill it)"
    fi
    sleep 0.25
  done
  say "ready in $(( $(now_s) - t0 ))s (pid $pid, UI http://127.0.0.1:$ZIPKIN_PORT/zipkin/)"
}

do_stop() {
  local pid stopped=0 p
  if pid="$(zipkin_pid)"; then
    say "stopping (pid $pid)"
    stop_pid "$pid" "$STOP_TIMEOUT" TERM
    stopped=1
  fi
  for p in $(find_pids "$ZIPKIN_JAR"); do
    say "killing leftover zipkin pid $p"
    stop_pid "$p" 5 TERM
    stopped=1
  done
  rm -f "$ZIPKIN_PID"
  if [ "$stopped" = 1 ]; then
    wait_port_free "$ZIPKIN_PORT" 10 || die "port $ZIPKIN_PORT still in use after stop"
    say "stopped"
  else
    say "not running"
  fi
}

# Running = the port is open: /health also answers 503 while Kafka is down (a chaos run
# stops it), and the UI still serves what it holds then.
do_status() {
  local pid
  if pid="$(zipkin_pid)" && port_open "$ZIPKIN_PORT"; then
    if is_ready; then
      echo "zipkin:   running  127.0.0.1:$ZIPKIN_PORT (pid $pid, UI /zipkin/)"
    else
      echo "zipkin:   running  127.0.0.1:$ZIPKIN_PORT (pid $pid, UI /zipkin/; its Kafka collector is down)"
    fi
  elif [ -n "${pid:-}" ]; then
    echo "zipkin:   starting 127.0.0.1:$ZIPKIN_PORT (pid $pid, not answering yet)"
    return 1
  else
    echo "zipkin:   stopped  127.0.0.1:$ZIPKIN_PORT"
    return 3
  fi
}

dispatch "$@"
