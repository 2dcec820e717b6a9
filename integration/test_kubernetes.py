"""deploy/kubernetes/: every overlay renders, validates, and holds together.

No cluster is used. Each overlay (redundant, sharded, redis, monitoring) is
rendered with `kubectl kustomize`, parsed (PyYAML), and checked:

1. Schemas, offline: every object against the pinned Kubernetes schemas and
   the prometheus-operator CRD schemas (PrometheusRule, PodMonitor), by
   deploy/kubernetes/validate/validate.mjs: the compiled validators of
   kubernetes-models / @kubernetes-models/prometheus-operator (required
   fields, types, enums, formats), then their type declarations with
   TypeScript's excess property check (a field the kind does not have is an
   error). Versions pinned by deploy/kubernetes/validate/package-lock.json,
   installed into build/tools/kubernetes/ by `scripts/install-deps.sh --test`.
   (`kubectl create --dry-run=client` cannot do it offline: it downloads the
   schema from a cluster's API server.)
2. The daemons' own `--check` on every TOML a ConfigMap embeds (binaries from
   $SMOCKRON_BIN_DIR, default build/bin), with no warning but the plaintext
   links' (the NetworkPolicies are their fence), and no file named (a pod
   mounts nothing but its TOML).
3. Consistency: Service selectors and target ports, probes and the admin
   ports of the TOML, the proxies' dns+tcp:// names against the headless
   Service, the StatefulSet and its ordinals, NetworkPolicies (who reaches
   which port), the HPA's target, PDBs, mounted ConfigMaps, the security
   context, the Redis URL, the PrometheusRule against
   deploy/prometheus/smockron-alerts.yml, the dashboard against
   deploy/grafana/smockron-dashboard.json, the PodMonitors' job names.
4. The rendered configs, run on 127.0.0.1: a master per name, the proxy
   asking a DNS server of this test with a pod's search path (LOCALDOMAIN,
   RES_OPTIONS), so its short names (smockron-master,
   smockron-master-N.smockron-master) are looked up as
   NAME.smockron.svc.cluster.local and every master is connected.
5. docs/kubernetes.md: the objects it shows validate, its kustomizations render.

validate.mjs runs on Node.js through its #! line (npm, which install-deps.sh
--test installs, brings Node.js), as test_packaging.py's Dockerfile linter.
kubectl is not installed by scripts/install-deps.sh (that is where it would
go): it comes with this machine's image (/usr/bin/kubectl, v1.32 with
kustomize v5.5). Debian 12's own package, kubernetes-client, is kubectl 1.20
with kustomize v2.0.3, too old for these kustomizations (components need
kustomize 3.7 or later). Without kubectl, or without the validator's
packages, the tests fail (never skip) and say so.

Run: cd integration && python3 -m unittest -v test_kubernetes
Regenerate the monitoring component's copies of the rules and the dashboard:
     python3 integration/test_kubernetes.py --write
"""
from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

import lib  # noqa: E402,F401  (Debian's python3-yaml, a docker-compose dependency, for any Python)
import yaml  # noqa: E402

from lib.daemons import Daemon, DaemonExited
from lib.dns_server import DnsServer
from lib.http1 import http_get
from lib.ports import bind_failed, free_ports, reserve_port
from lib.timing import WaitTimeout, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K8S = os.path.join(ROOT, "deploy", "kubernetes")
OVERLAYS = ("redundant", "sharded", "redis", "monitoring")
NAMESPACE = "smockron"
BIN = os.environ.get("SMOCKRON_BIN_DIR", os.path.join(ROOT, "build", "bin"))
VALIDATOR = os.path.join(K8S, "validate", "validate.mjs")
VALIDATOR_LOCK = os.path.join(K8S, "validate", "package-lock.json")
TOOLS = os.path.join(ROOT, "build", "tools", "kubernetes")
ALERTS = os.path.join(ROOT, "deploy", "prometheus", "smockron-alerts.yml")
PROMETHEUS = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "smockron-dashboard.json")
MONITORING = os.path.join(K8S, "components", "monitoring")
RULE_COPY = os.path.join(MONITORING, "prometheusrule.yaml")
DASHBOARD_COPY = os.path.join(MONITORING, "smockron-dashboard.json")

#: API versions served by every Kubernetes from 1.25 on (and the operator's v1).
API_VERSIONS = {"v1", "apps/v1", "autoscaling/v2", "policy/v1", "networking.k8s.io/v1", "monitoring.coreos.com/v1"}
#: Which daemon checks a ConfigMap key.
DAEMONS = {"master.toml": "smockron-master", "proxy.toml": "smockron-proxy"}
#: The one warning --check may give here: plaintext links off the host (the NetworkPolicies fence them).
PLAINTEXT = re.compile(r"warning: \[(master|proxy)\] (accounting|control) \S+ is not loopback or IPC and the links "
                       r"have no CURVE keys")
#: Keys whose value is a file: a pod mounts only its TOML, so none may be set.
FILE_KEYS = {"curve_secret_key", "curve_allowed_keys", "curve_master_key", "admin_token_file", "tls_cert", "tls_key",
             "tls_sni", "tls_ca", "tls_client_cert", "tls_client_key", "access_log_path", "public_key_file",
             "jwks_file", "hs256_secret"}
IMAGE = "smockron"
WORKLOADS = ("Deployment", "StatefulSet")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# --- the generated copies of the monitoring component -------------------------------------------------------------

RULE_HEADER = """\
# Generated from deploy/prometheus/smockron-alerts.yml by
# `python3 integration/test_kubernetes.py --write`: do not edit here. Edit the
# rules there and run it again; integration/test_kubernetes.py fails while
# this file differs from what it makes of them. The rules' job names
# (smockron-master, smockron-proxy) are those podmonitors.yaml sets.
"""


def prometheus_rule_text() -> str:
    """deploy/prometheus/smockron-alerts.yml as a PrometheusRule: its groups, verbatim, under spec."""
    lines = read(ALERTS).splitlines()
    start = 0
    while start < len(lines) and (lines[start].startswith("#") or not lines[start].strip()):
        start += 1  # the file's own header comment
    body = lines[start:]
    if not body or body[0] != "groups:":
        raise AssertionError(f"{ALERTS}: expected `groups:` after the header comment, got {body[:1]}")
    return RULE_HEADER + "\n".join([
        "apiVersion: monitoring.coreos.com/v1",
        "kind: PrometheusRule",
        "metadata:",
        "  name: smockron",
        "  labels:",
        "    app.kubernetes.io/name: smockron",
        "spec:",
        *[("  " + line) if line.strip() else "" for line in body],
    ]) + "\n"


def write_copies() -> None:
    with open(RULE_COPY, "w", encoding="utf-8") as f:
        f.write(prometheus_rule_text())
    shutil.copyfile(DASHBOARD, DASHBOARD_COPY)


# --- rendering ---------------------------------------------------------------------------------------------------

def kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        raise AssertionError("kubectl is missing: it renders the kustomizations (`kubectl kustomize`). This machine's "
                             "image ships it (/usr/bin/kubectl, v1.32, kustomize v5.5); scripts/install-deps.sh is "
                             "where it would be installed (Debian 12's kubernetes-client, kubectl 1.20 with kustomize "
                             "v2.0.3, is too old for these kustomizations)")
    return exe


@functools.cache
def render(overlay: str) -> tuple[dict, ...]:
    path = os.path.join(K8S, "overlays", overlay)
    r = subprocess.run([kubectl(), "kustomize", path], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed ({r.returncode}): {r.stderr}")
    objects = tuple(o for o in yaml.safe_load_all(r.stdout) if o is not None)
    if not objects:
        raise AssertionError(f"kubectl kustomize {path} rendered nothing")
    return objects


def of_kind(objects, kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects, kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} named {name}")
    return found[0]


def workloads(objects) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def containers(workload: dict) -> list[dict]:
    return workload["spec"]["template"]["spec"]["containers"]


def smockron_container(workload: dict) -> dict | None:
    """The container running a Smockron daemon (the image built from the Dockerfile), if any."""
    found = [c for c in containers(workload) if c["image"].split("/")[-1].split(":")[0] == IMAGE]
    return found[0] if found else None


def selects(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector ({matchLabels, matchExpressions}) against labels; {} selects everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def container_port(workload: dict, port) -> int | None:
    """A port (number or name) of the workload's containers, as a number; None if no container declares it."""
    for c in containers(workload):
        for p in c.get("ports", []):
            if p["containerPort"] == port or p.get("name") == port:
                return p["containerPort"]
    return None


def toml_of(objects, key: str, workload: dict | None = None) -> tuple[dict, str]:
    """The TOML file `key` (master.toml, proxy.toml) of the ConfigMap that `workload` mounts (any, if None)."""
    maps = [m for m in of_kind(objects, "ConfigMap") if key in (m.get("data") or {})]
    if workload is not None:
        mounted = {v["configMap"]["name"] for v in workload["spec"]["template"]["spec"].get("volumes", [])
                   if "configMap" in v}
        maps = [m for m in maps if m["metadata"]["name"] in mounted]
    if len(maps) != 1:
        raise AssertionError(f"{len(maps)} ConfigMaps hold {key}")
    text = maps[0]["data"][key]
    return tomllib.loads(text), text


def master_set(objects) -> dict:
    return named(objects, "StatefulSet", "smockron-master")


def proxy_deployment(objects) -> dict:
    return named(objects, "Deployment", "smockron-proxy")


def endpoint(value: str) -> tuple[str, str, int]:
    """'dns+tcp://name:port' -> ('dns+tcp', 'name', port); 'tcp://0.0.0.0:10004' -> ('tcp', '0.0.0.0', 10004)."""
    m = re.fullmatch(r"([a-z+]+)://([^:/]+):(\d+)", value)
    if not m:
        raise AssertionError(f"not scheme://host:port: {value!r}")
    return m.group(1), m.group(2), int(m.group(3))


def address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


# --- NetworkPolicy semantics (ingress, for pods of this namespace) -------------------------------------------------

NAMESPACE_LABELS = {"kubernetes.io/metadata.name": NAMESPACE}
MONITORING_LABELS = {"kubernetes.io/metadata.name": "monitoring"}


def admitted(objects, target: dict, port: int, source_labels: dict, source_namespace_labels: dict) -> bool:
    """Whether a pod with `source_labels`, in a namespace with `source_namespace_labels`, may open a TCP
    connection to `port` of the pods of workload `target`, under the rendered NetworkPolicies."""
    labels = pod_labels(target)
    policies = [p for p in of_kind(objects, "NetworkPolicy")
                if selects(p["spec"]["podSelector"], labels) and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not policies:
        return True  # no policy selects the pod: everything is admitted
    same_namespace = source_namespace_labels == NAMESPACE_LABELS
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(p.get("protocol", "TCP") == "TCP" and container_port(target, p["port"]) == port
                                 for p in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                if "ipBlock" in peer:
                    return True  # an address range: taken as admitting anyone in it
                ns_ok = (selects(peer["namespaceSelector"], source_namespace_labels) if "namespaceSelector" in peer
                         else same_namespace)
                pod_ok = selects(peer["podSelector"], source_labels) if "podSelector" in peer else True
                if ns_ok and pod_ok:
                    return True
    return False


# --- the validator ------------------------------------------------------------------------------------------------

def node_modules() -> str:
    modules = os.path.join(TOOLS, "node_modules")
    if not os.path.isdir(os.path.join(modules, "kubernetes-models")):
        raise AssertionError(f"{modules} has no kubernetes-models: `bash scripts/install-deps.sh --test` installs the "
                             f"pinned schemas (deploy/kubernetes/validate/package-lock.json) there")
    installed = os.path.join(TOOLS, "package-lock.json")
    if not os.path.exists(installed) or read(installed) != read(VALIDATOR_LOCK):
        raise AssertionError(f"{TOOLS} holds another lock than deploy/kubernetes/validate/package-lock.json: "
                             f"run `bash scripts/install-deps.sh --test` again")
    return modules


def validate(objects) -> dict:
    """validate.mjs's report on `objects`. It runs on Node.js through its #! line, as the Dockerfile linter of
    test_packaging.py does (npm, which scripts/install-deps.sh --test installs, brings Node.js)."""
    r = subprocess.run([VALIDATOR, node_modules()], input=json.dumps(list(objects)), capture_output=True,
                       text=True, timeout=120)
    if r.returncode not in (0, 1):
        raise AssertionError(f"validate.mjs could not run ({r.returncode}; exit 127: no Node.js on PATH): {r.stderr}")
    report = json.loads(r.stdout)
    if (r.returncode == 0) != (not report["errors"]):
        raise AssertionError(f"validate.mjs exited {r.returncode} with errors {report['errors']}")
    return report


def check_config(daemon: str, text: str) -> list[str]:
    """Runs `daemon --check` on `text`; returns what is wrong (exit code, warnings other than PLAINTEXT)."""
    exe = os.path.join(BIN, daemon)
    if not os.access(exe, os.X_OK):
        raise AssertionError(f"{exe} is not built (build first, or set SMOCKRON_BIN_DIR)")
    with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="smockron-k8s-", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([exe, "--check", "--config", f.name], capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(f.name)
    problems = []
    if r.returncode != 0:
        problems.append(f"exit {r.returncode}: {r.stdout}{r.stderr}")
    for line in r.stderr.splitlines():
        if line.strip() and not PLAINTEXT.search(line):
            problems.append(line)
    return problems


class RenderTest(unittest.TestCase):
    def test_every_overlay_renders_into_its_namespace(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = render(overlay)
                ns = named(objects, "Namespace", NAMESPACE)
                self.assertEqual(ns["metadata"]["labels"].get("pod-security.kubernetes.io/enforce"), "restricted")
                keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
                self.assertEqual(len(keys), len(set(keys)), "an object rendered twice")
                for o in objects:
                    if o["kind"] != "Namespace":
                        self.assertEqual(o["metadata"].get("namespace"), NAMESPACE, f"{o['kind']}/{o['metadata']['name']}")
                    self.assertIn(o["apiVersion"], API_VERSIONS, f"{o['kind']}/{o['metadata']['name']}")

    def test_the_base_names_no_namespace(self):
        r = subprocess.run([kubectl(), "kustomize", os.path.join(K8S, "base")], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        objects = [o for o in yaml.safe_load_all(r.stdout) if o]
        self.assertTrue(objects)
        self.assertEqual([o for o in objects if "namespace" in o["metadata"] or o["kind"] == "Namespace"], [])
        def strings(value):
            if isinstance(value, str):
                yield value
            elif isinstance(value, dict):
                for v in value.values():
                    yield from strings(v)
            elif isinstance(value, list):
                for v in value:
                    yield from strings(v)
        for cm in of_kind(objects, "ConfigMap"):
            for key, text in cm["data"].items():
                self.assertEqual([s for s in strings(tomllib.loads(text)) if ".svc" in s], [], f"{key} names a namespace")

    def test_every_object_validates_against_the_kubernetes_schemas(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = render(overlay)
                report = validate(objects)
                self.assertEqual(len(report["checked"]), len(objects))
                self.assertEqual(report["errors"], [], json.dumps(report["errors"], indent=1))

    def test_the_validator_rejects_what_a_cluster_would(self):
        """A wrong type, a missing required field, an unknown field (at any depth), an unknown kind, and a CRD
        object breaking its schema are each reported; the rendered objects above are not."""
        sts = json.loads(json.dumps(master_set(render("redundant"))))
        bad_type = json.loads(json.dumps(sts))
        bad_type["spec"]["replicas"] = "2"
        missing = json.loads(json.dumps(sts))
        del missing["spec"]["template"]["spec"]["containers"][0]["name"]
        unknown = json.loads(json.dumps(sts))
        unknown["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"port": "admin"}}
        rule = json.loads(json.dumps(named(render("monitoring"), "PrometheusRule", "smockron")))
        del rule["spec"]["groups"][0]["rules"][0]["expr"]
        monitor = json.loads(json.dumps(named(render("monitoring"), "PodMonitor", "smockron-master")))
        monitor["spec"]["podMetricsEndpoint"] = monitor["spec"].pop("podMetricsEndpoints")
        alien = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        for i, o in enumerate((bad_type, missing, unknown, rule, monitor)):
            o["metadata"]["name"] = f"bad-{i}"
        report = validate([bad_type, missing, unknown, rule, monitor, alien])
        by_object = {}
        for e in report["errors"]:
            by_object.setdefault(e["object"], []).append(e)
        self.assertIn("replicas", json.dumps(by_object.get("StatefulSet/bad-0")))
        self.assertIn("name", json.dumps(by_object.get("StatefulSet/bad-1")))
        self.assertIn("readinesProbe", json.dumps(by_object.get("StatefulSet/bad-2")))
        self.assertIn("expr", json.dumps(by_object.get("PrometheusRule/bad-3")))
        self.assertIn("podMetricsEndpoint", json.dumps(by_object.get("PodMonitor/bad-4")))
        self.assertIn("no schema", json.dumps(by_object.get("Widget/w")))


class ConfigTest(unittest.TestCase):
    def test_every_embedded_toml_passes_the_daemons_check(self):
        seen = set()
        for overlay in OVERLAYS:
            for cm in of_kind(render(overlay), "ConfigMap"):
                for key, text in (cm.get("data") or {}).items():
                    if not key.endswith(".toml"):
                        continue
                    with self.subTest(overlay=overlay, configmap=cm["metadata"]["name"], key=key):
                        self.assertIn(key, DAEMONS)
                        self.assertEqual(check_config(DAEMONS[key], text), [])
                        seen.add(key)
        self.assertEqual(seen, set(DAEMONS))

    def test_the_configs_name_no_file(self):
        def keys(table, prefix=""):
            for k, v in table.items():
                yield prefix + k
                if isinstance(v, dict):
                    yield from keys(v, prefix + k + ".")
                elif isinstance(v, list):
                    for item in v:
                        if isinstance(item, dict):
                            yield from keys(item, prefix + k + ".")
        for overlay in OVERLAYS:
            for key in DAEMONS:
                cfg, _ = toml_of(render(overlay), key)
                with self.subTest(overlay=overlay, key=key):
                    self.assertEqual([k for k in keys(cfg) if k.split(".")[-1] in FILE_KEYS], [])

    def test_every_route_domain_is_one_the_masters_keep(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay):
                master, _ = toml_of(render(overlay), "master.toml")
                proxy, _ = toml_of(render(overlay), "proxy.toml")
                domains = set(master["master"]["domains"])
                for route in proxy["proxy"]["routes"]:
                    if "domain" in route:
                        self.assertIn(route["domain"], domains, "a domain no master keeps fails open")
                for shard in proxy["proxy"].get("shards", []):
                    self.assertIn(shard["domain"], domains)

    def test_admin_endpoints_listen_in_the_pod_for_the_probes(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            for workload, key, table in ((master_set(objects), "master.toml", "master"),
                                         (proxy_deployment(objects), "proxy.toml", "proxy")):
                with self.subTest(overlay=overlay, config=key):
                    cfg, _ = toml_of(objects, key, workload)
                    host, port = address(cfg[table]["admin"])
                    self.assertEqual(host, "0.0.0.0", "the kubelet probes the pod's address, not its loopback")
                    self.assertEqual(container_port(workload, "admin"), port)
                    allow = [ipaddress.ip_network(n) for n in cfg[table].get("admin_allow", [])]
                    self.assertTrue(allow, "admin bound on every interface: admin_allow limits who connects")
                    for probe_source in ("10.1.2.3", "172.20.0.1", "192.168.1.1"):
                        self.assertTrue(any(ipaddress.ip_address(probe_source) in n for n in allow), probe_source)


class WorkloadTest(unittest.TestCase):
    def test_services_select_pods_that_have_their_target_ports(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            for svc in of_kind(objects, "Service"):
                with self.subTest(overlay=overlay, service=svc["metadata"]["name"]):
                    selector = svc["spec"]["selector"]
                    targets = [w for w in workloads(objects) if selects({"matchLabels": selector}, pod_labels(w))]
                    self.assertEqual(len(targets), 1, f"selector {selector}")
                    for p in svc["spec"]["ports"]:
                        self.assertIsNotNone(container_port(targets[0], p.get("targetPort", p["port"])), p)

    def test_probes_and_ports_match_the_configs(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            sts, deploy = master_set(objects), proxy_deployment(objects)
            master, _ = toml_of(objects, "master.toml", sts)
            proxy, _ = toml_of(objects, "proxy.toml", deploy)
            with self.subTest(overlay=overlay):
                self.assertEqual(container_port(sts, "accounting"), endpoint(master["master"]["accounting"])[2])
                self.assertEqual(container_port(sts, "control"), endpoint(master["master"]["control"])[2])
                self.assertEqual(endpoint(master["master"]["accounting"])[1], "0.0.0.0")
                self.assertEqual(endpoint(master["master"]["control"])[1], "0.0.0.0")
                self.assertEqual(address(proxy["proxy"]["listen"]), ("0.0.0.0", container_port(deploy, "http")))
            for w in workloads(objects):
                for c in containers(w):
                    with self.subTest(overlay=overlay, workload=w["metadata"]["name"], container=c["name"]):
                        for probe in ("livenessProbe", "readinessProbe"):
                            self.assertIn(probe, c)
                        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                            if "httpGet" in c.get(probe, {}):
                                self.assertIsNotNone(container_port(w, c[probe]["httpGet"]["port"]), probe)
                        if smockron_container(w) is c:
                            self.assertEqual(c["livenessProbe"]["httpGet"], {"path": "/livez", "port": "admin"})
                            self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "admin"})

    def test_each_daemon_runs_its_mounted_config(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            for w, daemon, key in ((master_set(objects), "smockron-master", "master.toml"),
                                   (proxy_deployment(objects), "smockron-proxy", "proxy.toml")):
                with self.subTest(overlay=overlay, daemon=daemon):
                    c = smockron_container(w)
                    self.assertIsNotNone(c)
                    self.assertEqual(c["image"], "smockron:0.1.0")
                    cmd = c["command"]
                    self.assertEqual(cmd[0], daemon)
                    path = cmd[cmd.index("--config") + 1]
                    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
                    volumes = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
                    mount = [n for n, p in mounts.items() if path == f"{p.rstrip('/')}/{key}"]
                    self.assertEqual(len(mount), 1, f"{path} is not {key} in a mounted volume")
                    cm_name = volumes[mount[0]]["configMap"]["name"]
                    cm = named(objects, "ConfigMap", cm_name)
                    self.assertIn(key, cm["data"])
                    # generated with a hash suffix: a changed TOML is a new name, and the pods roll
                    self.assertRegex(cm_name, rf"^{daemon}-[a-z0-9]{{10}}$")

    def test_the_image_tag_is_the_project_version(self):
        version = re.search(r"project\(smockron VERSION (\S+)", read(os.path.join(ROOT, "CMakeLists.txt"))).group(1)
        for overlay in OVERLAYS:
            for w in workloads(render(overlay)):
                c = smockron_container(w)
                if c is not None:
                    self.assertEqual(c["image"], f"{IMAGE}:{version}", w["metadata"]["name"])

    def test_pods_run_restricted(self):
        for overlay in OVERLAYS:
            for w in workloads(render(overlay)):
                spec = w["spec"]["template"]["spec"]
                pod = spec.get("securityContext", {})
                with self.subTest(overlay=overlay, workload=w["metadata"]["name"]):
                    self.assertIs(spec.get("automountServiceAccountToken"), False)
                    for c in spec["containers"] + spec.get("initContainers", []):
                        sc = c.get("securityContext", {})
                        self.assertIs(sc.get("runAsNonRoot", pod.get("runAsNonRoot")), True, c["name"])
                        self.assertNotEqual(sc.get("runAsUser", pod.get("runAsUser")), 0, c["name"])
                        seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {}))
                        self.assertEqual(seccomp.get("type"), "RuntimeDefault", c["name"])
                        self.assertIs(sc.get("readOnlyRootFilesystem"), True, c["name"])
                        self.assertIs(sc.get("allowPrivilegeEscalation"), False, c["name"])
                        self.assertEqual(sc.get("capabilities"), {"drop": ["ALL"]}, c["name"])
                        for kind in ("requests", "limits"):
                            self.assertEqual(set(c.get("resources", {}).get(kind, {})), {"cpu", "memory"},
                                             f"{c['name']}: resources.{kind}")

    def test_the_hpa_scales_the_proxy_deployment(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            hpas = of_kind(objects, "HorizontalPodAutoscaler")
            with self.subTest(overlay=overlay):
                self.assertEqual(len(hpas), 1)
                ref = hpas[0]["spec"]["scaleTargetRef"]
                self.assertEqual((ref["apiVersion"], ref["kind"]), ("apps/v1", "Deployment"))
                deploy = named(objects, "Deployment", ref["name"])
                self.assertIs(deploy, proxy_deployment(objects))
                self.assertNotIn("replicas", deploy["spec"], "the HPA owns the replicas; apply would reset them")
                self.assertIn("cpu", [m["resource"]["name"] for m in hpas[0]["spec"]["metrics"]])
                for c in containers(deploy):
                    self.assertIn("cpu", c["resources"]["requests"], "CPU utilization is measured against it")
                self.assertGreaterEqual(hpas[0]["spec"]["minReplicas"], 2)

    def test_every_pdb_guards_one_workload(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            guarded = set()
            for pdb in of_kind(objects, "PodDisruptionBudget"):
                with self.subTest(overlay=overlay, pdb=pdb["metadata"]["name"]):
                    matched = [w for w in workloads(objects) if selects(pdb["spec"]["selector"], pod_labels(w))]
                    self.assertEqual(len(matched), 1)
                    guarded.add(matched[0]["metadata"]["name"])
            self.assertEqual(guarded, {w["metadata"]["name"] for w in workloads(objects)}, overlay)

    def test_workload_selectors_match_their_own_pods_only(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            for w in workloads(objects):
                with self.subTest(overlay=overlay, workload=w["metadata"]["name"]):
                    matched = [o for o in workloads(objects) if selects(w["spec"]["selector"], pod_labels(o))]
                    self.assertEqual(matched, [w])


class DiscoveryTest(unittest.TestCase):
    """The proxies' dns+tcp:// names against the StatefulSet and its headless Service."""

    def headless(self, objects) -> dict:
        sts = master_set(objects)
        svc = named(objects, "Service", sts["spec"]["serviceName"])
        self.assertEqual(svc["spec"].get("clusterIP"), "None", "the StatefulSet's governing Service is headless")
        self.assertTrue(selects({"matchLabels": svc["spec"]["selector"]}, pod_labels(sts)))
        self.assertEqual(sorted(p["name"] for p in svc["spec"]["ports"]), ["accounting", "admin", "control"])
        return svc

    def names(self, objects, link: str) -> list[tuple[str, int]]:
        proxy, _ = toml_of(objects, "proxy.toml", proxy_deployment(objects))
        out = []
        for value in proxy["proxy"][link]:
            scheme, host, port = endpoint(value)
            self.assertEqual(scheme, "dns+tcp", value)
            out.append((host, port))
        return out

    def service_port(self, svc: dict, name: str) -> int:
        return [p["port"] for p in svc["spec"]["ports"] if p["name"] == name][0]

    @staticmethod
    def short(host: str) -> str:
        """NAME.NAMESPACE.svc.cluster.local -> NAME (the namespace must be ours); a short name as it is."""
        suffix = f".{NAMESPACE}.svc.cluster.local"
        return host[: -len(suffix)] if host.endswith(suffix) else host

    def test_redundant_proxies_name_every_master_by_the_headless_service(self):
        for overlay in ("redundant", "redis", "monitoring"):
            objects = render(overlay)
            svc = self.headless(objects)
            with self.subTest(overlay=overlay):
                for link in ("accounting", "control"):
                    names = self.names(objects, link)
                    self.assertEqual([(self.short(h), p) for h, p in names],
                                     [(svc["metadata"]["name"], self.service_port(svc, link))], link)
                proxy, _ = toml_of(objects, "proxy.toml")
                self.assertNotIn("shards", proxy["proxy"])
                self.assertGreaterEqual(master_set(objects)["spec"]["replicas"], 2, "redundant: two masters or more")

    def test_sharded_proxies_list_every_ordinal_by_its_pod_name(self):
        objects = render("sharded")
        sts, svc = master_set(objects), self.headless(objects)
        replicas = sts["spec"]["replicas"]
        self.assertGreaterEqual(replicas, 2)
        expected = {link: [(f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}", self.service_port(svc, link))
                           for i in range(replicas)] for link in ("accounting", "control")}
        for link in ("accounting", "control"):
            self.assertEqual([(self.short(h), p) for h, p in self.names(objects, link)], expected[link], link)
        proxy, _ = toml_of(objects, "proxy.toml")
        shards = proxy["proxy"]["shards"]
        self.assertEqual(len(shards), 1)
        self.assertEqual(shards[0]["masters"], proxy["proxy"]["accounting"], "one share per master, in ordinal order")


class NetworkPolicyTest(unittest.TestCase):
    OTHER = {"app": "something-else"}

    def test_only_proxies_reach_accounting_and_control(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            sts, deploy = master_set(objects), proxy_deployment(objects)
            for name in ("accounting", "control"):
                port = container_port(sts, name)
                with self.subTest(overlay=overlay, port=name):
                    self.assertTrue(admitted(objects, sts, port, pod_labels(deploy), NAMESPACE_LABELS))
                    self.assertFalse(admitted(objects, sts, port, self.OTHER, NAMESPACE_LABELS))
                    self.assertFalse(admitted(objects, sts, port, pod_labels(sts), NAMESPACE_LABELS))
                    self.assertFalse(admitted(objects, sts, port, pod_labels(deploy), MONITORING_LABELS))
                    self.assertFalse(admitted(objects, sts, port, pod_labels(deploy), {"kubernetes.io/metadata.name": "x"}))

    def test_admin_from_the_namespace_and_monitoring_only(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            for w in (master_set(objects), proxy_deployment(objects)):
                port = container_port(w, "admin")
                with self.subTest(overlay=overlay, workload=w["metadata"]["name"]):
                    self.assertTrue(admitted(objects, w, port, self.OTHER, NAMESPACE_LABELS))
                    self.assertTrue(admitted(objects, w, port, {"app.kubernetes.io/name": "prometheus"},
                                             MONITORING_LABELS))
                    self.assertFalse(admitted(objects, w, port, self.OTHER, {"kubernetes.io/metadata.name": "x"}))

    def test_the_proxy_port_is_open_to_clients(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            deploy = proxy_deployment(objects)
            with self.subTest(overlay=overlay):
                self.assertTrue(admitted(objects, deploy, container_port(deploy, "http"), self.OTHER,
                                         {"kubernetes.io/metadata.name": "ingress-nginx"}))

    def test_every_pod_is_selected_and_every_declared_port_reachable_by_someone(self):
        for overlay in OVERLAYS:
            objects = render(overlay)
            for w in workloads(objects):
                with self.subTest(overlay=overlay, workload=w["metadata"]["name"]):
                    self.assertTrue([p for p in of_kind(objects, "NetworkPolicy")
                                     if selects(p["spec"]["podSelector"], pod_labels(w))], "no NetworkPolicy")
                    for c in containers(w):
                        for p in c.get("ports", []):
                            sources = [(pod_labels(o), NAMESPACE_LABELS) for o in workloads(objects)]
                            sources += [(self.OTHER, NAMESPACE_LABELS), (self.OTHER, MONITORING_LABELS)]
                            self.assertTrue(any(admitted(objects, w, p["containerPort"], *s) for s in sources),
                                            f"port {p.get('name')} is reachable by nobody")

    def test_only_masters_reach_redis(self):
        objects = render("redis")
        redis = named(objects, "Deployment", "smockron-redis")
        port = container_port(redis, "redis")
        self.assertTrue(admitted(objects, redis, port, pod_labels(master_set(objects)), NAMESPACE_LABELS))
        self.assertFalse(admitted(objects, redis, port, pod_labels(proxy_deployment(objects)), NAMESPACE_LABELS))
        self.assertFalse(admitted(objects, redis, port, self.OTHER, NAMESPACE_LABELS))


class RedisOverlayTest(unittest.TestCase):
    def test_masters_keep_their_state_in_the_overlays_redis(self):
        objects = render("redis")
        master, _ = toml_of(objects, "master.toml", master_set(objects))
        self.assertEqual(master["master"]["store"], "redis")
        m = re.fullmatch(r"redis://([^:/@]+):(\d+)/(\d+)", master["master"]["redis"])
        self.assertIsNotNone(m, master["master"]["redis"])
        svc = named(objects, "Service", m.group(1))
        self.assertIn(int(m.group(2)), [p["port"] for p in svc["spec"]["ports"]])
        redis = named(objects, "Deployment", "smockron-redis")
        self.assertTrue(selects({"matchLabels": svc["spec"]["selector"]}, pod_labels(redis)))

    def test_other_overlays_keep_state_in_memory(self):
        for overlay in ("redundant", "sharded", "monitoring"):
            master, _ = toml_of(render(overlay), "master.toml")
            self.assertEqual(master["master"].get("store", "memory"), "memory", overlay)


class MonitoringTest(unittest.TestCase):
    def test_the_prometheus_rule_copy_is_generated_from_the_alerts(self):
        self.assertEqual(read(RULE_COPY), prometheus_rule_text(),
                         "deploy/kubernetes/components/monitoring/prometheusrule.yaml is stale: "
                         "python3 integration/test_kubernetes.py --write")

    def test_the_rendered_rule_has_exactly_the_alerts_groups(self):
        rules = of_kind(render("monitoring"), "PrometheusRule")
        self.assertEqual(len(rules), 1)
        self.assertEqual(rules[0]["spec"]["groups"], yaml.safe_load(read(ALERTS))["groups"])
        self.assertEqual(rules[0]["spec"], {"groups": yaml.safe_load(read(ALERTS))["groups"]})

    def test_the_dashboard_configmap_is_the_dashboard(self):
        self.assertEqual(read(DASHBOARD_COPY), read(DASHBOARD),
                         "deploy/kubernetes/components/monitoring/smockron-dashboard.json is stale: "
                         "python3 integration/test_kubernetes.py --write")
        maps = [m for m in of_kind(render("monitoring"), "ConfigMap")
                if (m["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
        self.assertEqual(len(maps), 1)
        self.assertEqual(list(maps[0]["data"]), ["smockron-dashboard.json"])
        self.assertEqual(maps[0]["data"]["smockron-dashboard.json"], read(DASHBOARD))
        self.assertEqual(json.loads(maps[0]["data"]["smockron-dashboard.json"]), json.loads(read(DASHBOARD)))

    def test_pod_monitors_scrape_both_daemons_as_the_jobs_the_rules_name(self):
        objects = render("monitoring")
        jobs = {c["job_name"] for c in yaml.safe_load(read(PROMETHEUS))["scrape_configs"]}
        self.assertEqual(jobs, {"smockron-master", "smockron-proxy"})
        named_in_rules = set(re.findall(r'job="([^"]+)"', read(ALERTS)))
        self.assertLessEqual(named_in_rules, jobs)
        scraped = {}
        for pm in of_kind(objects, "PodMonitor"):
            targets = [w for w in workloads(objects) if selects(pm["spec"]["selector"], pod_labels(w))]
            self.assertEqual(len(targets), 1, pm["metadata"]["name"])
            for ep in pm["spec"]["podMetricsEndpoints"]:
                self.assertIsNotNone(container_port(targets[0], ep["port"]))
                self.assertEqual(ep.get("path", "/metrics"), "/metrics")
                job = [r["replacement"] for r in ep.get("relabelings", []) if r.get("targetLabel") == "job"]
                self.assertEqual(len(job), 1, "the job label is set to the name the rules use")
                scraped[job[0]] = targets[0]["metadata"]["name"]
        self.assertEqual(scraped, {"smockron-master": "smockron-master", "smockron-proxy": "smockron-proxy"})

    def test_only_the_monitoring_overlay_needs_the_operator(self):
        for overlay in OVERLAYS:
            crds = [o["kind"] for o in render(overlay) if o["apiVersion"].startswith("monitoring.coreos.com/")]
            self.assertEqual(bool(crds), overlay == "monitoring", overlay)


class DocsTest(unittest.TestCase):
    """The YAML of docs/kubernetes.md: objects validate, kustomizations (in a folder beside deploy/) render."""

    PAGE = os.path.join(ROOT, "docs", "kubernetes.md")

    def blocks(self) -> list[list[dict]]:
        found = [[d for d in yaml.safe_load_all(b) if d is not None]
                 for b in re.findall(r"```yaml\n(.*?)```", read(self.PAGE), re.S)]
        self.assertGreaterEqual(len(found), 4)
        return found

    def test_the_objects_it_shows_validate(self):
        objects = [d for block in self.blocks() for d in block if d.get("apiVersion") in API_VERSIONS]
        self.assertTrue(objects)
        report = validate(objects)
        self.assertEqual(report["errors"], [], json.dumps(report["errors"], indent=1))

    def test_the_kustomizations_it_shows_render(self):
        kustomizations = [d for block in self.blocks() for d in block if d.get("kind") == "Kustomization"]
        self.assertGreaterEqual(len(kustomizations), 2)
        for k in kustomizations:
            with self.subTest(kustomization=k), tempfile.TemporaryDirectory() as top:
                os.symlink(os.path.join(ROOT, "deploy"), os.path.join(top, "deploy"))
                mine = os.path.join(top, "my-smockron")
                os.mkdir(mine)
                with open(os.path.join(mine, "kustomization.yaml"), "w") as f:
                    yaml.safe_dump(k, f)
                for gen in k.get("configMapGenerator", []):
                    for name in gen["files"]:
                        shutil.copyfile(os.path.join(K8S, "base", name), os.path.join(mine, name))
                r = subprocess.run([kubectl(), "kustomize", mine], capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                objects = [o for o in yaml.safe_load_all(r.stdout) if o]
                for image in k.get("images", []):
                    want = f"{image['newName']}:{image['newTag']}"
                    images = {smockron_container(w)["image"] for w in workloads(objects) if smockron_container(w)}
                    self.assertEqual(images, {want})

    def test_the_component_lines_it_shows_name_the_component(self):
        fragments = [d for block in self.blocks() for d in block if "components" in d and "kind" not in d]
        self.assertTrue(fragments)
        for f in fragments:
            for path in f["components"]:
                target = os.path.normpath(os.path.join(K8S, "overlays", "sharded", path))
                self.assertTrue(os.path.exists(os.path.join(target, "kustomization.yaml")), path)


class LoopbackRunTest(unittest.TestCase):
    """The rendered configs of the redundant and sharded overlays, run on 127.0.0.1: a master for each name the
    proxy's config gives its masters, and a proxy that asks this test's DNS server with a pod's resolver settings
    (search NAMESPACE.svc.cluster.local svc.cluster.local cluster.local, ndots:5), as the kubelet writes them into
    the pod's /etc/resolv.conf. Every name answers 127.0.0.1, so each master listens on ports of its own, written
    into the proxy's endpoints in place of the rendered ones (and bind 0.0.0.0 -> loopback, the upstream); the
    proxy's names are the rendered ones."""

    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="smockron-k8s-run-")
        self.addCleanup(shutil.rmtree, self.workdir, True)

    def replace_once(self, text: str, old: str, new: str) -> str:
        self.assertEqual(text.count(old), 1, f"{old!r} in\n{text}")
        return text.replace(old, new)

    def run_overlay(self, overlay: str) -> list[str]:
        """Runs the overlay's configs; a port taken between free_ports() and a bind is retried with fresh ones.
        Returns the fully qualified names the proxy asked for."""
        for attempt in range(3):
            try:
                return self.run_once(overlay)
            except DaemonExited as e:
                if attempt == 2 or not bind_failed(str(e)):
                    raise

    def run_once(self, overlay: str) -> list[str]:
        objects = render(overlay)
        sts, deploy = master_set(objects), proxy_deployment(objects)
        master_cfg, master_text = toml_of(objects, "master.toml", sts)
        proxy_cfg, proxy_text = toml_of(objects, "proxy.toml", deploy)
        endpoints = proxy_cfg["proxy"]["accounting"] + proxy_cfg["proxy"]["control"]
        hosts = sorted({endpoint(value)[1] for value in endpoints})  # one master per name
        roles = {endpoint(master_cfg["master"][key])[2]: key for key in ("accounting", "control")}
        proxy_port, proxy_admin, *ports = free_ports(2 + 3 * len(hosts))
        mine = {h: dict(zip(("accounting", "control", "admin"), ports[3 * i:3 * i + 3])) for i, h in enumerate(hosts)}
        dead = reserve_port()
        self.addCleanup(dead.close)
        with DnsServer() as dns:
            names = [f"{h}.{NAMESPACE}.svc.cluster.local" for h in hosts]
            for name in names:
                dns.set_a(name, ["127.0.0.1"], ttl=1)
            masters = []
            for i, h in enumerate(hosts):
                text = master_text
                for key in ("accounting", "control"):
                    text = self.replace_once(text, f'"{master_cfg["master"][key]}"',
                                             f'"tcp://127.0.0.1:{mine[h][key]}"')
                text = self.replace_once(text, f'"{master_cfg["master"]["admin"]}"', f'"127.0.0.1:{mine[h]["admin"]}"')
                path = os.path.join(self.workdir, f"master-{i}.toml")
                with open(path, "w") as f:
                    f.write(text)
                m = Daemon("smockron-master", path, self.workdir, admin_port=mine[h]["admin"])
                self.addCleanup(m.stop)
                masters.append(m.start())
            text = proxy_text
            for value in endpoints:
                scheme, host, port = endpoint(value)
                text = text.replace(f'"{value}"', f'"{scheme}://{host}:{mine[host][roles[port]]}"')
            text = self.replace_once(text, f'"{proxy_cfg["proxy"]["listen"]}"', f'"127.0.0.1:{proxy_port}"')
            text = self.replace_once(text, f'"{proxy_cfg["proxy"]["admin"]}"', f'"127.0.0.1:{proxy_admin}"')
            for server in proxy_cfg["proxy"]["upstreams"]["app"]["servers"]:
                text = self.replace_once(text, f'"{server}"', f'"127.0.0.1:{dead.getsockname()[1]}"')
            text = self.replace_once(text, "\n[proxy]\n", f'\n[proxy]\ndns_servers = ["{dns.address}"]\n')
            path = os.path.join(self.workdir, "proxy.toml")
            with open(path, "w") as f:
                f.write(text)
            search = f"{NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local"
            proxy = Daemon("smockron-proxy", path, self.workdir, admin_port=proxy_admin,
                           prefix=["env", f"LOCALDOMAIN={search}", "RES_OPTIONS=ndots:5"])
            self.addCleanup(proxy.stop)
            proxy.start()
            n = len(hosts)

            def connected():
                body = http_get(proxy_admin, "/readyz", timeout=1.0).body
                return f"masters connected: {n}/{n}" in body

            try:
                wait_until(connected, timeout=15)
            except WaitTimeout as e:
                raise AssertionError(f"the proxy did not connect every master: {e}\n{proxy.log()}") from None
            for name in names:
                self.assertGreaterEqual(dns.queries(name, "A"), 1, f"{name} was never asked:\n{proxy.log()}")
            for m in masters:
                self.assertTrue(m.alive(), m.log())
            return names

    def test_redundant_proxies_find_the_masters_by_the_service_name(self):
        sts = master_set(render("redundant"))
        names = self.run_overlay("redundant")
        self.assertEqual(names, [f"{sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"])

    def test_sharded_proxies_find_each_master_by_its_pod_name(self):
        sts = master_set(render("sharded"))
        base, svc = sts["metadata"]["name"], sts["spec"]["serviceName"]
        names = self.run_overlay("sharded")
        self.assertEqual(names, [f"{base}-{i}.{svc}.{NAMESPACE}.svc.cluster.local"
                                 for i in range(sts["spec"]["replicas"])])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_copies()
        print(f"wrote {os.path.relpath(RULE_COPY, ROOT)} and {os.path.relpath(DASHBOARD_COPY, ROOT)}")
    else:
        unittest.main()
