#!/usr/bin/env bash
# Installs what building Herald needs beyond cargo, idempotently: a C/C++ toolchain and
# cmake (librdkafka is built from source by rdkafka-sys), the libcurl headers librdkafka
# 2.12 includes unconditionally, pkg-config, and the rustfmt/clippy components.
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
