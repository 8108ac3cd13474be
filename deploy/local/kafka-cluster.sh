#!/usr/bin/env bash
# Three-node KRaft Kafka cluster for fault tests, apart from the single broker of kafka.sh (its
# own data, ports and processes: killing a node here never disturbs 127.0.0.1:19092).
# Every node is broker+controller (three voters: killing the active controller forces an
# election), PLAINTEXT on loopback only:
#   node 1  broker 127.0.0.1:19192  controller 127.0.0.1:19193
#   node 2  broker 127.0.0.1:19292  controller 127.0.0.1:19293
#   node 3  broker 127.0.0.1:19392  controller 127.0.0.1:19393
# Topics: replication factor 3, min.insync.replicas 2 (internal topics too); auto-creation off.
# Data in .local/kafka-cluster/nodeN/data (formatted once, kept across restarts), logs in
# .local/kafka-cluster/nodeN/logs; the jars are the single broker's (.local/kafka/libs).
# usage: deploy/local/kafka-cluster.sh install|start|stop|status|restart|reset
#   start      start the nodes that are not running; wait until all three brokers are
#              registered and unfenced (the cluster answers an admin request)
#   stop       stop every node (paused ones are resumed first); reset also deletes the data
# Node controls (N is 1, 2 or 3), for the fault tests:
#   kill N        SIGKILL node N (returns once the process is gone)
#   start-node N  start node N (or resume it if paused) and wait until it has rejoined
#                 (its broker registered and unfenced)
#   stop-node N   SIGTERM node N (controlled shutdown) and wait until it is gone
#   pause N | resume N   SIGSTOP / SIGCONT node N
#   pid N         print node N's pid (exit 1 if it is not running)
#   controller    print the node id of the active KRaft controller (waits out an election)
#   leader TOPIC PARTITION   print the partition's leader broker id, or "none"
#   bootstrap     print the bootstrap list (127.0.0.1:19192,127.0.0.1:19292,127.0.0.1:19392)
#   topic NAME [PARTITIONS]  create NAME (replication factor 3) unless it exists
set -euo pipefail
COMPONENT=kafka-cluster
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODES=(1 2 3)
CL_DIR="$HERALD_LOCAL_DIR/kafka-cluster"
KAFKA_LIBS="$HERALD_LOCAL_DIR/kafka/libs"          # installed by kafka.sh
KAFKA_POM="$HERALD_LOCAL_SCRIPTS/kafka/pom.xml"
KAFKA_LOG4J="$HERALD_LOCAL_SCRIPTS/kafka/log4j2.properties"
HEAP_OPTS="${HERALD_KAFKA_CLUSTER_HEAP_OPTS:--Xms192m -Xmx384m}"
ADMIN_CONF="$CL_DIR/admin.properties"
START_TIMEOUT=120
STOP_TIMEOUT=20   # then SIGKILL: a controlled shutdown can wait for a quorum that has gone

broker_port() { echo $(( 19092 + 100 * $1 )); }       # 19192, 19292, 19392
controller_port() { echo $(( 19093 + 100 * $1 )); }   # 19193, 19293, 19393
node_dir() { echo "$CL_DIR/node$1"; }
node_conf() { echo "$CL_DIR/node$1/server.properties"; }
node_log() { echo "$CL_DIR/node$1/logs/server.log"; }   # log4j2 output
node_pidfile() { echo "$CL_DIR/node$1/kafka.pid"; }

join_by_comma() { local IFS=,; echo "$*"; }
all_brokers() { local n out=(); for n in "${NODES[@]}"; do out+=("127.0.0.1:$(broker_port "$n")"); done; join_by_comma "${out[@]}"; }
all_voters() { local n out=(); for n in "${NODES[@]}"; do out+=("$n@127.0.0.1:$(controller_port "$n")"); done; join_by_comma "${out[@]}"; }

check_node() {
  case "${1:-}" in 1 | 2 | 3) ;; *) die "node must be 1, 2 or 3 (got '${1:-}')" ;; esac
}

# node_pid N : pid of node N's JVM (identified by its own server.properties on the command line).
node_pid() { live_pid "$(node_pidfile "$1")" kafka.Kafka "$(node_conf "$1")"; }

# proc_state PID : the one-letter state from /proc (R, S, T = stopped by SIGSTOP, ...).
proc_state() {
  local stat; stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  echo "${stat%% *}"
}
pid_dead() { ! pid_alive "$1"; }
node_paused() { local pid; pid="$(node_pid "$1")" && [ "$(proc_state "$pid")" = T ]; }

# live_list broker|controller : the addresses of the nodes that are running and not paused
# (an admin client stuck on a paused node waits out its request timeout).
live_list() {
  local n out=()
  for n in "${NODES[@]}"; do
    node_pid "$n" >/dev/null && ! node_paused "$n" || continue
    if [ "$1" = broker ]; then out+=("127.0.0.1:$(broker_port "$n")"); else out+=("127.0.0.1:$(controller_port "$n")"); fi
  done
  [ ${#out[@]} -gt 0 ] || die "no node is running (and not paused): '$0 start'"
  join_by_comma "${out[@]}"
}

installed() {
  [ -f "$KAFKA_LIBS/.installed" ] &&
    [ "$(cat "$KAFKA_LIBS/.installed")" = "$(sha256sum "$KAFKA_POM" | awk '{print $1}')" ]
}

# The jars (and Java, Maven) are kafka.sh's: install them through it.
do_install() {
  if ! installed; then
    "$HERALD_LOCAL_SCRIPTS/kafka.sh" install
  fi
  command -v java >/dev/null 2>&1 || die "java not found: '$HERALD_LOCAL_SCRIPTS/kafka.sh install' installs it"
  say "jars ready in $KAFKA_LIBS"
}

# Java admin tools from the jars, with short timeouts (a dead node must not stall a call).
tool() {
  java -Xmx128m -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" "$@"
}

write_configs() {
  local n dir
  mkdir -p "$CL_DIR"
  cat >"$ADMIN_CONF" <<'EOF'
# Admin client settings of deploy/local/kafka-cluster.sh's tool calls: fail fast on a dead node.
request.timeout.ms=3000
default.api.timeout.ms=6000
socket.connection.setup.timeout.ms=2000
socket.connection.setup.timeout.max.ms=5000
EOF
  for n in "${NODES[@]}"; do
    dir="$(node_dir "$n")"
    mkdir -p "$dir/data" "$dir/logs"
    cat >"$(node_conf "$n").tmp" <<EOF
# Generated by deploy/local/kafka-cluster.sh on every start; edit the script, not this file.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(all_voters)
listeners=PLAINTEXT://127.0.0.1:$(broker_port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(broker_port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data

# three replicas, two in sync to accept acks=all writes: one node may be down
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
auto.create.topics.enable=false
offsets.topic.replication.factor=3
# fewer than the default 50: cheaper to create and to move when a node dies
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=6
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
log.retention.hours=24
EOF
    mv "$(node_conf "$n").tmp" "$(node_conf "$n")"
  done
}

# Format every node not yet formatted, all with one cluster id (static voters: no
# --standalone / --initial-controllers). In parallel: three JVMs of a few seconds each.
format_nodes() {
  local n cid pids=() todo=()
  for n in "${NODES[@]}"; do
    [ -f "$(node_dir "$n")/data/meta.properties" ] || todo+=("$n")
  done
  [ ${#todo[@]} -gt 0 ] || return 0
  if [ -s "$CL_DIR/cluster-id" ]; then
    cid="$(cat "$CL_DIR/cluster-id")"
  else
    cid="$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)"
    [ -n "$cid" ] || die "could not generate a cluster id"
    echo "$cid" >"$CL_DIR/cluster-id"
  fi
  say "formatting node(s) ${todo[*]} (cluster id $cid)"
  for n in "${todo[@]}"; do
    java -Xmx128m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
      -Dkafka.logs.dir="$(node_dir "$n")/logs" -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format \
      -c "$(node_conf "$n")" -t "$cid" --ignore-formatted >"$(node_dir "$n")/logs/format.log" 2>&1 &
    pids+=("$!")
  done
  local i rc=0
  for i in "${!todo[@]}"; do
    if ! wait "${pids[$i]}"; then
      tail_log "$(node_dir "${todo[$i]}")/logs/format.log"
      rc=1
    fi
  done
  [ "$rc" = 0 ] || die "storage format failed (a node formatted with another cluster id? '$0 reset' deletes the cluster's data)"
}

# spawn_node N : start node N's JVM; prints the size of its log before the start (the
# readiness check reads only what comes after).
spawn_node() {
  local n="$1" p offset=0 log
  for p in "$(broker_port "$n")" "$(controller_port "$n")"; do
    port_open "$p" && die "port $p (node $n) is already in use by another process (find it with: ss -ltnp 'sport = :$p')"
  done
  log="$(node_log "$n")"
  [ -f "$log" ] && offset="$(stat -c %s "$log")"
  printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$(node_dir "$n")/logs/kafka.out"
  # shellcheck disable=SC2086  # HEAP_OPTS is split into words on purpose
  spawn_detached "$(node_dir "$n")/logs/kafka.out" "$(node_pidfile "$n")" \
    java $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true \
    -Dkafka.logs.dir="$(node_dir "$n")/logs" -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$(node_conf "$n")"
  echo "$offset"
}

# node_started_since N OFFSET : node N's log says, after OFFSET, that the server started. A
# KRaft broker reports this only once the controller has unfenced it (registered, caught up).
node_started_since() {
  local log; log="$(node_log "$1")"
  [ -f "$log" ] || return 1
  # (no grep -q: grep leaving early would kill tail with SIGPIPE, a failure under pipefail)
  tail -c +"$(( $2 + 1 ))" "$log" 2>/dev/null |
    grep -e 'Kafka Server started' -e 'started (kafka.server.KafkaRaftServer)' >/dev/null
}

# unfenced_brokers : the ids of the brokers the cluster lists as registered and unfenced
# (ClusterTool list-endpoints, i.e. DescribeCluster, asked through the running nodes).
unfenced_brokers() {
  local out
  out="$(tool org.apache.kafka.tools.ClusterTool list-endpoints --bootstrap-server "$(live_list broker)" \
    --command-config "$ADMIN_CONF" --include-fenced-brokers 2>/dev/null)" || return 1
  printf '%s\n' "$out" | awk '$5 == "unfenced" && $6 == "broker" {print $1}' | sort -n | paste -sd ' '
}

# wait_nodes DEADLINE N:OFFSET... : each node's log says it started (after OFFSET; "-" skips
# this, for a node already running), then the cluster lists every one of them as unfenced.
# Dies (naming the node and its log) on exit or timeout.
wait_nodes() {
  local deadline="$1"; shift
  local item n offset pid pending=("$@") left
  while [ ${#pending[@]} -gt 0 ]; do
    left=()
    for item in "${pending[@]}"; do
      n="${item%%:*}"; offset="${item#*:}"
      [ "$offset" = - ] && continue
      node_started_since "$n" "$offset" && continue
      if ! pid="$(node_pid "$n")"; then
        tail_log "$(node_dir "$n")/logs/kafka.out" 20
        tail_log "$(node_log "$n")"
        die "node $n exited during startup"
      fi
      left+=("$item")
    done
    pending=("${left[@]+"${left[@]}"}")
    [ ${#pending[@]} -eq 0 ] && break
    if [ "$(now_s)" -ge "$deadline" ]; then
      for item in "${pending[@]}"; do tail_log "$(node_log "${item%%:*}")" 20; done
      die "node(s) ${pending[*]%%:*} not started after ${START_TIMEOUT}s (left running; '$0 stop' to stop them)"
    fi
    sleep 0.5
  done
  # the brokers' own view: every node we waited for is registered and unfenced
  local want=() got
  for item in "$@"; do want+=("${item%%:*}"); done
  while :; do
    got="$(unfenced_brokers || true)"
    local missing=()
    for n in "${want[@]}"; do
      case " $got " in *" $n "*) ;; *) missing+=("$n") ;; esac
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(now_s)" -ge "$deadline" ] && die "broker(s) ${missing[*]} not listed as unfenced after ${START_TIMEOUT}s (unfenced: ${got:-none})"
    sleep 0.5
  done
}

do_start() {
  local n pid t0 started=()
  t0="$(now_s)"
  installed || do_install
  write_configs
  format_nodes
  for n in "${NODES[@]}"; do
    if pid="$(node_pid "$n")"; then
      node_paused "$n" && die "node $n (pid $pid) is paused: '$0 resume $n' first"
      continue
    fi
    started+=("$n:$(spawn_node "$n")")
  done
  if [ ${#started[@]} -eq 0 ]; then
    say "already running (3 nodes, bootstrap $(all_brokers))"
    return 0
  fi
  say "starting node(s) ${started[*]%%:*} (bootstrap $(all_brokers))"
  wait_nodes $(( t0 + START_TIMEOUT )) "${started[@]}"
  say "ready in $(( $(now_s) - t0 ))s (brokers $(unfenced_brokers) unfenced; bootstrap $(all_brokers))"
}

# stop_nodes GRACE N... : SIGCONT (a paused JVM cannot act on SIGTERM), SIGTERM to all at
# once (a controlled shutdown needs a controller quorum, so they go together), SIGKILL after GRACE.
stop_nodes() {
  local grace="$1"; shift
  local n pid pids=() p
  for n in "$@"; do
    pid="$(node_pid "$n")" || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid")
  done
  # (node_pid also finds a JVM whose pid file was lost, through /proc)
  local deadline=$(( $(now_s) + grace )) alive=1
  while [ "$alive" = 1 ]; do
    alive=0
    for p in "${pids[@]+"${pids[@]}"}"; do pid_alive "$p" && alive=1; done
    [ "$alive" = 1 ] || break
    if [ "$(now_s)" -ge "$deadline" ]; then
      for p in "${pids[@]}"; do
        pid_alive "$p" && { warn "pid $p still alive after ${grace}s, sending SIGKILL"; kill -KILL "$p" 2>/dev/null || true; }
      done
      for p in "${pids[@]}"; do wait_with_timeout 10 "pid $p to die" pid_dead "$p" || true; done
      break
    fi
    sleep 0.2
  done
  for n in "$@"; do
    rm -f "$(node_pidfile "$n")"
    wait_port_free "$(broker_port "$n")" 15 || die "port $(broker_port "$n") still in use after stopping node $n"
  done
  [ ${#pids[@]} -gt 0 ]
}

do_stop() {
  local t0; t0="$(now_s)"
  if stop_nodes "$STOP_TIMEOUT" "${NODES[@]}"; then
    say "stopped in $(( $(now_s) - t0 ))s"
  else
    say "not running"
  fi
}

do_reset() {
  local n
  do_stop
  say "deleting the cluster's data ($CL_DIR/node*/data; the logs are kept)"
  for n in "${NODES[@]}"; do rm -rf "$(node_dir "$n")/data"; done
  rm -f "$CL_DIR/cluster-id"
}

do_status() {
  local n pid parts=() up=0 down=0
  for n in "${NODES[@]}"; do
    if ! pid="$(node_pid "$n")"; then
      parts+=("node$n stopped"); down=$(( down + 1 ))
    elif node_paused "$n"; then
      parts+=("node$n paused pid $pid")
    else
      parts+=("node$n pid $pid"); up=$(( up + 1 ))
    fi
  done
  local detail; detail="$(printf '%s, ' "${parts[@]}")"; detail="${detail%, }"
  if [ "$up" -eq 3 ]; then
    echo "kafka-cluster: running  $(all_brokers) ($detail)"
  elif [ "$down" -eq 3 ]; then
    echo "kafka-cluster: stopped  $(all_brokers)"
    return 3
  else
    echo "kafka-cluster: degraded $(all_brokers) ($detail)"
    return 1
  fi
}

# ---- node controls ----

do_kill() {
  local n="$1" pid
  pid="$(node_pid "$n")" || { say "node $n is not running"; return 0; }
  kill -KILL "$pid" 2>/dev/null || true
  wait_with_timeout 10 "node $n (pid $pid) to die" pid_dead "$pid" || die "node $n (pid $pid) still alive after SIGKILL"
  rm -f "$(node_pidfile "$n")"
  say "killed node $n (pid $pid)"
}

do_start_node() {
  local n="$1" pid t0 offset
  t0="$(now_s)"
  installed || do_install
  if pid="$(node_pid "$n")"; then
    if node_paused "$n"; then
      say "node $n (pid $pid) is paused: resuming it"
      kill -CONT "$pid"
    fi
    # running: wait only for the cluster to list it (it may have been fenced while paused)
    wait_nodes $(( t0 + START_TIMEOUT )) "$n:-"
    say "node $n running (pid $pid; brokers $(unfenced_brokers) unfenced)"
    return 0
  fi
  write_configs
  format_nodes
  offset="$(spawn_node "$n")"
  wait_nodes $(( t0 + START_TIMEOUT )) "$n:$offset"
  say "node $n rejoined in $(( $(now_s) - t0 ))s (pid $(node_pid "$n"); brokers $(unfenced_brokers) unfenced)"
}

do_stop_node() {
  local n="$1" pid t0
  t0="$(now_s)"
  pid="$(node_pid "$n")" || { say "node $n is not running"; return 0; }
  stop_nodes "$STOP_TIMEOUT" "$n" >/dev/null || true
  say "stopped node $n (pid $pid) in $(( $(now_s) - t0 ))s"
}

do_signal() {
  local n="$1" sig="$2" what="$3" pid
  pid="$(node_pid "$n")" || die "node $n is not running ('$0 start-node $n')"
  kill -s "$sig" "$pid"
  say "$what node $n (pid $pid)"
}

do_pid() {
  local pid
  pid="$(node_pid "$1")" || { echo "node $1 is not running" >&2; return 1; }
  echo "$pid"
}

# The active controller: LeaderId of MetadataQuorumCommand describe --status, asked of the
# running controllers; retried while an election is under way (no leader, or none reachable).
do_controller() {
  local deadline out id
  deadline=$(( $(now_s) + 30 ))
  while :; do
    out="$(tool org.apache.kafka.tools.MetadataQuorumCommand --bootstrap-controller "$(live_list controller)" \
      --command-config "$ADMIN_CONF" describe --status 2>&1)" || true
    id="$(printf '%s\n' "$out" | awk '$1 == "LeaderId:" {print $2}')"
    if [ -n "$id" ] && [ "$id" != -1 ]; then
      # a leader that is not running (just killed) is stale news from a lagging voter
      if node_pid "$id" >/dev/null 2>&1 && ! node_paused "$id"; then echo "$id"; return 0; fi
    fi
    [ "$(now_s)" -ge "$deadline" ] && { printf '%s\n' "$out" >&2; die "no active controller found within 30s"; }
    sleep 0.5
  done
}

# A partition's leader as the brokers' metadata says (TopicCommand --describe): a broker id, or
# "none". After a kill the dead broker is still named until the controller fences it
# (broker.session.timeout.ms, 9 s by default): poll.
do_leader() {
  local topic="$1" partition="$2" out leader deadline
  [[ "$partition" =~ ^[0-9]+$ ]] || die "PARTITION must be a number (got '$partition')"
  # retried for a while: a call can time out on a node that has just died or been paused
  deadline=$(( $(now_s) + 30 ))
  until out="$(tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(live_list broker)" \
      --command-config "$ADMIN_CONF" --describe --topic "$topic" 2>&1)"; do
    case "$out" in *"does not exist"*) die "topic $topic does not exist ('$0 topic $topic N' creates it)" ;; esac
    [ "$(now_s)" -ge "$deadline" ] && { printf '%s\n' "$out" >&2; die "could not describe topic $topic within 30s"; }
    sleep 0.5
  done
  leader="$(printf '%s\n' "$out" | awk -v p="$partition" '
    { for (i = 1; i < NF; i++) if ($i == "Partition:" && $(i + 1) == p) found = 1 }
    found { for (i = 1; i < NF; i++) if ($i == "Leader:") { print $(i + 1); exit } }')"
  [ -n "$leader" ] || die "topic $topic has no partition $partition"
  case "$leader" in -1 | none) echo none ;; *) echo "$leader" ;; esac
}

do_topic() {
  local name="$1" partitions="${2:-1}" out
  if ! out="$(tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(live_list broker)" \
      --command-config "$ADMIN_CONF" --create --if-not-exists --topic "$name" \
      --partitions "$partitions" --replication-factor 3 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "could not create topic $name (are all three nodes up? '$0 status')"
  fi
  say "topic $name present ($partitions partition(s), replication factor 3)"
}

action="${1:-}"
[ $# -gt 0 ] && shift
case "$action" in
  install) with_lock "$COMPONENT" do_install ;;
  start) with_lock "$COMPONENT" do_start ;;
  stop) with_lock "$COMPONENT" do_stop ;;
  restart) with_lock "$COMPONENT" do_stop && with_lock "$COMPONENT" do_start ;;
  reset) with_lock "$COMPONENT" do_reset ;;
  status) do_status ;;
  kill) check_node "${1:-}"; do_kill "$1" ;;
  start-node) check_node "${1:-}"; with_lock "$COMPONENT" do_start_node "$1" ;;
  stop-node) check_node "${1:-}"; with_lock "$COMPONENT" do_stop_node "$1" ;;
  pause) check_node "${1:-}"; do_signal "$1" STOP paused ;;
  resume) check_node "${1:-}"; do_signal "$1" CONT resumed ;;
  pid) check_node "${1:-}"; do_pid "$1" ;;
  controller) do_controller ;;
  leader) [ $# -eq 2 ] || die "usage: $0 leader TOPIC PARTITION"; do_leader "$1" "$2" ;;
  bootstrap) all_brokers ;;
  topic) [ $# -ge 1 ] || die "usage: $0 topic NAME [PARTITIONS]"; do_topic "$1" "${2:-1}" ;;
  *)
    echo "usage: $0 install|start|stop|status|restart|reset" >&2
    echo "       $0 kill N|start-node N|stop-node N|pause N|resume N|pid N   (N = 1, 2, 3)" >&2
    echo "       $0 controller|leader TOPIC PARTITION|bootstrap|topic NAME [PARTITIONS]" >&2
    exit 2 ;;
esac
