#!/usr/bin/env bash
# Local moto server (AWS SES/SNS mock) on 127.0.0.1:14566, in a venv under .local/moto-venv.
# usage: deploy/local/moto.sh install|start|stop|status|restart
set -euo pipefail
COMPONENT=moto
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MOTO_PORT=14566
MOTO_SPEC='moto[server]==5.2.5'
MOTO_VENV="$HERALD_LOCAL_DIR/moto-venv"
MOTO_DIR="$HERALD_LOCAL_DIR/moto"
MOTO_LOG="$MOTO_DIR/moto.log"
MOTO_PID="$MOTO_DIR/moto.pid"
START_TIMEOUT=60
STOP_TIMEOUT=15
# Sender domains of config/local.toml ([email] sender notifications@herald.example, override
# orders@acme.example), registered as SES v2 identities so that sending from them is accepted.
MOTO_REGION=us-east-1
SES_IDENTITIES=(herald.example acme.example)

moto_pid() { live_pid "$MOTO_PID" "$MOTO_VENV/bin/moto_server" "-p $MOTO_PORT"; }

is_installed() {
  [ -x "$MOTO_VENV/bin/moto_server" ] && [ "$(cat "$MOTO_VENV/.installed" 2>/dev/null)" = "$MOTO_SPEC" ]
}

# A python3 that can make venvs: prefer Debian's, fall back to whatever is on PATH.
pick_python() {
  local py
  for py in /usr/bin/python3 "$(command -v python3 2>/dev/null || true)"; do
    [ -n "$py" ] && [ -x "$py" ] && "$py" -c 'import venv, ensurepip' 2>/dev/null && { echo "$py"; return 0; }
  done
  return 1
}

do_install() {
  if is_installed; then
    say "already installed ($MOTO_SPEC)"
    return 0
  fi
  local py
  if ! py="$(pick_python)"; then
    require_root
    say "installing python3-venv (Debian package)"
    apt_install python3 python3-venv
    py="$(pick_python)" || die "no python3 with venv/ensurepip available"
  fi
  say "installing $MOTO_SPEC into $MOTO_VENV (first run only)"
  local t0; t0="$(now_s)"
  mkdir -p "$MOTO_DIR"
  rm -rf "$MOTO_VENV"
  "$py" -m venv "$MOTO_VENV" >"$MOTO_DIR/install.log" 2>&1 || { tail_log "$MOTO_DIR/install.log"; die "venv creation failed"; }
  if ! "$MOTO_VENV/bin/python" -m pip install -q "$MOTO_SPEC" >>"$MOTO_DIR/install.log" 2>&1; then
    tail_log "$MOTO_DIR/install.log"
    die "pip install $MOTO_SPEC failed"
  fi
  echo "$MOTO_SPEC" >"$MOTO_VENV/.installed"
  say "installed in $(( $(now_s) - t0 ))s"
}

# Ready = GET /moto-api/data.json answers 200 (python from the venv: curl may be absent).
is_ready() {
  "$MOTO_VENV/bin/python" - "$MOTO_PORT" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen("http://127.0.0.1:%s/moto-api/data.json" % sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

# moto keeps its state in memory: register the identities on every start (idempotent: an
# identity already there is left alone). boto3 comes with moto.
register_identities() {
  if ! "$MOTO_VENV/bin/python" - "$MOTO_PORT" "$MOTO_REGION" "${SES_IDENTITIES[@]}" >>"$MOTO_LOG" 2>&1 <<'EOF'
import sys
import boto3
port, region, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
ses = boto3.client("sesv2", endpoint_url="http://127.0.0.1:%s" % port, region_name=region,
                   aws_access_key_id="testing", aws_secret_access_key="testing")
have = {i["IdentityName"] for i in ses.list_email_identities(PageSize=1000)["EmailIdentities"]}
for identity in wanted:
    if identity not in have:
        ses.create_email_identity(EmailIdentity=identity)
EOF
  then
    tail_log "$MOTO_LOG"
    die "could not register the SES identities ${SES_IDENTITIES[*]}"
  fi
  say "SES identities registered in $MOTO_REGION: ${SES_IDENTITIES[*]}"
}

do_start() {
  local pid
  if pid="$(moto_pid)"; then
    say "already running (pid $pid, port $MOTO_PORT)"
    register_identities
    return 0
  fi
  is_installed || do_install
  port_open "$MOTO_PORT" && die "port $MOTO_PORT is already in use by another process"
  say "starting on 127.0.0.1:$MOTO_PORT"
  local t0; t0="$(now_s)"
  mkdir -p "$MOTO_DIR"
  printf '\n==== %s start ====\n' "$(date -u +%FT%TZ)" >>"$MOTO_LOG"
  spawn_detached "$MOTO_LOG" "$MOTO_PID" \
    "$MOTO_VENV/bin/python" "$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT"
  pid="$(read_pidfile "$MOTO_PID")"
  local deadline=$(( t0 + START_TIMEOUT ))
  while ! is_ready; do
    if ! pid_alive "$pid"; then
      tail_log "$MOTO_LOG"
      rm -f "$MOTO_PID"
      die "moto_server exited during startup"
    fi
    if [ "$(now_s)" -ge "$deadline" ]; then
      tail_log "$MOTO_LOG"
      die "not ready after ${START_TIMEOUT}s (pid $pid left running; '$0 stop' to kill it)"
    fi
    sleep 0.25
  done
  say "ready in $(( $(now_s) - t0 ))s (pid $pid, port $MOTO_PORT)"
  register_identities
}

do_stop() {
  local pid stopped=0 p
  if pid="$(moto_pid)"; then
    say "stopping (pid $pid)"
    stop_pid "$pid" "$STOP_TIMEOUT" TERM
    stopped=1
  fi
  for p in $(find_pids "$MOTO_VENV/bin/moto_server"); do
    say "killing leftover moto_server pid $p"
    stop_pid "$p" 5 TERM
    stopped=1
  done
  rm -f "$MOTO_PID"
  if [ "$stopped" = 1 ]; then
    wait_port_free "$MOTO_PORT" 10 || die "port $MOTO_PORT still in use after stop"
    say "stopped"
  else
    say "not running"
  fi
}

do_status() {
  local pid
  if pid="$(moto_pid)" && is_ready; then
    echo "moto:     running  127.0.0.1:$MOTO_PORT (pid $pid)"
  elif [ -n "${pid:-}" ]; then
    echo "moto:     starting 127.0.0.1:$MOTO_PORT (pid $pid, not answering yet)"
    return 1
  else
    echo "moto:     stopped  127.0.0.1:$MOTO_PORT"
    return 3
  fi
}

dispatch "$@"
