#!/usr/bin/env python3
"""The chart's own checks on `helm template` output (multi-document YAML on stdin), for
what kubernetes-validate cannot know: the fields KEDA's, the Prometheus Operator's and
Herald's own documentation require, and the chart's promises (one source for the rules,
no DDL rights in the running pods, the hardening). `make chart` runs it for each values
file; it prints what it checked and exits 1 with every failure listed.

usage: helm template ... | check.py VALUES_NAME PATH_TO_ALERTS_YML HERALD_BIN OUT_DIR
(OUT_DIR receives core.yaml, the manifests of Kubernetes' own kinds, for kubernetes-validate.)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


# Kinds of CRDs: no schema in kubernetes-validate's bundle; checked here instead.
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule"}


def herald_consumers(herald_bin, toml):
    """Each consuming role's group and topics as Herald derives them from `toml`."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(toml)
        f.flush()
        r = subprocess.run([herald_bin, "--config", f.name, "check-config", "--consumers"], capture_output=True,
                           text=True, env={"PATH": os.environ.get("PATH", "")})
    check(r.returncode == 0, f"herald check-config --consumers: {r.stderr.strip()}")
    return json.loads(r.stdout) if r.returncode == 0 else {}


def main():
    name, alerts_path, herald_bin, out_dir = sys.argv[1:5]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    with open(os.path.join(out_dir, "core.yaml"), "w") as f:
        yaml.safe_dump_all([d for d in docs if d["kind"] not in CRD_KINDS], f)
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    collector_name = "herald-otel-collector"
    all_deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    # Herald's own Deployments; the collector's (when enabled) is checked on its own below.
    deployments = {n: d for n, d in all_deployments.items()
                   if d["metadata"]["labels"].get("app.kubernetes.io/name") != collector_name}
    collectors = {n: d for n, d in all_deployments.items() if n not in deployments}
    services = by_kind.get("Service", [])
    check(deployments, "no Deployment rendered")

    # KEDA ScaledObject (keda.sh/v1alpha1): scaleTargetRef.name names a Deployment of the
    # release; the kafka trigger's required metadata; max within the topic's partitions.
    for so in by_kind.get("ScaledObject", []):
        n = so["metadata"]["name"]
        spec = so["spec"]
        check(so["apiVersion"] == "keda.sh/v1alpha1", f"{n}: apiVersion")
        check(spec.get("scaleTargetRef", {}).get("name") in deployments, f"{n}: scaleTargetRef names no Deployment")
        target = deployments.get(spec["scaleTargetRef"]["name"], {})
        check("replicas" not in target.get("spec", {}), f"{n}: its Deployment sets replicas too (KEDA owns them)")
        check(1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], f"{n}: min/max replicas")
        triggers = spec.get("triggers", [])
        check(len(triggers) == 1 and triggers[0]["type"] == "kafka", f"{n}: one kafka trigger")
        meta = triggers[0]["metadata"]
        for key in ("bootstrapServers", "consumerGroup", "topic", "lagThreshold"):
            check(isinstance(meta.get(key), str) and meta[key], f"{n}: trigger metadata {key} missing or not a string")
        check(meta.get("lagThreshold", "x").isdigit(), f"{n}: lagThreshold is not a whole number")

    # The triggers name the group and topic Herald itself derives from the role groups'
    # herald.toml (`herald check-config --consumers`: prefix, group ids, topic names).
    role_config = [cm for cm in by_kind.get("ConfigMap", []) if cm["metadata"]["name"].endswith("-config")
                   and "herald.toml" in cm.get("data", {}) and "migrate" not in cm["metadata"]["name"]]
    check(len(role_config) == 1, "one herald.toml ConfigMap for the role groups")
    consumers = herald_consumers(herald_bin, role_config[0]["data"]["herald.toml"]) if role_config else {}
    # Where Herald reaches Kafka over TLS or SASL, KEDA must too: a trigger without an
    # authenticationRef would read no lag (and scale nothing) from such a cluster.
    secure = bool(role_config) and re.search(r'(?m)^\s*security_protocol = "(ssl|sasl_ssl|sasl_plaintext)"',
                                              role_config[0]["data"]["herald.toml"])
    for so in by_kind.get("ScaledObject", []):
        n = so["metadata"]["name"]
        if secure:
            check(so["spec"]["triggers"][0].get("authenticationRef", {}).get("name"),
                  f"{n}: Herald reaches Kafka over TLS/SASL but the kafka trigger has no authenticationRef "
                  f"(keda.triggerAuthentication)")
    for so in by_kind.get("ScaledObject", []):
        n = so["metadata"]["name"]
        meta = so["spec"]["triggers"][0]["metadata"]
        target = deployments.get(so["spec"]["scaleTargetRef"]["name"], {})
        args = target.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("args", [])
        roles = args[args.index("--roles") + 1].split(",") if "--roles" in args else []
        check(any(r in consumers and consumers[r]["group"] == meta.get("consumerGroup")
                  and consumers[r]["topics"][0] == meta.get("topic") for r in roles),
              f"{n}: scales on {meta.get('consumerGroup')}/{meta.get('topic')}, which none of its roles "
              f"{roles} consumes ({consumers})")

    # ServiceMonitor: selects a Service of the release that has the endpoint's port.
    for sm in by_kind.get("ServiceMonitor", []):
        n = sm["metadata"]["name"]
        sel = sm["spec"]["selector"]["matchLabels"]
        matching = [s for s in services if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        check(matching, f"{n}: selects no Service")
        for ep in sm["spec"]["endpoints"]:
            check(any(p["name"] == ep["port"] for s in matching for p in s["spec"]["ports"]), f"{n}: port {ep['port']}")
            check(ep.get("path") == "/metrics", f"{n}: path")

    # PrometheusRule: exactly deploy/prometheus/alerts.yml.
    with open(alerts_path) as f:
        alerts = yaml.safe_load(f)
    rules = by_kind.get("PrometheusRule", [])
    check(len(rules) == 1, "one PrometheusRule")
    for r in rules:
        check(r["spec"] == alerts, "the PrometheusRule's groups differ from deploy/prometheus/alerts.yml")

    # The dashboard ConfigMap carries the dashboard JSON.
    for cm in by_kind.get("ConfigMap", []):
        if "herald-dashboard.json" in cm.get("data", {}):
            check(cm["data"]["herald-dashboard.json"].lstrip().startswith("{"), "dashboard ConfigMap is not JSON")

    # The running pods: probes, hardening, and no owner credentials.
    for n, d in all_deployments.items():
        pod = d["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        check(psc.get("runAsNonRoot") is True, f"{n}: runAsNonRoot")
        check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{n}: seccomp RuntimeDefault")
        check(pod.get("automountServiceAccountToken") is False, f"{n}: service account token mounted")
        for c in pod["containers"]:
            sc = c.get("securityContext", {})
            check(sc.get("readOnlyRootFilesystem") is True, f"{n}: readOnlyRootFilesystem")
            check(sc.get("allowPrivilegeEscalation") is False, f"{n}: allowPrivilegeEscalation")
            check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{n}: capabilities not all dropped")
            if n in deployments:
                check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", f"{n}: liveness on /healthz")
                check(c["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{n}: readiness on /readyz")
            else:
                check("livenessProbe" in c and "readinessProbe" in c, f"{n}: probes")
            check("memory" in c.get("resources", {}).get("limits", {}), f"{n}: no memory limit")
            for e in c.get("env", []):
                check("value" not in e or not any(w in e["name"].upper() for w in ("PASSWORD", "TOKEN", "SECRET")),
                      f"{n}: secret {e['name']} given as a value")
        secrets = [v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v]
        check("herald-database-owner" not in secrets, f"{n}: mounts the schema owner's password")
    configs = [cm for cm in by_kind.get("ConfigMap", []) if "herald.toml" in cm.get("data", {})]
    check(configs, "no herald.toml ConfigMap")
    for cm in configs:
        toml = cm["data"]["herald.toml"]
        # Herald itself loads and validates what the chart rendered.
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write(toml)
            f.flush()
            r = subprocess.run([herald_bin, "--config", f.name, "check-config"], capture_output=True, text=True,
                               env={"PATH": os.environ.get("PATH", "")})
            check(r.returncode == 0, f"{cm['metadata']['name']}: herald refuses it: {r.stderr.strip()}")
        check("migrate_on_start = false" in toml, f"{cm['metadata']['name']}: migrate_on_start is not false")
        check("interval_secs = 0" in toml, f"{cm['metadata']['name']}: the role groups would run retention")
        check("password =" not in toml and "token =" not in toml, f"{cm['metadata']['name']}: a secret in the config")

    # The migration Job: a pre-install/pre-upgrade hook with the owner's password.
    jobs = by_kind.get("Job", [])
    check(len(jobs) == 1, "one migration Job")
    for j in jobs:
        hooks = j["metadata"].get("annotations", {}).get("helm.sh/hook", "")
        check({"pre-install", "pre-upgrade"} <= set(hooks.split(",")), "the Job is not a pre-install/pre-upgrade hook")
        c = j["spec"]["template"]["spec"]["containers"][0]
        check(c["args"][-1] == "migrate", "the Job does not run herald migrate")

    # Retention runs as a CronJob with the owner's password (the pods have none).
    crons = by_kind.get("CronJob", [])
    check(len(crons) == 1, "one retention CronJob")
    for cj in crons:
        c = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
        check(c["args"][-2:] == ["retention", "run"], "the CronJob does not run herald retention run")

    # The tail-sampling collector: one replica (a trace's spans in one place), the
    # repository's configuration as it is, a backend, and Herald's spans sent to it.
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../otel-collector/config.yaml")) as f:
        collector_config = f.read()
    for cm in configs:
        if "-otel-collector:4318" in cm["data"]["herald.toml"]:
            check(collectors, f"{cm['metadata']['name']}: spans sent to a collector the release does not deploy")
    for n, d in collectors.items():
        check(d["spec"].get("replicas") == 1, f"{n}: tail sampling needs one replica")
        c = d["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(env.get("TRACES_BACKEND"), f"{n}: no TRACES_BACKEND")
        for e in env:
            check("${env:" + e + "}" in collector_config or "${env:" + e + ":-" in collector_config,
                  f"{n}: {e} is not a variable of deploy/otel-collector/config.yaml")
        # Its metrics must not be scraped under a job HeraldDown (up{job=~".*herald.*"}) matches.
        for sm in by_kind.get("ServiceMonitor", []):
            if sm["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") == collector_name:
                for ep in sm["spec"]["endpoints"]:
                    jobs = [r.get("replacement", "") for r in ep.get("relabelings", []) if r.get("targetLabel") == "job"]
                    check(jobs and "herald" not in jobs[-1], f"{sm['metadata']['name']}: its job would match HeraldDown")
        cms = [cm for cm in by_kind.get("ConfigMap", []) if cm["metadata"]["name"] == n]
        check(len(cms) == 1 and cms[0]["data"]["config.yaml"].strip() == collector_config.strip(),
              f"{n}: its config.yaml is not deploy/otel-collector/config.yaml")
        for cm in configs:
            check(f'traces_endpoint = "http://{n}:4318/v1/traces"' in cm["data"]["herald.toml"],
                  f"{cm['metadata']['name']}: Herald's spans do not go to {n}")

    kinds = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_kind.items()))
    if failures:
        print(f"chart ({name}): {len(failures)} failure(s):\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"chart ({name}): {len(docs)} manifests ({kinds}) pass the chart's checks")


if __name__ == "__main__":
    main()
