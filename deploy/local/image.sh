#!/usr/bin/env bash
# `make image`: the Dockerfile's runtime image, built without a registry (none is reachable
# here, so no base image can be pulled): buildah (Debian's, vfs storage, chroot isolation)
# makes it FROM scratch with what the Dockerfile's distroless base and COPY lines put in it:
# the stripped release binary, the libraries it links (ldd), CA certificates, a `nonroot`
# user (65532) and the example configuration. Then it checks the image: `herald --version`
# and `herald run` from its root filesystem, as that user, against the local stack, until
# /readyz answers 200; then SIGTERM and a clean exit.
# usage: deploy/local/image.sh   (the local stack must be up: make image starts it)
set -euo pipefail
COMPONENT=image
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGE=localhost/herald:local
ADMIN=127.0.0.1:19467
BUILDAH=(buildah --storage-driver vfs)
CARGO="${CARGO:-cargo}"

require_root
command -v buildah >/dev/null 2>&1 || apt_install buildah
command -v strip >/dev/null 2>&1 || apt_install binutils

say "cargo build --release -p herald (no failpoints)"
"$CARGO" build --release --locked -p herald --bin herald
bin="$HERALD_ROOT/target/release/herald"

ctr="$("${BUILDAH[@]}" from scratch)"
cleanup() {
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  for c in "$ctr" "${run_ctr:-}"; do
    if [ -n "$c" ]; then "${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true; fi
  done
}
trap cleanup EXIT
root="$("${BUILDAH[@]}" mount "$ctr")"
# buildah makes a scratch root 0700; the image's user must be able to enter it.
chmod 0755 "$root"
umask 022
install -d -m 0755 "$root/usr/local/bin" "$root/etc/herald" "$root/etc/ssl/certs"
install -d -m 1777 "$root/tmp"
install -m 0755 "$bin" "$root/usr/local/bin/herald"
strip "$root/usr/local/bin/herald"
# The dynamic loader and every library the binary links, at the paths it looks for them.
for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
install -m 0644 "$HERALD_ROOT/config/herald.example.toml" "$root/etc/herald/herald.example.toml"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
"${BUILDAH[@]}" umount "$ctr" >/dev/null
"${BUILDAH[@]}" config --user 65532:65532 --entrypoint '["/usr/local/bin/herald"]' \
  --env MIMALLOC_ALLOW_THP=0 \
  --cmd '--config /etc/herald/herald.toml run --roles ingest,relay,deliver' \
  --port 9464 --port 9465 --port 9466 --label org.opencontainers.image.title=herald "$ctr"
previous="$("${BUILDAH[@]}" images --quiet "$IMAGE" 2>/dev/null | head -n1 || true)"
"${BUILDAH[@]}" commit --quiet "$ctr" "$IMAGE" >/dev/null
# The previous build of this image, untagged now (and nothing else).
if [ -n "$previous" ] && [ "$previous" != "$("${BUILDAH[@]}" images --quiet "$IMAGE" | head -n1)" ]; then
  "${BUILDAH[@]}" rmi "$previous" >/dev/null 2>&1 || true
fi
size="$("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE" | head -n1)"
say "built $IMAGE ($size; binary $(du -h "$bin" | cut -f1) before strip)"

# The check: a container of the image, its root filesystem entered with chroot (what
# buildah's chroot isolation does), as the image's user, on the host's network.
run_ctr="$("${BUILDAH[@]}" from "$IMAGE")"
run_root="$("${BUILDAH[@]}" mount "$run_ctr")"
install -m 0644 "$HERALD_ROOT/config/local.toml" "$run_root/etc/herald/herald.toml"
version="$(chroot --userspec=65532:65532 "$run_root" /usr/local/bin/herald --version)"
say "from the image: $version"
log="$HERALD_LOCAL_DIR/image-run.log"
# An empty environment but for these: nothing of the host's reaches the process.
env -i HERALD_ADMIN__LISTEN="$ADMIN" HERALD_HTTP_INGEST__LISTEN= \
  "$(command -v chroot)" --userspec=65532:65532 "$run_root" /usr/local/bin/herald --config /etc/herald/herald.toml \
  run --roles ingest,relay,deliver >"$log" 2>&1 &
pid=$!
ready=""
for _ in $(seq 1 60); do
  kill -0 "$pid" 2>/dev/null || break
  if python3 - "$ADMIN" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen("http://%s/readyz" % sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
  then ready=yes; break; fi
  sleep 1
done
kill -TERM "$pid" 2>/dev/null || true
# Draining takes seconds; past 60 it is a failure (and the cleanup kills it).
for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
kill -0 "$pid" 2>/dev/null && { tail_log "$log"; die "herald from the image still running 60 s after SIGTERM"; }
rc=0; wait "$pid" || rc=$?
[ -n "$ready" ] || { tail_log "$log"; die "herald from the image never answered /readyz 200"; }
[ "$rc" -eq 0 ] || { tail_log "$log"; die "herald from the image exited $rc after SIGTERM"; }
say "herald run from the image, as uid 65532: /readyz 200, then SIGTERM and exit 0 (log: $log)"
