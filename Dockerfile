# Herald's container image: a release build of the `herald` binary on a distroless base
# (glibc, libgcc, CA certificates, a `nonroot` user; no shell, no package manager).
#   docker build -t herald:0.1.0 .
#   docker run --rm herald:0.1.0 --version
# The entrypoint is `herald`; the command says what to run (`run --roles ingest`,
# `migrate`, ...). Configuration from a mounted file (`--config`) and HERALD_* variables.
# `make image` builds the same root filesystem without a registry (buildah, FROM scratch).

# Pinned to the toolchain the project is tested with (rustc 1.95.0), on Debian 12 as the
# runtime base is.
FROM rust:1.95.0-slim-bookworm AS build
# librdkafka is compiled from source by rdkafka-sys (cmake, a C/C++ compiler); zlib for
# its compression, OpenSSL's headers for its TLS and SASL (the runtime image's libssl3 is
# what it links; zstd is compiled in). Build tools only (nothing of them reaches the image), taken as Debian 12
# ships them at build time, so not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake g++ make zlib1g-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Without failpoints (a feature only the tests turn on); stripped.
RUN cargo build --release --locked -p herald --bin herald \
 && strip target/release/herald

FROM gcr.io/distroless/cc-debian12:nonroot
# zlib is the one library the binary links that the cc image lacks (libssl3 and
# libcrypto3 are in it).
COPY --from=build /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/lib/x86_64-linux-gnu/libz.so.1
COPY --from=build /src/target/release/herald /usr/local/bin/herald
COPY config/herald.example.toml /etc/herald/herald.example.toml
# Herald's allocator (mimalloc) keeps transparent huge pages off for the process, also on
# nodes whose THP setting is `always`: with them, ingest's peak RSS doubled.
ENV MIMALLOC_ALLOW_THP=0
# distroless's `nonroot` (65532), numeric so that runAsNonRoot can verify it.
USER 65532:65532
# Admin (loopback by default), probes and metrics (admin.probe_listen), HTTP ingest.
EXPOSE 9464 9465 9466
ENTRYPOINT ["/usr/local/bin/herald"]
CMD ["--config", "/etc/herald/herald.toml", "run", "--roles", "ingest,relay,deliver"]
