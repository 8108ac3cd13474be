#!/usr/bin/env bash
# Shared helpers for the local stack scripts (kafka.sh, postgres.sh, moto.sh, stack.sh).
# Source it; do not run it. Everything lives under $HERALD_LOCAL_DIR (default <repo>/.local).

# Repo root = two levels above this file, whatever the caller's cwd.
HERALD_LOCAL_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
HERALD_ROOT="$(cd "$HERALD_LOCAL_SCRIPTS/../.." && pwd -P)"
HERALD_LOCAL_DIR="${HERALD_LOCAL_DIR:-$HERALD_ROOT/.local}"
mkdir -p "$HERALD_LOCAL_DIR"
HERALD_LOCAL_DIR="$(cd "$HERALD_LOCAL_DIR" && pwd -P)"
# Work from the repo root: the caller's cwd may be unreadable or gone (pg tools then fail).
cd "$HERALD_ROOT" || exit 1

# Component name used as a prefix on every message; each script sets it.
COMPONENT="${COMPONENT:-stack}"

say() { printf '%s: %s\n' "$COMPONENT" "$*"; }
warn() { printf '%s: WARNING: %s\n' "$COMPONENT" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$COMPONENT" "$*" >&2; exit 1; }

# Run as root (apt-get, runuser, chown); the stack is meant for CI / dev boxes where we are root.
require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (uses apt-get / runuser)"
}

apt_install() {
  # apt_install PKG... : install Debian packages, running apt-get update once if the first try fails.
  say "apt-get install $*"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q --no-install-recommends "$@" >/dev/null || die "apt-get install $* failed"
  fi
}

now_s() { date +%s; }

# port_open PORT [HOST] : true if something accepts TCP connections there.
port_open() {
  local port="$1" host="${2:-127.0.0.1}"
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
}

# wait_with_timeout SECONDS DESCRIPTION CMD... : poll CMD every 0.25s until it succeeds.
wait_with_timeout() {
  local secs="$1" desc="$2"; shift 2
  local deadline=$(( $(now_s) + secs ))
  while ! "$@" >/dev/null 2>&1; do
    if [ "$(now_s)" -ge "$deadline" ]; then
      warn "timed out after ${secs}s waiting for $desc"
      return 1
    fi
    sleep 0.25
  done
}

wait_for_port() { wait_with_timeout "$2" "port $1" port_open "$1"; }

wait_port_free() {
  # wait_port_free PORT SECONDS
  wait_with_timeout "$2" "port $1 to be free" port_closed "$1"
}
port_closed() { ! port_open "$1"; }

# tail_log FILE [LINES] : show the end of a log on stderr (used on failures).
tail_log() {
  local f="$1" n="${2:-40}"
  if [ -f "$f" ]; then
    printf -- '----- last %s lines of %s -----\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2
    printf -- '----- end of %s -----\n' "$f" >&2
  else
    printf '(no log file at %s)\n' "$f" >&2
  fi
}

# ---- processes (no ps/pgrep needed: bare Debian images lack procps) ----

# pid_alive PID : process exists and is not a zombie (PID 1 in some sandboxes reaps lazily,
# and a child we spawned stays a zombie of ours until we exit).
pid_alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
  local stat; stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != "Z" ]
}

# proc_cmdline PID : the process command line, NULs turned into spaces.
proc_cmdline() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null; }

# pid_matches PID SUBSTRING... : alive and its command line contains every SUBSTRING.
pid_matches() {
  local pid="$1"; shift
  pid_alive "$pid" || return 1
  local cmd; cmd="$(proc_cmdline "$pid")" || return 1
  local s
  for s in "$@"; do
    case "$cmd" in *"$s"*) ;; *) return 1 ;; esac
  done
}

# find_pids SUBSTRING... : pids whose command line contains every SUBSTRING (our own helper
# scripts excluded). One grep over /proc for the first substring, then an exact check.
find_pids() {
  local f pid
  for f in $(grep -lsaF -- "$1" /proc/[0-9]*/cmdline 2>/dev/null); do
    pid="${f#/proc/}"; pid="${pid%/cmdline}"
    [ "$pid" = "$$" ] && continue
    pid_matches "$pid" "$@" || continue
    case "$(proc_cmdline "$pid")" in
      *"/deploy/local/"*.sh*) continue ;;   # our own scripts
      grep\ *) continue ;;                 # a concurrent find_pids
    esac
    echo "$pid"
  done
}

# read_pidfile FILE : print the pid stored there (empty if none).
read_pidfile() { if [ -f "$1" ]; then tr -dc '0-9' <"$1"; fi; }

# live_pid PIDFILE SUBSTRING... : print the pid if the pidfile names a live matching process;
# otherwise remove the stale pidfile and fall back to searching /proc for a matching process.
live_pid() {
  local pidfile="$1"; shift
  local pid; pid="$(read_pidfile "$pidfile")"
  if [ -n "$pid" ] && pid_matches "$pid" "$@"; then
    echo "$pid"; return 0
  fi
  [ -f "$pidfile" ] && rm -f "$pidfile"
  pid="$(find_pids "$@" | head -n1)"
  if [ -n "$pid" ]; then
    echo "$pid" >"$pidfile"
    echo "$pid"; return 0
  fi
  return 1
}

# spawn_detached LOGFILE PIDFILE CMD... : start CMD in its own session, detached from the caller:
# stdin from /dev/null, stdout+stderr appended to LOGFILE, every other inherited fd closed
# (so `make` / test harnesses capturing our output never wait on it), pid written to PIDFILE.
spawn_detached() {
  local log="$1" pidfile="$2"; shift 2
  mkdir -p "$(dirname "$log")" "$(dirname "$pidfile")"
  rm -f "$pidfile"
  # shellcheck disable=SC2016  # expanded by the inner bash
  setsid bash -c '
    pidfile="$1"; shift
    for fd in /proc/$$/fd/*; do
      fd="${fd##*/}"
      [ "$fd" -gt 2 ] 2>/dev/null && eval "exec ${fd}>&-"
    done
    echo "$$" >"$pidfile"
    exec "$@"
  ' herald-spawn "$pidfile" "$@" </dev/null >>"$log" 2>&1 &
  # wait for the child to record its pid (it execs right after)
  local _
  for _ in $(seq 1 40); do
    [ -s "$pidfile" ] && break
    sleep 0.05
  done
  [ -s "$pidfile" ] || die "failed to spawn: $*"
}

# run_detached_fg CMD... : run CMD in the foreground but in a new session and with fds > 2
# closed, so any daemon it forks (pg_ctl -> postgres) neither shares our process group nor
# holds a caller's pipe open.
run_detached_fg() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  setsid -w bash -c '
    for fd in /proc/$$/fd/*; do
      fd="${fd##*/}"
      [ "$fd" -gt 2 ] 2>/dev/null && eval "exec ${fd}>&-"
    done
    exec "$@"
  ' herald-run "$@" </dev/null
}

# stop_pid PID GRACE_SECONDS [SIGNAL] : send SIGNAL (default TERM), wait, then SIGKILL.
stop_pid() {
  local pid="$1" grace="$2" sig="${3:-TERM}"
  pid_alive "$pid" || return 0
  kill -s "$sig" "$pid" 2>/dev/null || true
  local deadline=$(( $(now_s) + grace ))
  while pid_alive "$pid"; do
    if [ "$(now_s)" -ge "$deadline" ]; then
      warn "pid $pid still alive after ${grace}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
      break
    fi
    sleep 0.1
  done
}

# with_lock NAME CMD... : serialize start/stop of one component across concurrent callers.
with_lock() {
  local name="$1"; shift
  local lock="$HERALD_LOCAL_DIR/.$name.lock"
  (
    exec 9>"$lock"
    flock -w 180 9 || die "could not take lock $lock"
    "$@"
  )
}

# go_toolchain WHAT MIN_VERSION PRIVATE_DIR : sets GO (the Go binary: PATH first, then the
# usual tarball location) and GO_EXTRA_FLAGS for building WHAT. Keeps the user's GOPATH/GOCACHE
# when HOME is writable; otherwise uses private ones under PRIVATE_DIR (checked before running go
# at all: any go command may create dirs under HOME, telemetry in XDG_CONFIG_HOME).
# shellcheck disable=SC2034  # GO and GO_EXTRA_FLAGS are read by the sourcing script
go_toolchain() {
  local what="$1" min="$2" dir="$3" g
  GO="" GO_EXTRA_FLAGS=""
  for g in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
    if [ -n "$g" ] && [ -x "$g" ]; then GO="$g"; break; fi
  done
  [ -n "$GO" ] || die "the Go toolchain ('go') is required to build $what and was not found on PATH or in /usr/local/go/bin; install Go >= $min and retry"
  if [ -z "${HOME:-}" ] || [ ! -d "$HOME" ] || [ ! -w "$HOME" ]; then
    export GOPATH="$dir/gopath" GOCACHE="$dir/gocache" XDG_CONFIG_HOME="$dir/config"
    GO_EXTRA_FLAGS=" -modcacherw"   # so a plain `rm -rf .local` works
    say "HOME not writable: GOPATH=$GOPATH GOCACHE=$GOCACHE"
  fi
}

# dispatch USAGE_NAME ACTION : common install|start|stop|status|restart front end.
dispatch() {
  local action="${1:-}"
  case "$action" in
    install) with_lock "$COMPONENT" do_install ;;
    start) with_lock "$COMPONENT" do_start ;;
    stop) with_lock "$COMPONENT" do_stop ;;
    restart) with_lock "$COMPONENT" do_stop && with_lock "$COMPONENT" do_start ;;
    status) do_status ;;
    *) echo "usage: $0 install|start|stop|status|restart" >&2; exit 2 ;;
  esac
}
