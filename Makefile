# Herald: `make demo` runs the main job on the local stack, `make test` runs every check.
# Both install what is missing (build tools, Kafka jars, PostgreSQL, moto, toxiproxy,
# Jaeger, Zipkin) and start the local stack when it is not running; each check's own tool (rustfmt,
# clippy, promtool, cargo-deny, cargo-fuzz, the trace UI test's browser) is installed by the target that runs it
# (deploy/local/tool.sh), so `make demo` installs only what the demo uses. See README.md.

SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO        ?= cargo
# The test and demo binary carries the named failpoints (inactive unless FAILPOINTS is set).
FEATURES     := --features herald/failpoints
HERALD       := target/debug/herald
LOCAL_CONFIG := config/local.toml
LOCAL        := deploy/local
TOOL         := $(LOCAL)/tool.sh
# Where the local stack and the tools live (deploy/local/lib.sh reads the same variable).
LOCAL_DIR    := $(or $(HERALD_LOCAL_DIR),.local)
# The local stack's components that `stack-up` starts; `make run` needs no toxiproxy (the
# tests' network faults; the demo uses it once, to make one e-mail `unknown`). Zipkin is the
# trace UI: Jaeger's collector feeds it through Kafka.
STACK_COMPONENTS        ?= postgres moto toxiproxy jaeger kafka zipkin
# KAFKA_NODES=3: stack-up also starts the three-node KRaft cluster of the fault tests
# (deploy/local/kafka-cluster.sh, 127.0.0.1:19192,19292,19392) beside the single broker,
# which stays the default (19092). stack-down stops it whenever it runs.
KAFKA_NODES             ?= 1
# PG_HA=1: stack-up also starts a PostgreSQL primary with a synchronous streaming standby
# (deploy/local/postgres-ha.sh, 127.0.0.1:15442 and 15443) and PgBouncer in transaction mode
# before the stack's PostgreSQL (deploy/local/pgbouncer.sh, 127.0.0.1:16432). The tests
# that use them start them themselves; stack-down stops them whenever they run.
PG_HA                   ?= 0

.PHONY: help deps build lint fmt-check clippy rules units deploy-lint collector chart image deny audit fuzz chaos chaos-short test-all test demo bench bench-build bench-quick bench-latency bench-pooler \
        stack-up stack-down stack-status migrate topics templates run ingest-rate ingest-memory delivery-rate telemetry-volume

help:
	@echo "make demo          bring the local stack up and run Herald on sample orders"
	@echo "make test          fmt check, clippy -D warnings, unit and integration tests"
	@echo "make stack-up | stack-down | stack-status   the local Kafka, PostgreSQL, moto, toxiproxy, Jaeger and Zipkin"
	@echo "                   (stack-up KAFKA_NODES=3 also starts the three-node Kafka cluster of the fault tests,"
	@echo "                    PG_HA=1 a PostgreSQL standby and PgBouncer in transaction mode)"
	@echo "make run           herald run (ingest, relay, deliver) on the local stack (foreground)"
	@echo "make rules         promtool check and unit-test deploy/prometheus/alerts.yml"
	@echo "make units         systemd-analyze verify deploy/systemd/herald@.service (part of make test)"
	@echo "make deploy-lint   hadolint on the Dockerfile, shellcheck on deploy/local (part of make test)"
	@echo "make chart         helm lint, helm template and validation of deploy/helm/herald (part of make test)"
	@echo "make collector     validate and start deploy/otel-collector/config.yaml (part of make test)"
	@echo "make image         build the container image with buildah (no registry) and run it against the stack"
	@echo "make deny          cargo deny: licenses, bans and sources (part of make test)"
	@echo "make audit         cargo deny: known vulnerabilities (needs the network)"
	@echo "make chaos         the reliability scenarios, long version (short one: part of make test)"
	@echo "make fuzz          each fuzz target for FUZZ_SECONDS (default 60)"
	@echo "make bench         the full benchmark (12 min to 1M events; the 5M growth step adds more): bench/results/, BENCHMARKS.md"
	@echo "make bench-quick   one size of each measurement"
	@echo "make bench-latency end-to-end latency by hop and whole-machine cost alone (about 4 min)"
	@echo "make bench-pooler  ingest and delivery through PgBouncer (transaction mode) against direct"
	@echo "make ingest-rate   measure the ingest rate (EVENTS=20000 BATCH=500)"
	@echo "make ingest-memory peak RSS of ingest on large dead-lettered events (MESSAGES=300 MESSAGE_BYTES=1040247)"
	@echo "make telemetry-volume  log and trace volume per million notifications, before and after sampling"
	@echo "make delivery-rate measure the delivery rate (ORDERS=1000 IN_FLIGHT=64 LATENCY_MS=50 PROVIDER=standin|moto)"

deps:
	@$(LOCAL)/build-deps.sh

build: deps
	@echo "build: cargo build (first build compiles librdkafka: a few minutes on 2 cores)"
	@$(CARGO) build --workspace --bins $(FEATURES)

fmt-check:
	@$(TOOL) rustfmt
	@echo "check: cargo fmt --check"
	@$(CARGO) fmt --all -- --check

clippy: deps
	@$(TOOL) clippy
	@echo "check: cargo clippy -D warnings"
	@$(CARGO) clippy --workspace --all-targets $(FEATURES) -- -D warnings

lint: fmt-check clippy

# The alerting rules parse, and their unit tests (deploy/prometheus/alerts.test.yml) pass.
rules:
	@$(TOOL) promtool
	@echo "check: promtool check rules, promtool test rules"
	@promtool check rules deploy/prometheus/alerts.yml
	@cd deploy/prometheus && promtool test rules alerts.test.yml

# One cargo invocation for unit and integration tests: one feature set, one build. The
# integration tests (and herald-channels' moto tests) need the local stack; the trace UI
# test needs a browser (chromium, playwright-core), the OpenAPI conformance test schemathesis.
test-all: build stack-up
	@$(TOOL) browser schemathesis
	@echo "test: unit tests, and integration tests against the local stack"
	@HERALD_BIN=$(CURDIR)/$(HERALD) $(CARGO) test --workspace --no-fail-fast $(FEATURES) -- --test-threads=4

# The dependency graph's licenses, bans and sources (deny.toml). cargo deny reads `cargo
# metadata`, which needs the crates of every target (wasm, Windows, Android), not only the
# ones a build for this host downloads: `cargo fetch` gets them all first, then the check
# runs offline.
deny:
	@$(TOOL) cargo-deny
	@echo "check: cargo fetch --locked (every target's crates), cargo deny check licenses bans sources"
	@$(CARGO) fetch --locked --quiet
	@$(CARGO) deny --offline check licenses bans sources

# Known vulnerabilities (RustSec): fetches the advisory database, so it needs the network
# and is not part of `make test`.
audit:
	@$(TOOL) cargo-deny
	@echo "audit: cargo deny check advisories (fetches the RustSec database)"
	@$(CARGO) deny check advisories

# The systemd units (deploy/systemd: herald@.service for a role-group instance, the
# retention service and timer) pass `systemd-analyze verify`, with ExecStart pointed at the
# binary just built (verify checks that it exists); any warning fails the check too.
units: build
	@$(TOOL) systemd-analyze
	@echo "check: systemd-analyze verify deploy/systemd (herald@, herald-retention service and timer)"
	@dir="$$(mktemp -d)"; trap 'rm -rf "$$dir"' EXIT; \
	  for u in deploy/systemd/*; do \
	    sed 's#^ExecStart=/usr/local/bin/herald #ExecStart=$(CURDIR)/$(HERALD) #' "$$u" >"$$dir/$${u##*/}"; \
	  done; \
	  out="$$(cd "$$dir" && systemd-analyze verify "$$dir/herald@ingest\x2crelay\x2cdeliver.service" \
	    "$$dir/herald-retention.service" "$$dir/herald-retention.timer" 2>&1)"; rc=$$?; \
	  if [ $$rc -ne 0 ] || [ -n "$$out" ]; then echo "$$out"; echo "systemd-analyze verify failed (rc $$rc)"; exit 1; fi

# The Dockerfile (hadolint) and the local stack's scripts (shellcheck, warnings and errors).
deploy-lint:
	@$(TOOL) hadolint shellcheck
	@echo "check: hadolint Dockerfile, shellcheck deploy/local/*.sh"
	@$(LOCAL_DIR)/hadolint-venv/bin/hadolint Dockerfile
	@shellcheck -x -S warning deploy/local/*.sh

# deploy/otel-collector/config.yaml (tail sampling for production volume) validated by the
# collector itself and started once on loopback ports (deploy/local/otel-collector.sh).
collector:
	@echo "check: the OpenTelemetry Collector configuration (validate, then start)"
	@$(LOCAL)/otel-collector.sh check

# The Dockerfile's image built without a registry (buildah FROM scratch), then run from its
# root filesystem against the local stack until /readyz answers (deploy/local/image.sh).
# A release build: several minutes the first time; not part of make test.
image: stack-up
	@$(LOCAL)/image.sh

# The Helm chart, offline, for its default values and a production-like file: helm lint,
# helm template, the chart's own checks (deploy/helm/check.py: KEDA, ServiceMonitor and
# PrometheusRule fields, the rules equal to alerts.yml, hardening, no owner credentials in
# the pods, the rendered herald.toml accepted by `herald check-config`), and every manifest
# of Kubernetes' own kinds validated against its schema (kubernetes-validate --strict).
CHART_VALUES := default:deploy/helm/herald/values.yaml production:deploy/helm/values-production.yaml
chart: build
	@$(TOOL) helm kubernetes-validate
	@echo "check: helm lint, helm template, deploy/helm/check.py, kubernetes-validate"
	@set -e; out="$$(mktemp -d)"; trap 'rm -rf "$$out"' EXIT; \
	for nv in $(CHART_VALUES); do \
	  n="$${nv%%:*}"; v="$${nv#*:}"; \
	  $(LOCAL_DIR)/bin/helm lint deploy/helm/herald -f "$$v" --quiet >"$$out/lint" 2>&1 \
	    || { grep -v 'symbolic link' "$$out/lint"; exit 1; }; \
	  $(LOCAL_DIR)/bin/helm template herald deploy/helm/herald -f "$$v" 2>"$$out/template.err" >"$$out/$$n.yaml" \
	    || { grep -v 'symbolic link' "$$out/template.err"; exit 1; }; \
	  $(LOCAL_DIR)/kubernetes-validate-venv/bin/python deploy/helm/check.py "$$n" deploy/prometheus/alerts.yml \
	    $(CURDIR)/$(HERALD) "$$out" <"$$out/$$n.yaml"; \
	  $(LOCAL_DIR)/kubernetes-validate-venv/bin/kubernetes-validate --strict --quiet -k 1.33.0 "$$out/core.yaml"; \
	done

test: fmt-check clippy rules units deploy-lint collector chart deny test-all chaos-short

# The reliability scenarios (tools/src/chaos): faults injected into the real
# stack and several herald processes, then the invariants checked. They stop and start the
# stack's broker and database, so they run alone, after the other tests. The short version
# is part of `make test`; CHAOS_ARGS passes e.g. `--seed N` or scenario names.
CHAOS_ARGS ?=
chaos-short: build stack-up
	@echo "test: chaos scenarios, short version"
	@HERALD_BIN=$(CURDIR)/$(HERALD) target/debug/herald-chaos $(CHAOS_ARGS)

chaos: build stack-up
	@HERALD_BIN=$(CURDIR)/$(HERALD) target/debug/herald-chaos --long $(CHAOS_ARGS)

# The fuzz targets in fuzz/ (decoders, fingerprint canonical form, rendering), each for
# FUZZ_SECONDS; crashes land in fuzz/artifacts/ and fail the run.
FUZZ_SECONDS ?= 60
fuzz: deps
	@$(LOCAL)/fuzz.sh $(FUZZ_SECONDS)

stack-up:
	@case "$(KAFKA_NODES)" in 1|3) ;; *) echo "KAFKA_NODES must be 1 (the single broker) or 3 (and the three-node cluster), not '$(KAFKA_NODES)'"; exit 2 ;; esac
	@case "$(PG_HA)" in 0|1) ;; *) echo "PG_HA must be 0 or 1 (and the standby and PgBouncer), not '$(PG_HA)'"; exit 2 ;; esac
	@$(LOCAL)/stack.sh up $(STACK_COMPONENTS) $(if $(filter 3,$(KAFKA_NODES)),kafka-cluster) $(if $(filter 1,$(PG_HA)),postgres-ha pgbouncer)

stack-down:
	@$(LOCAL)/stack.sh down

stack-status:
	@$(LOCAL)/stack.sh status

migrate: build stack-up
	@$(HERALD) --config $(LOCAL_CONFIG) migrate

topics: build stack-up
	@$(HERALD) --config $(LOCAL_CONFIG) topics ensure

templates: migrate
	@$(LOCAL)/publish-templates.sh $(HERALD) $(LOCAL_CONFIG)

run: STACK_COMPONENTS = postgres moto jaeger kafka zipkin
run: migrate topics templates
	@$(HERALD) --config $(LOCAL_CONFIG) run --roles ingest,relay,deliver

# A quick ingest-rate measurement on the local stack: EVENTS order events, BATCH per poll.
EVENTS ?= 20000
BATCH  ?= 500
ingest-rate: build stack-up
	@HERALD_BIN=$(CURDIR)/$(HERALD) target/debug/herald-ingest-rate $(EVENTS) $(BATCH)

# Peak RSS (VmHWM) of one ingest process consuming MESSAGES order events of MESSAGE_BYTES,
# each dead-lettered as a prefix; bounded (10 min at most) and self-stopping. The ingest
# bounds are Herald's defaults unless HERALD_INGEST__BATCH_MAX_BYTES,
# HERALD_INGEST__PREFETCH_MAX_KBYTES, ... are set.
MESSAGES      ?= 300
MESSAGE_BYTES ?= 1040247
ingest-memory: build stack-up
	@HERALD_BIN=$(CURDIR)/$(HERALD) target/debug/herald-ingest-memory $(MESSAGES) $(MESSAGE_BYTES)

# A quick delivery-rate measurement: ORDERS x 2 intents, IN_FLIGHT attempts at once,
# LATENCY_MS added to every provider answer by toxiproxy.
ORDERS     ?= 1000
IN_FLIGHT  ?= 64
LATENCY_MS ?= 50
PROVIDER   ?= standin
delivery-rate: build stack-up
	@HERALD_BIN=$(CURDIR)/$(HERALD) target/debug/herald-delivery-rate $(ORDERS) $(IN_FLIGHT) $(LATENCY_MS) $(PROVIDER)

# Log and trace volume per million notifications, before and after sampling: VOLUME_ORDERS orders
# of a production-like mix, LOG_RATIO = log.routine_sampling_ratio, ROUTINE_PERCENT = the
# collector's share of routine traces (deploy/otel-collector/config.yaml). About 10 min for
# 5000 orders; bench/results/telemetry-volume.json.
VOLUME_ORDERS   ?= 5000
LOG_RATIO       ?= 0.01
ROUTINE_PERCENT ?= 10
telemetry-volume: build stack-up
	@$(LOCAL)/jaeger.sh install >/dev/null
	@HERALD_BIN=$(CURDIR)/$(HERALD) target/debug/herald-telemetry-volume $(VOLUME_ORDERS) $(LOG_RATIO) $(ROUTINE_PERCENT)

# Benchmarks: release builds (no failpoints) of herald and the bench driver, on the local
# stack; results and charts under bench/results/. bench-quick runs one size of each.
bench-build: deps
	@echo "build: cargo build --release (herald, herald-bench)"
	@$(CARGO) build --release -p herald -p herald-tools --bin herald --bin herald-bench

bench: bench-build stack-up
	@HERALD_BIN=$(CURDIR)/target/release/herald target/release/herald-bench
	@$(LOCAL)/bench-plot.sh bench/results/latest.json bench/results

bench-quick: bench-build stack-up
	@HERALD_BIN=$(CURDIR)/target/release/herald target/release/herald-bench --quick --out bench/results/quick
	@$(LOCAL)/bench-plot.sh bench/results/quick/latest.json bench/results/quick

# Ingest and delivery through PgBouncer in transaction mode against the direct PostgreSQL,
# alternating, 3 runs each: bench/results/<date>-pooler.*
bench-pooler: bench-build stack-up
	@HERALD_BIN=$(CURDIR)/target/release/herald target/release/herald-bench --pooler-only

# Latency at half the last full run's capacity and at 1,000 events/s, 3 runs each, with
# the hops from spans and the CPU of Herald, PostgreSQL and Kafka: bench/results/<date>-latency.*
bench-latency: bench-build stack-up
	@HERALD_BIN=$(CURDIR)/target/release/herald target/release/herald-bench --latency-only

demo: STACK_COMPONENTS = postgres moto toxiproxy jaeger kafka zipkin
demo: migrate topics templates
	@$(LOCAL)/demo.sh $(HERALD) $(LOCAL_CONFIG)
