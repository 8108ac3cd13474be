#!/usr/bin/env bash
# Local single-node Kafka (KRaft broker+controller) on 127.0.0.1 (data kept across restarts):
#   19092  PLAINTEXT: the default for everything (Herald, the tools, Zipkin) and inter-broker
#   19093  CONTROLLER (KRaft)
#   19094  SASL_SSL: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, OAUTHBEARER (unsecured JWTs, alg none,
#          with `sub` and `exp`); server certificate for IP:127.0.0.1 and DNS:localhost; client
#          certificates requested, not required (checked against the CA when given: mTLS)
#   19095  WRONGHOST: SASL_SSL with SCRAM-SHA-512 only, its certificate (same CA) names only
#          kafka.wrong-host.invalid, so a client that verifies the host name must refuse it
#   19096  MTLS: TLS (no SASL) with a client certificate required, signed by the CA
#          (`client-cert NAME` issues one)
#   19099  JMX (loopback, no auth): read by `auth-stats`
# User `herald` (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN), one password made at random once:
# .local/kafka/sasl/herald.password (0600, no trailing newline). TLS under .local/kafka/tls:
# ca.crt/ca.key (a CA of its own, made once, never replaced), server.* and wronghost.*
# (remade when missing, expiring within 30 days or not signed by ca.crt); keys are PKCS#8 PEM.
# usage: deploy/local/kafka.sh install|start|stop|status|restart
#        deploy/local/kafka.sh topic NAME [PARTITIONS] | client-cert NAME | auth-stats
#        deploy/local/kafka.sh client-properties MECHANISM [PORT] | scram-user NAME <PASSWORD
#   topic  create NAME on the running broker unless it exists (auto-creation is off): the
#          stack's own topics, such as the one Jaeger writes spans to for Zipkin
#   client-cert NAME  .local/kafka/tls/NAME.crt and NAME.key (PKCS#8), signed by the CA, for
#          mTLS tests (made once; remade like the server's)
#   auth-stats  the broker's own counts of successful and failed authentications, one line per
#          listener: `LISTENER successful=N failed=N` (socket-server-metrics through JMX)
#   scram-user NAME  a SCRAM-SHA-512 user NAME, its password read from stdin (tests' own users)
#   client-properties MECHANISM [PORT]  a Java client .properties file on stdout for user
#          herald over SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or OAUTHBEARER; port 19094)
# `start` on a running broker whose configuration is out of date (e.g. started by an older
# version of this script, without the SASL_SSL listeners) restarts it.
# Jars come from Maven (deploy/local/kafka/pom.xml) into .local/kafka/libs; data in .local/kafka/data.
set -euo pipefail
COMPONENT=kafka
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KAFKA_PORT=19092
KAFKA_CONTROLLER_PORT=19093
KAFKA_SASL_PORT=19094
KAFKA_WRONGHOST_PORT=19095
KAFKA_MTLS_PORT=19096
KAFKA_JMX_PORT=19099
KAFKA_USER=herald
WRONG_HOST=kafka.wrong-host.invalid
KAFKA_DIR="$HERALD_LOCAL_DIR/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_LOGS="$KAFKA_DIR/logs"
KAFKA_CONF="$KAFKA_DIR/server.properties"
KAFKA_PID="$KAFKA_DIR/kafka.pid"
KAFKA_OUT="$KAFKA_LOGS/kafka.out"      # JVM stdout/stderr
KAFKA_LOG="$KAFKA_LOGS/server.log"     # log4j2 output
KAFKA_POM="$HERALD_LOCAL_SCRIPTS/kafka/pom.xml"
KAFKA_LOG4J="$HERALD_LOCAL_SCRIPTS/kafka/log4j2.properties"
KAFKA_TLS="$KAFKA_DIR/tls"
KAFKA_SASL="$KAFKA_DIR/sasl"
KAFKA_PASSWORD_FILE="$KAFKA_SASL/$KAFKA_USER.password"
# cluster id and password hash the SCRAM users were last set for (see ensure_scram_users)
KAFKA_SCRAM_STAMP="$KAFKA_SASL/scram-applied"
CERT_DAYS=825
CERT_RENEW_S=$(( 30 * 24 * 3600 ))   # remake a certificate expiring within 30 days
KAFKA_HEAP_OPTS="${HERALD_KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
START_TIMEOUT=90
STOP_TIMEOUT=30

# Substrings identifying *this* broker's JVM on its command line.
match() { echo "kafka.Kafka" "$KAFKA_CONF"; }

kafka_pid() {
  # shellcheck disable=SC2046
  live_pid "$KAFKA_PID" $(match)
}

ensure_tools() {
  if ! command -v java >/dev/null 2>&1; then
    say "installing Java 17 (Debian package)"
    apt_install openjdk-17-jre-headless
  fi
  local v; v="$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')"
  [ "${v%%.*}" -ge 17 ] 2>/dev/null || die "java >= 17 required, found '${v:-none}'"
  if ! command -v mvn >/dev/null 2>&1; then
    say "installing Maven (Debian package)"
    apt_install maven
  fi
}

installed_stamp() {
  # the jar set depends only on the pom
  sha256sum "$KAFKA_POM" | awk '{print $1}'
}

is_installed() {
  [ -f "$KAFKA_LIBS/.installed" ] && [ "$(cat "$KAFKA_LIBS/.installed")" = "$(installed_stamp)" ]
}

do_install() {
  if is_installed; then
    say "jars already installed ($(ls "$KAFKA_LIBS"/kafka_2.13-*.jar | sed 's/.*kafka_2.13-//; s/\.jar$//'))"
    return 0
  fi
  require_root
  ensure_tools
  say "installing jars via Maven (first run only)"
  local t0; t0="$(now_s)"
  rm -rf "$KAFKA_LIBS.tmp"
  mkdir -p "$KAFKA_LIBS.tmp"
  if ! mvn -q -B -f "$KAFKA_POM" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS.tmp" >"$KAFKA_DIR/mvn.log" 2>&1; then
    tail_log "$KAFKA_DIR/mvn.log"
    die "maven could not resolve the Kafka jars"
  fi
  ls "$KAFKA_LIBS.tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || die "maven produced no kafka_2.13 jar"
  installed_stamp >"$KAFKA_LIBS.tmp/.installed"
  rm -rf "$KAFKA_LIBS"
  mv "$KAFKA_LIBS.tmp" "$KAFKA_LIBS"
  say "jars installed in $(( $(now_s) - t0 ))s ($(ls "$KAFKA_LIBS"/*.jar | wc -l) jars)"
}

# ---- TLS: a CA of its own and PEM certificates (like postgres.sh, with the openssl CLI) ----

ensure_openssl() {
  command -v openssl >/dev/null 2>&1 && return 0
  say "installing openssl (Debian package)"
  apt_install openssl
}

# cert_ok NAME : $KAFKA_TLS/NAME.crt and NAME.key exist, the certificate is signed by ca.crt
# and does not expire within CERT_RENEW_S.
cert_ok() {
  local crt="$KAFKA_TLS/$1.crt" key="$KAFKA_TLS/$1.key"
  [ -s "$crt" ] && [ -s "$key" ] || return 1
  openssl x509 -noout -checkend "$CERT_RENEW_S" -in "$crt" >/dev/null 2>&1 || return 1
  openssl verify -CAfile "$KAFKA_TLS/ca.crt" "$crt" >/dev/null 2>&1
}

# The CA is made once and never replaced while ca.crt exists: clients (Herald's tests) trust it.
ensure_ca() {
  local d="$KAFKA_TLS"
  if [ -s "$d/ca.crt" ]; then
    [ -s "$d/ca.key" ] || die "$d/ca.crt exists without ca.key: certificates cannot be signed; remove $d to make a new CA (clients must then trust the new ca.crt)"
    return 0
  fi
  ensure_openssl
  say "making a local CA in $d (once)"
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out ca.key.tmp
    openssl req -x509 -new -key ca.key.tmp -days 3650 -subj "/CN=Herald local Kafka CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -out ca.crt.tmp
    chmod 0644 ca.crt.tmp
    mv ca.key.tmp ca.key
    mv ca.crt.tmp ca.crt
  ) >"$KAFKA_DIR/openssl.log" 2>&1 || { tail_log "$KAFKA_DIR/openssl.log"; die "could not make the CA in $d"; }
}

# issue_cert NAME CN SUBJECT_ALT_NAME|- serverAuth|clientAuth : a fresh key (PKCS#8 PEM, as
# genpkey writes it) and a certificate signed by the CA, unless cert_ok NAME already holds.
issue_cert() {
  local name="$1" cn="$2" san="$3" usage="$4" d="$KAFKA_TLS"
  cert_ok "$name" && return 1   # nothing to do (1: not issued)
  ensure_openssl
  ensure_ca
  say "issuing $d/$name.crt (CN=$cn$([ "$san" = - ] || echo ", $san"))"
  (
    cd "$d"
    umask 077
    {
      echo "basicConstraints = critical, CA:FALSE"
      echo "keyUsage = critical, digitalSignature, keyEncipherment"
      echo "extendedKeyUsage = $usage"
      [ "$san" = - ] || echo "subjectAltName = $san"
    } >"$name.ext"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$name.key.tmp"
    openssl req -new -key "$name.key.tmp" -subj "/CN=$cn" -out "$name.csr"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
      -days "$CERT_DAYS" -extfile "$name.ext" -out "$name.crt.tmp"
    chmod 0644 "$name.crt.tmp"
    rm -f "$name.csr" "$name.ext"
    mv "$name.key.tmp" "$name.key"
    mv "$name.crt.tmp" "$name.crt"
  ) >"$KAFKA_DIR/openssl.log" 2>&1 || { tail_log "$KAFKA_DIR/openssl.log"; die "could not issue $d/$name.crt"; }
  grep -q -- '-----BEGIN PRIVATE KEY-----' "$d/$name.key" || die "$d/$name.key is not an unencrypted PKCS#8 key"
}

# The broker's two server certificates, and for each the PEM key store Kafka reads
# (ssl.keystore.type=PEM: the PKCS#8 key, then the certificate chain, in one file).
# TLS_ISSUED=1 when one was (re)made: a running broker still serves the old one.
TLS_ISSUED=0
ensure_server_tls() {
  ensure_ca
  if issue_cert server 127.0.0.1 "IP:127.0.0.1, DNS:localhost" serverAuth; then TLS_ISSUED=1; fi
  if issue_cert wronghost "$WRONG_HOST" "DNS:$WRONG_HOST" serverAuth; then TLS_ISSUED=1; fi
  local n
  for n in server wronghost; do
    (umask 077; cat "$KAFKA_TLS/$n.key" "$KAFKA_TLS/$n.crt" "$KAFKA_TLS/ca.crt" >"$KAFKA_TLS/$n.keystore.pem.tmp")
    mv "$KAFKA_TLS/$n.keystore.pem.tmp" "$KAFKA_TLS/$n.keystore.pem"
  done
}

# `client-cert NAME`: a client certificate for mTLS tests (the broker requests one on 19094).
do_client_cert() {
  local name="$1"
  case "$name" in
    ca | server | wronghost | *.keystore) die "'$name' is reserved for the broker's own files; pick another name" ;;
  esac
  [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "client-cert NAME: letters, digits, '.', '_' and '-' only (got '$name')"
  if issue_cert "$name" "$name" - clientAuth; then
    say "client certificate $KAFKA_TLS/$name.crt, key $KAFKA_TLS/$name.key"
  else
    say "client certificate $KAFKA_TLS/$name.crt present and valid"
  fi
}

# ---- SASL: user herald, one random password ----

# The password is made once (32 letters and digits, safe in JAAS and kafka-configs syntax)
# and stored without a trailing newline.
ensure_password() {
  [ -s "$KAFKA_PASSWORD_FILE" ] && return 0
  ensure_openssl
  mkdir -p "$KAFKA_SASL"
  chmod 0700 "$KAFKA_SASL"
  local pw
  pw="$(openssl rand -base64 64 | tr -dc 'A-Za-z0-9')"
  pw="${pw:0:32}"
  [ "${#pw}" -eq 32 ] || die "could not generate a password"
  (umask 077; printf '%s' "$pw" >"$KAFKA_PASSWORD_FILE.tmp")
  mv "$KAFKA_PASSWORD_FILE.tmp" "$KAFKA_PASSWORD_FILE"
  say "generated the password of user $KAFKA_USER in $KAFKA_PASSWORD_FILE"
}

password() { cat "$KAFKA_PASSWORD_FILE"; }

# What the SCRAM users were set for: this data dir's cluster id and the password's hash.
scram_stamp() {
  local cid
  cid="$(sed -n 's/^cluster.id=//p' "$KAFKA_DATA/meta.properties" 2>/dev/null)"
  echo "$cid $(sha256sum "$KAFKA_PASSWORD_FILE" | awk '{print $1}')"
}

# A data dir formatted by an older version of this script (or a new password) has no SCRAM
# users, or other ones: set both mechanisms through the admin API (Kafka's ConfigCommand,
# kafka-configs.sh) on the PLAINTEXT listener. Setting them again is harmless; the stamp
# only saves a JVM start on every `start`.
ensure_scram_users() {
  [ "$(cat "$KAFKA_SCRAM_STAMP" 2>/dev/null)" = "$(scram_stamp)" ] && return 0
  local pw mech; pw="$(password)"
  say "setting the SCRAM-SHA-512 and SCRAM-SHA-256 credentials of user $KAFKA_USER"
  # one mechanism per call: the broker refuses two changes to one user in one request
  # (the log is private: ConfigCommand repeats its arguments, password included, on errors)
  for mech in SCRAM-SHA-512 SCRAM-SHA-256; do
    if ! (umask 077; java -Xmx128m -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" org.apache.kafka.tools.ConfigCommand \
        --bootstrap-server "127.0.0.1:$KAFKA_PORT" --alter --entity-type users --entity-name "$KAFKA_USER" \
        --add-config "$mech=[password=$pw]" >"$KAFKA_LOGS/scram.log" 2>&1); then
      tail_log "$KAFKA_LOGS/scram.log"
      die "could not set the $mech credential of $KAFKA_USER (is the broker answering on 127.0.0.1:$KAFKA_PORT? '$0 status')"
    fi
  done
  scram_stamp >"$KAFKA_SCRAM_STAMP"
}

# `scram-user NAME`: a SCRAM-SHA-512 user NAME whose password is read from stdin (tests
# make users of their own, e.g. one whose password is a sentinel that must never be
# logged). Setting it again replaces the password.
do_scram_user() {
  local name="$1" pw=""
  kafka_pid >/dev/null || die "not running: start it first ($0 start)"
  IFS= read -r pw || true
  [ -n "$pw" ] || die "scram-user: no password on stdin"
  if ! (umask 077; java -Xmx128m -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" org.apache.kafka.tools.ConfigCommand \
      --bootstrap-server "127.0.0.1:$KAFKA_PORT" --alter --entity-type users --entity-name "$name" \
      --add-config "SCRAM-SHA-512=[password=$pw]" >"$KAFKA_LOGS/scram-user.log" 2>&1); then
    tail_log "$KAFKA_LOGS/scram-user.log"
    die "could not set the SCRAM-SHA-512 credential of $name"
  fi
  say "SCRAM-SHA-512 user $name set"
}

render_config() {
  local pw tls="$KAFKA_TLS"; pw="$(password)"
  cat <<EOF
# Generated by deploy/local/kafka.sh on every start; edit the script, not this file.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,WRONGHOST://127.0.0.1:$KAFKA_WRONGHOST_PORT,MTLS://127.0.0.1:$KAFKA_MTLS_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,WRONGHOST://127.0.0.1:$KAFKA_WRONGHOST_PORT,MTLS://127.0.0.1:$KAFKA_MTLS_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,WRONGHOST:SASL_SSL,MTLS:SSL
log.dirs=$KAFKA_DATA

# SASL_SSL (19094): PEM key store (PKCS#8 key + chain) and the CA as trust store for client
# certificates. A listener-level ssl.client.auth is what applies to a SASL_SSL listener.
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$tls/server.keystore.pem
listener.name.sasl_ssl.ssl.truststore.type=PEM
listener.name.sasl_ssl.ssl.truststore.location=$tls/ca.crt
listener.name.sasl_ssl.ssl.client.auth=requested
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN,OAUTHBEARER
# SCRAM users live in the cluster metadata (set at format time or by ensure_scram_users)
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
# PLAIN users are JAAS options user_NAME="PASSWORD" (this file is therefore mode 0600)
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_USER="$pw";
# OAUTHBEARER: Kafka's unsecured validator (JWT with alg none, sub and exp; no signature);
# the broker's own unsecured login needs a subject of its own.
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="kafka-broker";
listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler

# WRONGHOST (19095): SASL_SSL, SCRAM-SHA-512, a certificate naming only $WRONG_HOST
listener.name.wronghost.ssl.keystore.type=PEM
listener.name.wronghost.ssl.keystore.location=$tls/wronghost.keystore.pem
listener.name.wronghost.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.wronghost.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;

# MTLS ($KAFKA_MTLS_PORT): TLS with a client certificate required, signed by the CA (no SASL:
# the certificate is the identity, as Strimzi's tls users and Aiven's client certificates)
listener.name.mtls.ssl.keystore.type=PEM
listener.name.mtls.ssl.keystore.location=$tls/server.keystore.pem
listener.name.mtls.ssl.truststore.type=PEM
listener.name.mtls.ssl.truststore.location=$tls/ca.crt
listener.name.mtls.ssl.client.auth=required

# single-node test broker
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
log.retention.hours=24
EOF
}

# write_config : the broker's config as this script would write it now, in $KAFKA_CONF.new
# (mode 0600: it holds the PLAIN password); install_config moves it into place.
write_config() {
  mkdir -p "$KAFKA_DATA" "$KAFKA_LOGS"
  ensure_password
  ensure_server_tls
  (umask 077; render_config >"$KAFKA_CONF.new")
}
install_config() { mv "$KAFKA_CONF.new" "$KAFKA_CONF"; }

format_storage() {
  if [ -f "$KAFKA_DATA/meta.properties" ]; then
    return 0   # keep existing data (restart must not lose topics)
  fi
  local cid
  if [ -s "$KAFKA_DIR/cluster-id" ]; then
    cid="$(cat "$KAFKA_DIR/cluster-id")"
  else
    cid="$(java -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)"
    [ -n "$cid" ] || die "could not generate a cluster id"
    echo "$cid" >"$KAFKA_DIR/cluster-id"
  fi
  say "formatting storage in $KAFKA_DATA (cluster id $cid, SCRAM users $KAFKA_USER)"
  # the SCRAM users go into the bootstrap metadata: there from the broker's first start
  local pw; pw="$(password)"
  if ! java -Dlog4j2.configurationFile="$KAFKA_LOG4J" -Dkafka.logs.dir="$KAFKA_LOGS" \
      -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format \
      -c "$KAFKA_CONF" -t "$cid" --ignore-formatted \
      --add-scram "SCRAM-SHA-512=[name=$KAFKA_USER,password=$pw]" \
      --add-scram "SCRAM-SHA-256=[name=$KAFKA_USER,password=$pw]" >"$KAFKA_LOGS/format.log" 2>&1; then
    tail_log "$KAFKA_LOGS/format.log"
    die "storage format failed"
  fi
  scram_stamp >"$KAFKA_SCRAM_STAMP"
}

# Kafka is ready when its ports accept connections and the log (written after our start)
# says the server started.
started_since() {
  local offset="$1"
  port_open "$KAFKA_PORT" && port_open "$KAFKA_SASL_PORT" && port_open "$KAFKA_WRONGHOST_PORT" || return 1
  [ -f "$KAFKA_LOG" ] || return 1
  # (no grep -q: grep leaving early would kill tail with SIGPIPE, a failure under pipefail)
  tail -c +"$((offset + 1))" "$KAFKA_LOG" 2>/dev/null |
    grep -e 'Kafka Server started' -e 'started (kafka.server.KafkaRaftServer)' >/dev/null
}

# Remote JMX for `auth-stats`: registry and connector on one fixed port, bound to loopback.
jmx_opts() {
  echo "-Dcom.sun.management.jmxremote -Dcom.sun.management.jmxremote.port=$KAFKA_JMX_PORT" \
    "-Dcom.sun.management.jmxremote.rmi.port=$KAFKA_JMX_PORT -Dcom.sun.management.jmxremote.host=127.0.0.1" \
    "-Djava.rmi.server.hostname=127.0.0.1 -Dcom.sun.management.jmxremote.local.only=true" \
    "-Dcom.sun.management.jmxremote.authenticate=false -Dcom.sun.management.jmxremote.ssl=false"
}

do_start() {
  local pid p
  if pid="$(kafka_pid)"; then
    # Running: keep it unless its configuration is not what this script writes now (an
    # older script's broker has no SASL_SSL listeners nor JMX) or its certificates were
    # just remade (expiring): then restart it, once.
    write_config
    if [ "$TLS_ISSUED" = 0 ] && cmp -s "$KAFKA_CONF.new" "$KAFKA_CONF" &&
        pid_matches "$pid" "-Dcom.sun.management.jmxremote.port=$KAFKA_JMX_PORT"; then
      rm -f "$KAFKA_CONF.new"
      ensure_scram_users
      say "already running (pid $pid, port $KAFKA_PORT)"
      return 0
    fi
    say "running (pid $pid) with an out-of-date configuration or certificate: restarting it"
    do_stop
  fi
  is_installed || do_install
  ensure_tools
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT" "$KAFKA_WRONGHOST_PORT" "$KAFKA_JMX_PORT"; do
    port_open "$p" && die "port $p is already in use by another process (find it with: ss -ltnp 'sport = :$p')"
  done
  write_config
  install_config
  format_storage
  say "starting broker on 127.0.0.1:$KAFKA_PORT"
  local offset=0 t0
  t0="$(now_s)"
  [ -f "$KAFKA_LOG" ] && offset="$(stat -c %s "$KAFKA_LOG")"
  printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$KAFKA_OUT"
  # shellcheck disable=SC2086,SC2046  # the options are split into words on purpose
  spawn_detached "$KAFKA_OUT" "$KAFKA_PID" \
    java $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true $(jmx_opts) \
    -Dkafka.logs.dir="$KAFKA_LOGS" -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_CONF"
  pid="$(read_pidfile "$KAFKA_PID")"
  local deadline=$(( t0 + START_TIMEOUT ))
  while ! started_since "$offset"; do
    if ! pid_alive "$pid"; then
      tail_log "$KAFKA_OUT" 20
      tail_log "$KAFKA_LOG"
      rm -f "$KAFKA_PID"
      die "broker exited during startup"
    fi
    if [ "$(now_s)" -ge "$deadline" ]; then
      tail_log "$KAFKA_OUT" 20
      tail_log "$KAFKA_LOG"
      die "broker not ready after ${START_TIMEOUT}s (pid $pid left running; '$0 stop' to kill it)"
    fi
    sleep 0.25
  done
  ensure_scram_users
  say "ready in $(( $(now_s) - t0 ))s (pid $pid, port $KAFKA_PORT, SASL_SSL $KAFKA_SASL_PORT, WRONGHOST $KAFKA_WRONGHOST_PORT)"
}

do_stop() {
  local pid stopped=0
  if pid="$(kafka_pid)"; then
    say "stopping (pid $pid, SIGTERM, up to ${STOP_TIMEOUT}s)"
    stop_pid "$pid" "$STOP_TIMEOUT" TERM
    stopped=1
  fi
  # anything else still running from this .local dir (e.g. pid file lost)
  local p
  # shellcheck disable=SC2046
  for p in $(find_pids $(match)); do
    say "killing leftover broker pid $p"
    stop_pid "$p" 10 TERM
    stopped=1
  done
  rm -f "$KAFKA_PID"
  if [ "$stopped" = 1 ]; then
    wait_port_free "$KAFKA_PORT" 15 || die "port $KAFKA_PORT still in use after stop"
    say "stopped"
  else
    say "not running"
  fi
}

do_status() {
  local pid
  if pid="$(kafka_pid)" && port_open "$KAFKA_PORT"; then
    if port_open "$KAFKA_SASL_PORT"; then
      echo "kafka:    running  127.0.0.1:$KAFKA_PORT (pid $pid; SASL_SSL $KAFKA_SASL_PORT, WRONGHOST $KAFKA_WRONGHOST_PORT, MTLS $KAFKA_MTLS_PORT, JMX $KAFKA_JMX_PORT)"
    else
      echo "kafka:    running  127.0.0.1:$KAFKA_PORT (pid $pid; no SASL_SSL listener: an older configuration, '$0 start' restarts it)"
    fi
  elif [ -n "${pid:-}" ]; then
    echo "kafka:    starting 127.0.0.1:$KAFKA_PORT (pid $pid, port not open yet)"
    return 1
  else
    echo "kafka:    stopped  127.0.0.1:$KAFKA_PORT"
    return 3
  fi
}

# The stack's own topics (Herald's are created by `herald topics ensure`), with Kafka's
# TopicCommand (kafka-topics.sh) from the installed jars.
do_topic() {
  local name="$1" partitions="${2:-1}"
  kafka_pid >/dev/null || die "not running: start it first ($0 start)"
  # The jars are replaced only by a start; a broker running from older ones (the pom changed
  # since) may lack the tools.
  is_installed || die "the installed jars predate $KAFKA_POM: restart Kafka first ($0 restart)"
  if ! java -Xmx128m -cp "$KAFKA_LIBS/*" \
      org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" \
      --create --if-not-exists --topic "$name" --partitions "$partitions" \
      --replication-factor 1 >"$KAFKA_LOGS/topic.log" 2>&1; then
    tail_log "$KAFKA_LOGS/topic.log"
    die "could not create topic $name"
  fi
  say "topic $name present ($partitions partition(s))"
}

# `auth-stats`: the broker's own counts (socket-server-metrics successful-authentication-total
# and failed-authentication-total, summed over each listener's network threads), read through
# JMX with Kafka's JmxTool (about half a second). Counted per connection since the broker
# started: a TLS handshake the client aborts (host name check), a refused client certificate
# and a refused SASL login count as failed (a client retrying counts each try); PLAINTEXT
# connections (no authentication step) are not counted. Output, one line per listener:
#   LISTENER successful=N failed=N
do_auth_stats() {
  kafka_pid >/dev/null || die "not running: start it first ($0 start)"
  local out
  if ! out="$(timeout 30 java -Xmx64m -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" org.apache.kafka.tools.JmxTool \
      --jmx-url "service:jmx:rmi:///jndi/rmi://127.0.0.1:$KAFKA_JMX_PORT/jmxrmi" \
      --object-name 'kafka.server:type=socket-server-metrics,listener=*,networkProcessor=*' \
      --attributes successful-authentication-total,failed-authentication-total \
      --one-time true --report-format properties 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "JmxTool could not read 127.0.0.1:$KAFKA_JMX_PORT (a broker started by an older kafka.sh has no JMX: '$0 restart')"
  fi
  # lines: kafka.server:type=socket-server-metrics,listener=L,networkProcessor=N:ATTR=VALUE
  printf '%s\n' "$out" | awk -F'[,:=]' '
    /type=socket-server-metrics,listener=/ {
      l = $5; v = $NF
      if (!(l in seen)) { seen[l] = 1; order[++n] = l }
      if ($(NF-1) == "successful-authentication-total") ok[l] += v
      if ($(NF-1) == "failed-authentication-total") bad[l] += v
    }
    END {
      if (n == 0) exit 1
      for (i = 1; i <= n; i++) printf "%s successful=%d failed=%d\n", order[i], ok[order[i]], bad[order[i]]
    }' || die "no socket-server-metrics in JmxTool's output: $out"
}

# `client-properties MECHANISM [PORT]`: a Java client's properties for user herald over
# SASL_SSL, trusting the local CA (PEM trust store); host names are verified (the default).
do_client_properties() {
  local mech="$1" port="${2:-$KAFKA_SASL_PORT}" pw
  case "$mech" in
    SCRAM-SHA-512 | SCRAM-SHA-256 | PLAIN | OAUTHBEARER) ;;
    *) die "client-properties: MECHANISM is SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or OAUTHBEARER (got '$mech')" ;;
  esac
  [ -s "$KAFKA_PASSWORD_FILE" ] || die "no $KAFKA_PASSWORD_FILE yet: start the broker first ($0 start)"
  pw="$(password)"
  cat <<EOF
bootstrap.servers=127.0.0.1:$port
security.protocol=SASL_SSL
ssl.truststore.type=PEM
ssl.truststore.location=$KAFKA_TLS/ca.crt
sasl.mechanism=$mech
EOF
  case "$mech" in
    SCRAM-SHA-512 | SCRAM-SHA-256)
      echo "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$KAFKA_USER\" password=\"$pw\";" ;;
    PLAIN)
      echo "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"$KAFKA_USER\" password=\"$pw\";" ;;
    OAUTHBEARER)
      # the client's default (unsecured) login makes a JWT with alg none, sub, iat and exp
      echo "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub=\"$KAFKA_USER\";" ;;
  esac
}

case "${1:-}" in
  topic)
    [ $# -ge 2 ] || die "usage: $0 topic NAME [PARTITIONS]"
    do_topic "$2" "${3:-1}" ;;
  client-cert)
    [ $# -eq 2 ] || die "usage: $0 client-cert NAME"
    with_lock "$COMPONENT" do_client_cert "$2" ;;
  auth-stats) do_auth_stats ;;
  scram-user)
    [ $# -eq 2 ] || die "usage: $0 scram-user NAME  (the password on stdin)"
    do_scram_user "$2" ;;
  client-properties)
    [ $# -ge 2 ] || die "usage: $0 client-properties SCRAM-SHA-512|SCRAM-SHA-256|PLAIN|OAUTHBEARER [PORT]"
    do_client_properties "$2" "${3:-}" ;;
  *) dispatch "$@" ;;
esac
