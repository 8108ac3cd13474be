#!/usr/bin/env bash
# Charts of a herald-bench result with matplotlib, from a private virtualenv under .local/.
# usage: deploy/local/bench-plot.sh RESULT.json OUT_DIR
set -euo pipefail
COMPONENT=bench-plot
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MATPLOTLIB_SPEC="matplotlib==3.9.4"
VENV="$HERALD_LOCAL_DIR/bench-venv"
MARKER="$VENV/.installed"

if [ "$(cat "$MARKER" 2>/dev/null)" != "$MATPLOTLIB_SPEC" ]; then
  command -v python3 >/dev/null 2>&1 || die "python3 is required for the charts"
  say "installing $MATPLOTLIB_SPEC into $VENV (first run only)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$MATPLOTLIB_SPEC" >"$HERALD_LOCAL_DIR/bench-venv-install.log" 2>&1 \
    || { tail_log "$HERALD_LOCAL_DIR/bench-venv-install.log"; die "pip install $MATPLOTLIB_SPEC failed"; }
  echo "$MATPLOTLIB_SPEC" >"$MARKER"
fi
"$VENV/bin/python" "$HERALD_ROOT/bench/plot.py" "$@"
