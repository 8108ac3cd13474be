#!/usr/bin/env bash
# Publishes and activates the sample templates listed in config/templates/manifest.tsv
# with `herald template publish`. Idempotent: an unchanged revision is "already published".
# Usage: publish-templates.sh HERALD_BIN CONFIG_FILE
set -euo pipefail
COMPONENT=templates
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bin="$1" config="$2"
dir="$HERALD_ROOT/config/templates"
while IFS=$'\t' read -r template channel locale revision subject body html; do
  case "$template" in ''|'#'*) continue ;; esac
  args=(--config "$config" template publish --template "$template" --channel "$channel"
        --locale "$locale" --revision "$revision" --body-file "$dir/$body" --activate)
  [ "$subject" != "-" ] && args+=(--subject "$subject")
  [ "$html" != "-" ] && args+=(--html-file "$dir/$html")
  "$bin" "${args[@]}"
done < "$dir/manifest.tsv"
