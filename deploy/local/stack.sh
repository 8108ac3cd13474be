#!/usr/bin/env bash
# The whole local stack: Kafka 127.0.0.1:19092 (controller 19093), PostgreSQL 127.0.0.1:15432,
# moto 127.0.0.1:14566, toxiproxy API 127.0.0.1:18474, Jaeger OTLP 127.0.0.1:14317 (gRPC) /
# 127.0.0.1:14318 (HTTP) and query API 127.0.0.1:16686 (query gRPC 16685), Zipkin (the trace
# UI, fed by Jaeger through Kafka) 127.0.0.1:19411. Kafka also serves SASL_SSL on 19094 and a
# wrong-host certificate on 19095 (deploy/local/kafka.sh). Optional, for fault tests:
# kafka-cluster, three KRaft nodes on 127.0.0.1:19192,19292,19392 (deploy/local/kafka-cluster.sh),
# started only when named (`make stack-up KAFKA_NODES=3`); postgres-ha, a primary on
# 127.0.0.1:15442 with a synchronous streaming standby on 15443 (deploy/local/postgres-ha.sh),
# and pgbouncer, PgBouncer in transaction mode on 127.0.0.1:16432 before the stack's
# PostgreSQL (deploy/local/pgbouncer.sh), started only when named (`make stack-up PG_HA=1`).
# usage: deploy/local/stack.sh up [COMPONENT...]|down|status
#   up     install what is missing and start what is not running (no-op on a running stack);
#          only the named components when some are given (`make demo` needs no toxiproxy)
#   down   stop everything, the optional components too; nothing is left running
#   status one line per component; exit non-zero if any is not running (the optional
#          ones are shown but do not count)
set -euo pipefail
COMPONENT=stack
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

D="$HERALD_LOCAL_SCRIPTS"
COMPONENTS=(postgres moto toxiproxy jaeger kafka zipkin)
# started only when named; stopped by `down` whenever running
OPTIONAL=(kafka-cluster postgres-ha pgbouncer)

up() {
  local t0 c wanted=("$@"); t0="$(now_s)"
  [ ${#wanted[@]} -gt 0 ] || wanted=("${COMPONENTS[@]}")
  for c in "${wanted[@]}"; do
    case " ${COMPONENTS[*]} ${OPTIONAL[*]} " in *" $c "*) ;; *) die "unknown component '$c' (${COMPONENTS[*]} ${OPTIONAL[*]})" ;; esac
  done
  # in the stack's order (kafka late: it is the slowest to become ready; zipkin reads from it;
  # the optional three-node cluster last)
  for c in "${COMPONENTS[@]}" "${OPTIONAL[@]}"; do
    case " ${wanted[*]} " in *" $c "*) "$D/$c.sh" start ;; esac
  done
  say "up in $(( $(now_s) - t0 ))s"
}

down() {
  local c rc=0
  # stop in reverse order; keep going if one fails so nothing is left behind
  for c in pgbouncer postgres-ha kafka-cluster zipkin kafka jaeger toxiproxy moto postgres; do
    "$D/$c.sh" stop || rc=1
  done
  return "$rc"
}

status() {
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    "$D/$c.sh" status || rc=1
  done
  for c in "${OPTIONAL[@]}"; do
    "$D/$c.sh" status || true
  done
  return "$rc"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
