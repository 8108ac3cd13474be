#!/usr/bin/env bash
# Installs what building Herald needs beyond cargo, idempotently: a C/C++ toolchain and
# cmake (librdkafka is built from source by rdkafka-sys), the libcurl headers librdkafka
# 2.12 includes unconditionally, OpenSSL's headers (librdkafka's TLS and SASL SCRAM /
# OAUTHBEARER; linked from the system's libssl3, which security updates patch) and
# pkg-config. Nothing else: the checks' tools (rustfmt,
# clippy, promtool, cargo-deny, cargo-fuzz) are installed by deploy/local/tool.sh where a
# make target uses them, so `make demo` installs only what the demo runs.
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
[ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
if [ ${#missing[@]} -gt 0 ]; then
  require_root
  apt_install "${missing[@]}"
fi
