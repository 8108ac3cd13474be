#!/usr/bin/env python3
"""The chart's own checks on `helm template` output (multi-document YAML on stdin), for
what kubernetes-validate cannot know: the fields KEDA's, the Prometheus Operator's and
Herald's own documentation require, and the chart's promises (one source for the rules,
no DDL rights in the running pods, the hardening, the NetworkPolicy's trust boundaries).
`make chart` runs it for each values file; it prints what it checked and exits 1 with
every failure listed.

usage: helm template ... | check.py VALUES_NAME PATH_TO_ALERTS_YML HERALD_BIN OUT_DIR [VALUES_FILE]
(OUT_DIR receives core.yaml, the manifests of Kubernetes' own kinds, for kubernetes-validate.
The NetworkPolicy is checked against the values it was rendered from: the chart's values.yaml
under VALUES_FILE, by default the file the Makefile's CHART_VALUES names VALUES_NAME.)
"""
import ipaddress
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

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


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def merged(base, over):
    """`over` on `base` as Helm merges values (and as Herald layers its TOML on its defaults):
    tables merged key by key, anything else replaced; a null removes the key."""
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = v
    return out


def chart_values(name, values_file):
    """The values `make chart` rendered NAME with: the chart's values.yaml, then VALUES_FILE
    or the file CHART_VALUES (in the Makefile) names NAME."""
    if not values_file:
        with open(os.path.join(ROOT, "Makefile")) as f:
            m = re.search(r"(?m)^CHART_VALUES\s*:=\s*(.*)$", f.read())
        names = dict(nv.split(":", 1) for nv in m.group(1).split()) if m else {}
        if name not in names:
            sys.exit(f"chart ({name}): CHART_VALUES in the Makefile names no values file {name} (give it as VALUES_FILE)")
        values_file = os.path.join(ROOT, names[name])
    with open(os.path.join(ROOT, "deploy/helm/herald/values.yaml")) as f:
        values = yaml.safe_load(f)
    with open(values_file) as f:
        return merged(values, yaml.safe_load(f) or {})


def herald_config(toml):
    """What Herald runs with from a rendered herald.toml: its defaults
    (config/herald.example.toml, the first layer of every load) under the file."""
    with open(os.path.join(ROOT, "config/herald.example.toml"), "rb") as f:
        return merged(tomllib.load(f), tomllib.loads(toml))


def target_ports(targets, default):
    """The ports of the addresses Herald connects to (host[:port], comma-separated lists as
    kafka.brokers is, URLs such as postgres://u@a:5432,b:5432/db): each once, `default` where
    an address names none (443 in https:// URLs, 80 in http://); [default] for none at all."""
    ports = []
    for t in targets:
        t = (t or "").strip()
        if not t:
            continue
        d = 443 if t.startswith("https://") else 80 if t.startswith("http://") else default
        rest = re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://", "", t)
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0].rsplit("@", 1)[-1]
        for a in (a.strip() for a in authority.split(",")):
            last = a.rsplit(":", 1)[-1]
            p = int(last) if ":" in a and last.isdigit() else d
            if a and p not in ports:
                ports.append(p)
    return ports or [default]


def canon(x):
    return json.dumps(x, sort_keys=True)


def canon_ports(ports):
    """NetworkPolicyPorts in one form (protocol TCP when unset), order aside."""
    return tuple(sorted(canon({**p, "protocol": p.get("protocol", "TCP")}) for p in ports or []))


def canon_peers(peers):
    return tuple(sorted(canon(p) for p in peers or []))


def everyone(peer):
    """A peer that admits every source or destination: any address (an ipBlock /0), every
    pod of every namespace (namespaceSelector {} with no narrower podSelector), or none given."""
    if "ipBlock" in peer:
        return ipaddress.ip_network(peer["ipBlock"]["cidr"], strict=False).prefixlen == 0
    if "namespaceSelector" in peer:
        return not peer["namespaceSelector"] and not peer.get("podSelector")
    return "podSelector" not in peer


def check_network_policy(values, by_kind, deployments, collectors, services, toml):
    """The NetworkPolicy: rendered unless networkPolicy.enabled is false; selecting every
    pod of Herald's Deployments (and no collector's); ingress to each listener herald.toml
    opens off loopback from exactly the peers the values give it (none: no rule), on the
    listener's port; egress exactly the rules the values ask for, on the ports herald.toml's
    addresses name, DNS among them."""
    np_values = values.get("networkPolicy") or {}
    policies = [p for p in by_kind.get("NetworkPolicy", [])
                if p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "herald"]
    if not np_values.get("enabled"):
        check(not policies, "networkPolicy.enabled is false but a NetworkPolicy is rendered")
        return
    check(len(policies) == 1, f"networkPolicy.enabled: {len(policies)} NetworkPolicy of Herald rendered, not 1")
    if len(policies) != 1:
        return
    pol = policies[0]
    n = f"NetworkPolicy {pol['metadata']['name']}"
    spec = pol["spec"]
    check(set(spec.get("policyTypes", [])) == {"Ingress", "Egress"}, f"{n}: policyTypes are not Ingress and Egress")

    # Selects Herald's pods: its labels are among each Deployment's own selector's (so every
    # pod the Deployment makes), and no collector pod (whose traffic it does not describe).
    sel = spec.get("podSelector", {})
    labels = sel.get("matchLabels") or {}
    check(labels and not sel.get("matchExpressions"),
          f"{n}: podSelector {sel} is not matchLabels alone (an empty one selects every pod of the namespace)")
    for dn, d in deployments.items():
        own = d["spec"]["selector"].get("matchLabels", {})
        check(all(own.get(k) == v for k, v in labels.items()),
              f"{n}: podSelector {labels} does not select the pods of Deployment {dn} ({own})")
    for dn, d in collectors.items():
        pod = d["spec"]["template"]["metadata"].get("labels", {})
        check(not all(pod.get(k) == v for k, v in labels.items()), f"{n}: podSelector selects the collector {dn}")

    # The listeners, as Herald reads them from the rendered herald.toml over its defaults.
    cfg = herald_config(toml)
    listens = {}   # port -> (herald.toml key, networkPolicy.ingress key, loopback)
    for key, vkey in (("admin.listen", "admin"), ("admin.probe_listen", "probes"),
                      ("http_ingest.listen", "httpIngest")):
        section, field = key.split(".")
        addr = cfg.get(section, {}).get(field, "")
        if addr:
            host, _, port = addr.rpartition(":")
            try:
                listens[int(port)] = (key, vkey, ipaddress.ip_address(host.strip("[]")).is_loopback)
            except ValueError as e:
                check(False, f"herald.toml: {key} {addr!r} is no ip:port ({e})")
    named = {}
    for dn, d in deployments.items():
        for c in d["spec"]["template"]["spec"]["containers"]:
            for p in c.get("ports", []):
                named[p["name"]] = p["containerPort"]
                check(p["containerPort"] in listens,
                      f"{dn}: containerPort {p['name']} {p['containerPort']} is no listen address of herald.toml "
                      f"({ {k: v[0] for k, v in listens.items()} })")

    def port_of(p):
        return named.get(p["port"], p["port"]) if isinstance(p.get("port"), str) else p.get("port")

    ingress = spec.get("ingress") or []
    ingress_values = np_values.get("ingress") or {}
    for i, r in enumerate(ingress):
        where = f"{n}: ingress rule {i + 1}"
        check(r.get("ports"), f"{where} has no ports: it opens every port")
        check(r.get("from"), f"{where} has no peers: it admits every source")
        for p in r.get("ports") or []:
            port = port_of(p)
            listen = listens.get(port)
            check(listen and not listen[2],
                  f"{where}: port {port} is no listen address herald.toml opens off loopback "
                  f"({ {k: v[0] for k, v in listens.items() if not v[2]} })")
            allowed = canon_peers((ingress_values.get(listen[1]) or {}).get("from")) if listen else ()
            for peer in r.get("from") or []:
                check(not everyone(peer) or canon(peer) in allowed,
                      f"{where}: peer {peer} admits every source to port {port}, which the values do not ask for")
    for port, (key, vkey, loopback) in sorted(listens.items()):
        if loopback:
            continue
        want = (ingress_values.get(vkey) or {}).get("from") or []
        rules = [r for r in ingress if any(port_of(p) == port for p in r.get("ports") or [])]
        if not want:
            check(not rules, f"{n}: {key} port {port} is open to {[r.get('from') for r in rules]}, though "
                             f"networkPolicy.ingress.{vkey}.from is empty")
        else:
            check(len(rules) == 1 and canon_peers(rules[0].get("from")) == canon_peers(want),
                  f"{n}: {key} port {port} is open to {[r.get('from') for r in rules]}, not exactly to "
                  f"networkPolicy.ingress.{vkey}.from {want}")

    # Egress: exactly the rules the values ask for, each with peers and ports (a rule
    # without either allows every destination or every port).
    egress = spec.get("egress") or []
    eg_values = np_values.get("egress") or {}
    db = cfg.get("database", {})
    tel = cfg.get("telemetry", {})
    expected = []   # (what, peers, ports)

    def tcp(ports):
        return [{"port": p, "protocol": "TCP"} for p in ports]

    derived = {"kafka": tcp(target_ports([cfg.get("kafka", {}).get("brokers")], 9092)),
               "postgresql": tcp(target_ports([db.get("url"), db.get("owner_url"), db.get("session_url")], 5432))}
    # OTLP: an endpoint on a collector Service of the release goes to its pods, on the port
    # the Service forwards to; the others to networkPolicy.egress.otelCollector's peers.
    collector_services = {s["metadata"]["name"]: s for s in services
                          if s["metadata"]["labels"].get("app.kubernetes.io/name") == "herald-otel-collector"}
    external = []
    for e in (tel.get("traces_endpoint"), tel.get("metrics_endpoint")):
        if not e:
            continue
        m = re.match(r"^https?://([^/:@]+)(?::(\d+))?(/|$)", e)
        svc = collector_services.get(m.group(1)) if m else None
        if svc:
            sport = next((p for p in svc["spec"]["ports"] if p["port"] == int(m.group(2) or 80)), None)
            check(sport, f"{n}: {e} names a port the Service {m.group(1)} does not have")
            target = sport and sport["targetPort"]
            cport = next((p["containerPort"] for d in collectors.values() for c in d["spec"]["template"]["spec"]["containers"]
                          for p in c.get("ports", []) if p["name"] == target or p["containerPort"] == target), target)
            rule = ("the collector", [{"podSelector": {"matchLabels": svc["spec"]["selector"]}}], tcp([cport]))
            if rule not in expected:
                expected.append(rule)
        else:
            external.append(e)
    if external:
        derived["otelCollector"] = tcp(target_ports(external, 80))
    for what in ("kafka", "postgresql", "aws", "otelCollector", "dns"):
        v = eg_values.get(what) or {}
        if v.get("to") and (what != "otelCollector" or external):
            expected.append((what, v["to"], v.get("ports") or derived.get(what, [])))
    for i, r in enumerate(np_values.get("extraEgress") or []):
        expected.append((f"extraEgress {i + 1}", r.get("to"), r.get("ports")))
    rendered = [(canon_peers(r.get("to")), canon_ports(r.get("ports"))) for r in egress]
    for i, r in enumerate(egress):
        where = f"{n}: egress rule {i + 1}"
        check(r.get("ports"), f"{where} has no ports: it reaches every port")
        check(r.get("to"), f"{where} has no peers: it reaches every destination")
    unmatched = list(rendered)
    for what, peers, ports in expected:
        key = (canon_peers(peers), canon_ports(ports))
        check(key in unmatched, f"{n}: no egress rule for {what}: to {peers} on {ports}")
        if key in unmatched:
            unmatched.remove(key)
    for to, ports in unmatched:
        check(False, f"{n}: egress rule to {[json.loads(t) for t in to]} on {[json.loads(p) for p in ports]} "
                     f"is none the values and herald.toml ask for")
    for proto in ("UDP", "TCP"):
        check(any(r.get("to") and port_of(p) == 53 and p.get("protocol", "TCP") == proto
                  for r in egress for p in r.get("ports") or []),
              f"{n}: no egress to DNS on 53/{proto}: Herald resolves its brokers, database and AWS by name")


def main():
    name, alerts_path, herald_bin, out_dir = sys.argv[1:5]
    values = chart_values(name, sys.argv[5] if len(sys.argv) > 5 else None)
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
        check("password =" not in toml and "token =" not in toml
              and not re.search(r"(?m)^key = ", toml), f"{cm['metadata']['name']}: a secret in the config")
        check('key_file = "/var/run/secrets/herald/suppression/key"' in toml,
              f"{cm['metadata']['name']}: the suppression list's key is not read from its Secret")

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

    check_network_policy(values, by_kind, deployments, collectors, services,
                         role_config[0]["data"]["herald.toml"] if role_config else "")

    kinds = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_kind.items()))
    if failures:
        print(f"chart ({name}): {len(failures)} failure(s):\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"chart ({name}): {len(docs)} manifests ({kinds}) pass the chart's checks")


if __name__ == "__main__":
    main()
