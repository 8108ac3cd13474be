#!/usr/bin/env bash
# Installs what building Herald needs beyond cargo, idempotently: a C/C++ toolchain and
# cmake (librdkafka is built from source by rdkafka-sys), the libcurl headers librdkafka
# 2.12 includes unconditionally, pkg-config, the rustfmt/clippy components, promtool
# (checks deploy/prometheus/alerts.yml and runs its unit tests), and cargo-deny (licenses,
# bans and sources of the dependency graph; compiled from source on first use).
set -euo pipefail
COMPONENT=build-deps
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v cargo >/dev/null 2>&1 || die "cargo is not installed: install Rust (rustup) first"

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ -f /usr/include/curl/curl.h ] || [ -n "$(ls /usr/include/*/curl/curl.h 2>/dev/null)" ] || missing+=(libcurl4-openssl-dev)
if [ ${#missing[@]} -gt 0 ]; then
  require_root
  apt_install "${missing[@]}"
fi

if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$c"; then
      say "rustup component add $c"
      rustup component add "$c" >/dev/null
    fi
  done
fi

# promtool: Debian ships it in the `prometheus` package, whose postinst starts the Prometheus
# server (invoke-rc.d, or deb-systemd-invoke under systemd) listening on *:9090. Installed with a
# temporary policy-rc.d that forbids every service action (exit 101; both invokers honour it); a
# policy-rc.d already there is put back afterwards. Under systemd the unit is also disabled, and a
# server that appeared during the install anyway is stopped.
POLICY_RC=/usr/sbin/policy-rc.d
POLICY_RC_BACKUP=""
restore_policy_rc() {
  if [ -n "$POLICY_RC_BACKUP" ]; then
    mv -f "$POLICY_RC_BACKUP" "$POLICY_RC"
    POLICY_RC_BACKUP=""
  else
    rm -f "$POLICY_RC"
  fi
}

install_promtool() {
  require_root
  local before p
  before=" $(find_pids /usr/bin/prometheus | tr '\n' ' ')"
  if [ -e "$POLICY_RC" ]; then
    POLICY_RC_BACKUP="$(mktemp "$POLICY_RC.herald.XXXXXX")"
    cp -p "$POLICY_RC" "$POLICY_RC_BACKUP"
  fi
  trap restore_policy_rc EXIT
  printf '#!/bin/sh\n# written by herald deploy/local/build-deps.sh for one apt-get install; removed after it\nexit 101\n' >"$POLICY_RC"
  chmod 755 "$POLICY_RC"
  apt_install prometheus
  restore_policy_rc
  trap - EXIT
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
  for p in $(find_pids /usr/bin/prometheus); do
    case "$before" in *" $p "*) continue ;; esac
    warn "stopping the Prometheus server the package install started (pid $p)"
    stop_pid "$p" 10 TERM
  done
  command -v promtool >/dev/null 2>&1 || die "promtool still missing after apt-get install prometheus"
  say "promtool: $(promtool --version 2>&1 | head -n1)"
}

command -v promtool >/dev/null 2>&1 || install_promtool

# cargo-deny, pinned (it has no default features to trim). The first build
# takes several minutes on 2 cores.
CARGO_DENY_VERSION=0.20.2
if [ "$(cargo deny --version 2>/dev/null | awk '{print $2}')" != "$CARGO_DENY_VERSION" ]; then
  say "cargo install cargo-deny $CARGO_DENY_VERSION (first run only; several minutes)"
  cargo install --locked --quiet cargo-deny --version "$CARGO_DENY_VERSION"
fi
