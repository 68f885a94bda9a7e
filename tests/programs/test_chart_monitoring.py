"""The chart's monitoring (values ``metrics.serviceMonitor``, ``metrics.prometheusRule``,
``metrics.dashboard``; docs/install.md, "Monitoring" and "Runbook: the alerts"):

* off by default: the rendering is the same object for object with each value off, and
  ``manifests/`` do not change (tests/apiserver/test_chart.py); each value on adds its own objects and nothing
  else, with its overrides (namespace, labels, annotations, interval, scrape timeout, TLS, thresholds);
* the ServiceMonitor selects the webhook's Service and its HTTPS port and trusts the install's CA; the
  PodMonitor selects the Pods the reconciler runs in, in both layouts, on its plain-HTTP port;
* every ``volcano_*`` series the alerts and the dashboard read is one the code exports (its metric
  classes, the reconciler's /metrics as served), with label names it has and label values its source
  writes; the others are the API server's, cAdvisor's, kube-state-metrics', cert-manager's and ``up``;
* ``helm lint --strict`` with all of it on, in every variant; every object validates against the
  Prometheus Operator's CRDs (tests/fixtures/prometheus-operator/, strict) and every rendering with it
  against the Kubernetes schemas (tests/apiserver/test_chart.py, ``EVERY_VALUE``);
* ``promtool check rules`` on the rendered rules (annotation templates included) and on the
  dashboard's queries; ``promtool test rules`` with tests/promtool/volcano-job-webhook.test.yaml:
  every alert fires on the series that should fire it and none on a healthy series — and with the
  thresholds raised, the alerts they govern no longer fire (the tests are not vacuous);
* each alert has a summary, a description and a runbook section of docs/install.md it links to.

Against a real kube-apiserver with the Prometheus Operator's CRDs (tests/apiserver/test_chart.py's
``cluster``): ``test_monitoring_objects_are_accepted_by_the_api_server`` and the helm install there.

helm is found as tests/helpers/helm.py says; promtool in ``$PROMTOOL`` (set empty to skip) or on ``PATH``
(Debian's ``prometheus`` package; .ci/run installs it). Without them these tests skip, saying so.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import prometheus_operator, render_manifests
from tests.helpers.helm import CHART, NAMESPACE, RELEASE, run, template, template_text
from tests.helpers.kustomize import ROOT
from tests.helpers.manifests_util import canonical, describe, find, find_one, object_id, selector_matches

PROMTOOL_ENV = "PROMTOOL"
RULE_TESTS = ROOT / "tests" / "promtool" / "volcano-job-webhook.test.yaml"
DASHBOARD = CHART / "dashboards" / "volcano-job-webhook.json"
INSTALL_MD = ROOT / "docs" / "install.md"

ALL_ON: dict[str, Any] = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                                      "dashboard": {"enabled": True}}}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
ALERTS = {"VolcanoJobWebhookDown", "VolcanoJobWebhookUnreachable", "VolcanoJobWebhookErrors", "VolcanoJobWebhookPodsRefused",
          "VolcanoJobWebhookSlow", "VolcanoJobWebhookCertificateExpiresSoon", "VolcanoJobWebhookReconcilerNotLeading",
          "VolcanoJobWebhookReconcileErrors", "VolcanoJobWebhookReconcilerStalled", "VolcanoJobWebhookCachesNotSynced",
          "VolcanoJobWebhookMemoryNearLimit"}
CERT_MANAGER_ALERTS = {"VolcanoJobWebhookCACertificateExpiresSoon"}
# Series of other programs the rules and the dashboard read (and Prometheus's own `up`).
FOREIGN = {
    "up",
    "apiserver_admission_webhook_rejection_count", "apiserver_admission_webhook_admission_duration_seconds_bucket",
    "container_memory_working_set_bytes", "kube_pod_container_resource_limits", "kube_pod_container_status_ready",
    "certmanager_certificate_expiration_timestamp_seconds",
}
# Labels the Prometheus Operator gives every target of a ServiceMonitor or PodMonitor.
TARGET_LABELS = {"namespace", "pod", "container"}


def monitoring_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in MONITORING_KINDS or o["metadata"]["name"].endswith("-dashboard")]


def with_all_on(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, **ALL_ON}


def rule(objects: list[dict[str, Any]], name: str = RELEASE) -> dict[str, Any]:
    return find_one(objects, "PrometheusRule", name)


def alerting_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for group in rule(objects)["spec"]["groups"] for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


# Off by default; each value adds its objects and nothing else -------------------------------------


@pytest.mark.parametrize("variant", list(render_manifests.VARIANTS))
def test_monitoring_is_off_by_default(variant: str) -> None:
    values = render_manifests.VARIANTS[variant]
    default = template(values)
    assert monitoring_objects(default) == []
    off = {"metrics": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False},
                       "dashboard": {"enabled": False}}}
    assert template_text({**values, **off}) == template_text(values)


@pytest.mark.parametrize(("value", "made"), [
    ("serviceMonitor", {("ServiceMonitor", RELEASE), ("PodMonitor", f"{RELEASE}-reconciler")}),
    ("prometheusRule", {("PrometheusRule", RELEASE)}),
    ("dashboard", {("ConfigMap", f"{RELEASE}-dashboard")}),
])
@pytest.mark.parametrize("layout", ["sidecar", "split"])
def test_each_value_adds_its_objects_and_nothing_else(value: str, made: set[tuple[str, str]], layout: str) -> None:
    before = {object_id(o): o for o in template({"layout": layout})}
    after = {object_id(o): o for o in template({"layout": layout, "metrics": {value: {"enabled": True}}})}
    added = set(after) - set(before)
    assert {(kind, name) for _, kind, _, name in added} == made
    assert all(namespace == NAMESPACE for _, _, namespace, _ in added)
    assert set(before) <= set(after)
    assert all(canonical(before[key]) == canonical(after[key]) for key in before), "an object changed"
    for key in added:
        assert after[key]["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


# What the monitors point at ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["sidecar", "split"])
def test_the_service_monitor_scrapes_the_webhook_over_tls_through_its_service(layout: str) -> None:
    objects = template({"layout": layout, **ALL_ON})
    monitor = find_one(objects, "ServiceMonitor", RELEASE)
    service = find_one(objects, "Service", RELEASE)
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    selected = [s["metadata"]["name"] for s in find(objects, "Service") if selector_matches(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert selected == [RELEASE]
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    # The Service's port leads to the webhook container's HTTPS port, where serve answers /metrics.
    webhook = next(c for c in find_one(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"] if c["name"] == "webhook")
    assert port["targetPort"] in [p["containerPort"] for p in webhook["ports"] if p["name"] == "https"]
    assert "--port=8443" in webhook["args"]
    assert (endpoint["scheme"], endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("https", "/metrics", "30s", "10s")
    # The served certificate is for the Service's names and signed by the CA in the Secret's ca.crt.
    assert endpoint["tlsConfig"] == {"serverName": f"{RELEASE}.{NAMESPACE}.svc",
                                     "ca": {"secret": {"name": f"{RELEASE}-tls", "key": "ca.crt"}}}
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]


@pytest.mark.parametrize("layout", ["sidecar", "split"])
def test_the_pod_monitor_scrapes_every_reconciler_and_nothing_else(layout: str) -> None:
    objects = template({"layout": layout, **ALL_ON})
    monitor = find_one(objects, "PodMonitor", f"{RELEASE}-reconciler")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("health", "http", "/metrics")
    scraped = set()
    for deployment in find(objects, "Deployment"):
        pod = deployment["spec"]["template"]
        if not selector_matches(monitor["spec"]["selector"], pod["metadata"]["labels"]):
            continue
        # The Prometheus Operator keeps the targets whose container port has the endpoint's name.
        for container in pod["spec"]["containers"]:
            for port in container.get("ports", []):
                if port["name"] == endpoint["port"]:
                    scraped.add((deployment["metadata"]["name"], container["name"]))
                    assert port["containerPort"] == 8081 and "--health-port=8081" in container["args"]
    reconciler_deployment = RELEASE if layout == "sidecar" else f"{RELEASE}-reconciler"
    assert scraped == {(reconciler_deployment, "reconciler")}


def test_the_reconciler_serves_its_metrics_where_the_pod_monitor_looks() -> None:
    """reconcile's health server (the one on --health-port) answers GET /metrics with its registry."""
    from volcano_job_webhook.reconciler.health import HealthServer
    from volcano_job_webhook.reconciler.metrics import ReconcilerMetrics

    metrics = ReconcilerMetrics()
    metrics.leader.set(1)
    server = HealthServer("127.0.0.1", 0, lambda: True, metrics.registry)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as answer:
            body = answer.read().decode()
    finally:
        server.stop()
    assert "\nvolcano_reconciler_leader 1.0\n" in body


# The series they read are the code's ---------------------------------------------------------------------


def exported() -> dict[str, set[str]]:
    """Every series name the two processes export, with the label names of each: built from their
    metric classes as ``serve`` and ``reconcile`` put them together."""
    from volcano_job_webhook.reconciler.metrics import ReconcilerMetrics
    from volcano_job_webhook.server.connections import ConnectionGuard, ConnectionLimits
    from volcano_job_webhook.server.metrics import WebhookMetrics

    webhook = WebhookMetrics(cached_jobs=lambda: 0)
    webhook.watch_certificate(lambda: 86400.0)
    webhook.registry.register(ConnectionGuard(ConnectionLimits()))
    reconciler = ReconcilerMetrics()
    labels: dict[str, set[str]] = {}
    wrappers = [m for owner in (webhook, reconciler) for m in vars(owner).values() if hasattr(m, "_labelnames")]
    by_name = {m._name: set(m._labelnames) for m in wrappers}
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    for registry in (webhook.registry, reconciler.registry):
        for family in registry.collect():
            names = by_name.get(family.name, set()) | {k for s in family.samples for k in s.labels}
            for suffix in suffixes[family.type]:
                labels[family.name + suffix] = names | ({"le"} if suffix == "_bucket" else set())
    return labels


SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
# Words of PromQL (functions, aggregations, keywords) that are not series.
PROMQL_WORDS = {"sum", "max", "min", "by", "on", "and", "or", "unless", "rate", "increase", "absent", "vector", "time",
                "histogram_quantile", "without", "ignoring", "group_left", "group_right"}


def series_read(expression: str) -> dict[str, list[tuple[str, str, str]]]:
    """The series an expression reads, with the matchers of each selector."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for name, body in SELECTOR.findall(expression):
        found.setdefault(name, []).extend(MATCHER.findall(body))
    rest = re.sub(r'"[^"]*"|\[[^]]*\]|\{[^}]*\}|\b(?:by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)', " ", expression)
    bare = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b", rest))
    for word in bare - PROMQL_WORDS:
        if not re.fullmatch(r"[0-9e]+", word):
            found.setdefault(word, [])
    return found


def source_literals() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "webhook").rglob("*.py")))


@pytest.mark.parametrize("where", ["rules", "dashboard"])
def test_the_alerts_and_the_dashboard_read_what_the_code_exports(where: str) -> None:
    if where == "rules":
        expressions = [r["expr"] for r in alerting_rules(template({**ALL_ON, "certificates": {"mode": "cert-manager"}}))]
    else:
        expressions = dashboard_queries()
    ours = exported()
    code = source_literals()
    read: dict[str, list[tuple[str, str, str]]] = {}
    for expression in expressions:
        for name, matchers in series_read(expression).items():
            read.setdefault(name, []).extend(matchers)
    assert {n for n in read if n.startswith("volcano_")} <= set(ours), "a series no process exports"
    assert set(read) - set(ours) <= FOREIGN, "a series of no known exporter"
    for name, matchers in read.items():
        if name not in ours:
            continue
        for label, _, value in matchers:
            assert label in ours[name] | TARGET_LABELS, f"{name} has no label {label}"
            if label in TARGET_LABELS:
                continue
            for alternative in value.split("|"):
                assert f'"{alternative}"' in code, f"{name}{{{label}=...}}: no {alternative!r} in webhook/"
    # The ones every operator asks about are read.
    assert {"volcano_webhook_admission_requests_total", "volcano_webhook_certificate_expiry_seconds",
            "volcano_reconciler_reconciles_total"} <= set(read)


def test_the_series_reader_finds_series_and_matchers() -> None:
    found = series_read('sum by (name, le) (rate(a_b_bucket{name=~"x|y", type="admit"}[5m])) / c or vector(0) > 1e3')
    assert found == {"a_b_bucket": [("name", "=~", "x|y"), ("type", "=", "admit")], "c": []}


# The alerts -------------------------------------------------------------------------------------------


def test_the_alerts_each_mode_has() -> None:
    names = {r["alert"] for r in alerting_rules(template(ALL_ON))}
    assert names == ALERTS
    names = {r["alert"] for r in alerting_rules(template({**ALL_ON, "certificates": {"mode": "cert-manager"}}))}
    assert names == ALERTS | CERT_MANAGER_ALERTS


def runbook_sections() -> set[str]:
    return set(re.findall(r"^#### (VolcanoJobWebhook\w+)$", INSTALL_MD.read_text(), re.MULTILINE))


def test_every_alert_says_what_happens_and_links_its_runbook() -> None:
    rules = alerting_rules(template({**ALL_ON, "certificates": {"mode": "cert-manager"}}))
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical") and r["labels"]["namespace"] == NAMESPACE, r["alert"]
        assert set(r["annotations"]) == {"summary", "description"}, r["alert"]
        assert f"Runbook: docs/install.md#{r['alert'].lower()}" in r["annotations"]["description"], r["alert"]
        assert r["for"], r["alert"]
    assert runbook_sections() == {r["alert"] for r in rules}


def test_thresholds_and_names_follow_the_values() -> None:
    thresholds = {"errorRatio": 0.2, "refusedPods": 5, "admissionLatencySeconds": 2.5, "certificateExpiryDays": 30,
                  "certificateExpiryCriticalDays": 10, "memoryLimitRatio": 0.8}
    objects = template({**ALL_ON, "certificates": {"mode": "cert-manager"}, "metrics": {**ALL_ON["metrics"], "prometheusRule": {
        "enabled": True, "thresholds": thresholds}}}, release="team", namespace="ml-system")
    rules = [r for group in rule(objects, "team-volcano-job-webhook")["spec"]["groups"] for r in group["rules"]]
    expressions = {(r["alert"], r["labels"]["severity"]): " ".join(r["expr"].split()) for r in rules}
    assert expressions[("VolcanoJobWebhookErrors", "critical")].endswith("> 0.2")
    assert expressions[("VolcanoJobWebhookPodsRefused", "warning")].endswith("> 5")
    assert expressions[("VolcanoJobWebhookSlow", "warning")].endswith("> 2.5")
    assert expressions[("VolcanoJobWebhookCertificateExpiresSoon", "warning")].endswith("< 30 * 86400")
    assert expressions[("VolcanoJobWebhookCertificateExpiresSoon", "critical")].endswith("< 10 * 86400")
    assert expressions[("VolcanoJobWebhookCACertificateExpiresSoon", "warning")].endswith("< 30 * 86400")
    assert 'name="team-volcano-job-webhook-ca"' in expressions[("VolcanoJobWebhookCACertificateExpiresSoon", "warning")]
    assert expressions[("VolcanoJobWebhookMemoryNearLimit", "warning")].endswith("> 0.8")
    for (alert, _), expression in expressions.items():
        if "volcano_" in expression or "kube_" in expression or "container_" in expression or alert.endswith("Down"):
            assert 'namespace="ml-system", pod=~"team-volcano-job-webhook-.*"' in expression, alert
    assert {r["labels"]["namespace"] for r in rules} == {"ml-system"}


# Overrides -----------------------------------------------------------------------------------------------


def test_overrides_of_namespace_labels_annotations_and_scrapes() -> None:
    values = {"metrics": {
        "serviceMonitor": {"enabled": True, "namespace": "monitoring", "labels": {"release": "kps"},
                           "annotations": {"team": "platform"}, "interval": "1m", "scrapeTimeout": "20s",
                           "tlsConfig": {"insecureSkipVerify": True}},
        "prometheusRule": {"enabled": True, "namespace": "monitoring", "labels": {"release": "kps", "role": "alert-rules"},
                           "annotations": {"team": "platform"}},
        "dashboard": {"enabled": True, "namespace": "grafana", "labels": {"team": "platform"},
                      "annotations": {"grafana_folder": "Batch"}},
    }}
    objects = template(values)
    service_monitor = find_one(objects, "ServiceMonitor", RELEASE)
    pod_monitor = find_one(objects, "PodMonitor", f"{RELEASE}-reconciler")
    prometheus_rule = rule(objects)
    configmap = find_one(objects, "ConfigMap", f"{RELEASE}-dashboard")
    for monitor in (service_monitor, pod_monitor):
        assert monitor["metadata"]["namespace"] == "monitoring"
        assert monitor["metadata"]["labels"]["release"] == "kps" and monitor["metadata"]["annotations"] == {"team": "platform"}
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}, "the targets stay in the release's namespace"
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"], endpoint["tlsConfig"]) == ("1m", "20s", {"insecureSkipVerify": True})
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert (pod_endpoint["interval"], pod_endpoint["scrapeTimeout"]) == ("1m", "20s")
    assert prometheus_rule["metadata"]["namespace"] == "monitoring"
    assert {k: prometheus_rule["metadata"]["labels"][k] for k in ("release", "role")} == {"release": "kps", "role": "alert-rules"}
    assert prometheus_rule["metadata"]["annotations"] == {"team": "platform"}
    assert all(f'namespace="{NAMESPACE}"' in r["expr"] for r in alerting_rules(objects) if "volcano_" in r["expr"])
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1", "the sidecar's label stays with labels of one's own"
    assert configmap["metadata"]["labels"]["team"] == "platform"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Batch"}
    # Empty interval and timeout: Prometheus's own.
    objects = template({"metrics": {"serviceMonitor": {"enabled": True, "interval": "", "scrapeTimeout": ""}}})
    (endpoint,) = find_one(objects, "ServiceMonitor", RELEASE)["spec"]["endpoints"]
    assert "interval" not in endpoint and "scrapeTimeout" not in endpoint


def test_a_service_monitor_elsewhere_needs_tls_settings() -> None:
    """The Prometheus Operator reads a monitor's Secrets in its own namespace: the CA Secret is not
    there, so without tlsConfig the chart refuses rather than render a scrape that fails."""
    done = run(["template", RELEASE, str(CHART), "-n", NAMESPACE, "--set", "metrics.serviceMonitor.enabled=true",
                "--set", "metrics.serviceMonitor.namespace=monitoring"], check=False)
    assert done.returncode != 0 and "set metrics.serviceMonitor.tlsConfig" in done.stderr, done.stderr


def test_the_dashboard_configmap_holds_the_dashboard() -> None:
    configmap = find_one(template(ALL_ON), "ConfigMap", f"{RELEASE}-dashboard")
    assert json.loads(configmap["data"]["volcano-job-webhook.json"]) == dashboard()
    board = dashboard()
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "namespace"]
    titles = [p["title"] for p in board["panels"]]
    assert titles == ["Pods wired and refused a minute", "Admission latency as the API server sees it",
                      "Jobs and objects in the caches", "Reconcile rate and errors", "Leader and queue", "Certificate expiry",
                      "Memory against the limit"]
    for panel in board["panels"]:
        assert panel["targets"] and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert [t["refId"] for t in panel["targets"]] == [chr(ord("A") + i) for i in range(len(panel["targets"]))]
        assert all('namespace="$namespace"' in t["expr"] or "apiserver_" in t["expr"] for t in panel["targets"]), panel["title"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


NOT_ALLOWED = r"(Additional property {0} is|'{0}') not allowed"


@pytest.mark.parametrize(("values", "complaint"), [
    ({"metrics": {"serviceMonitor": {"enable": True}}}, NOT_ALLOWED.format("enable")),
    ({"metrics": {"serviceMonitor": {"interval": "30 seconds"}}}, "interval"),
    ({"metrics": {"prometheusRule": {"thresholds": {"errorRatio": 5}}}}, "errorRatio"),
    ({"metrics": {"prometheusRule": {"thresholds": {"refusedPods": -1}}}}, "refusedPods"),
    ({"metrics": {"prometheusRule": {"thresholds": {"latency": 1}}}}, NOT_ALLOWED.format("latency")),
    ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
    ({"metrics": {"dashboard": {"namespace": "Not A Namespace"}}}, "namespace"),
    ({"metrics": {"podMonitor": {"enabled": True}}}, NOT_ALLOWED.format("podMonitor")),
])
def test_the_schema_refuses_misspelt_or_impossible_monitoring_values(values: dict[str, Any], complaint: str, tmp_path: Path) -> None:
    (tmp_path / "values.json").write_text(json.dumps(values))
    done = run(["template", RELEASE, str(CHART), "--values", str(tmp_path / "values.json")], check=False)
    assert done.returncode != 0, f"accepted: {values}"
    assert re.search(complaint, done.stderr), done.stderr


# helm lint, the CRDs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(render_manifests.VARIANTS))
def test_helm_lint_strict_with_monitoring_on(variant: str, tmp_path: Path) -> None:
    (tmp_path / "values.json").write_text(json.dumps(with_all_on(render_manifests.VARIANTS[variant])))
    done = run(["lint", "--strict", str(CHART), "--values", str(tmp_path / "values.json")])
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("variant", list(render_manifests.VARIANTS))
def test_the_monitoring_objects_validate_against_the_prometheus_operator_crds(variant: str) -> None:
    objects = [o for o in template(with_all_on(render_manifests.VARIANTS[variant])) if o["kind"] in MONITORING_KINDS]
    assert {o["kind"] for o in objects} == MONITORING_KINDS
    assert {describe(o): prometheus_operator.problems(o) for o in objects} == {describe(o): [] for o in objects}


def test_the_crd_check_refuses_what_the_api_server_would() -> None:
    monitor = find_one(template(ALL_ON), "ServiceMonitor", RELEASE)
    wrong = copy.deepcopy(monitor)
    wrong["spec"]["endpoints"][0]["intervall"] = "30s"
    wrong["spec"]["endpoints"][0]["scheme"] = "ftp"
    del wrong["spec"]["selector"]
    found = prometheus_operator.problems(wrong)
    assert any("intervall" in p for p in found) and any("ftp" in p for p in found) and any("selector" in p for p in found), found


def test_the_crds_are_the_operators_named_on_their_first_line() -> None:
    for path in sorted(prometheus_operator.FIXTURES.glob("*.yaml")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert re.fullmatch(r"# Source: github\.com/prometheus-operator/prometheus-operator "
                            rf"example/prometheus-operator-crd/{re.escape(path.name)} at v[0-9.]+ \(commit [0-9a-f]{{40}}\), unchanged\.", first), first
    assert set(prometheus_operator.crds()) == MONITORING_KINDS


# promtool ---------------------------------------------------------------------------------------------------


def promtool_or_skip() -> Path:
    if PROMTOOL_ENV in os.environ:
        explicit = os.environ[PROMTOOL_ENV]
        if not explicit:
            pytest.skip(f"promtool: {PROMTOOL_ENV} is set empty, which turns the alert rule tests off")
        if not os.access(explicit, os.X_OK):
            pytest.skip(f"promtool not found: {PROMTOOL_ENV}={explicit} is not an executable")
        return Path(explicit)
    found = shutil.which("promtool")
    if found is None:
        pytest.skip(f"promtool not found (${PROMTOOL_ENV}, PATH); Debian's prometheus package ships it "
                    "(.ci/run installs it as root), or set PROMTOOL")
    return Path(found)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool_or_skip()), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def write_rules(objects: list[dict[str, Any]], path: Path, *, annotations: bool = True) -> None:
    groups = copy.deepcopy(rule(objects)["spec"]["groups"])
    if not annotations:
        for group in groups:
            for r in group["rules"]:
                r.pop("annotations", None)
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))


@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_promtool_checks_the_rendered_rules(mode: str, tmp_path: Path) -> None:
    """The expressions parse and the annotations' templates too."""
    promtool_or_skip()
    objects = template({**ALL_ON, "certificates": {"mode": mode}})
    write_rules(objects, tmp_path / "rules.yaml")
    done = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerting_rules(objects))} rules found" in done.stdout


def test_promtool_checks_the_dashboard_queries(tmp_path: Path) -> None:
    """Each panel's query as a recording rule, with Grafana's variables as Grafana fills them in."""
    promtool_or_skip()
    rules = [{"record": f"dashboard:query_{i}", "expr": q.replace("$__rate_interval", "2m").replace("$namespace", NAMESPACE)}
             for i, q in enumerate(dashboard_queries())]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def rule_tests() -> dict[str, Any]:
    loaded = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def run_rule_tests(values: dict[str, Any], workdir: Path) -> subprocess.CompletedProcess[str]:
    """promtool test rules with the committed tests, on the chart's rules rendered with ``values``."""
    write_rules(template({**ALL_ON, "certificates": {"mode": "cert-manager"}, **values}), workdir / "rules.yaml", annotations=False)
    shutil.copy(RULE_TESTS, workdir / RULE_TESTS.name)
    return promtool("test", "rules", RULE_TESTS.name, cwd=workdir)


def test_promtool_every_alert_fires_when_it_should_and_not_on_a_healthy_cluster(tmp_path: Path) -> None:
    promtool_or_skip()
    tests = rule_tests()
    assert tests["rule_files"] == ["rules.yaml"]
    fired = {t["alertname"] for group in tests["tests"] for t in group.get("alert_rule_test", []) if t["exp_alerts"]}
    (healthy,) = [g for g in tests["tests"] if g["name"] == "healthy"]
    silent = {t["alertname"] for t in healthy["alert_rule_test"] if t["exp_alerts"] == []}
    every = ALERTS | CERT_MANAGER_ALERTS
    assert fired == every, "an alert no test fires"
    assert silent == every, "an alert the healthy test does not look at"
    done = run_rule_tests({}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_raised_thresholds_silence_the_alerts_they_govern(tmp_path: Path) -> None:
    """The tests fail when the thresholds are raised past what their series show: each firing test
    of a thresholded alert depends on its threshold."""
    promtool_or_skip()
    raised = {"metrics": {**ALL_ON["metrics"], "prometheusRule": {"enabled": True, "thresholds": {
        "errorRatio": 0.9, "refusedPods": 1000, "admissionLatencySeconds": 20, "certificateExpiryDays": 1,
        "certificateExpiryCriticalDays": 1, "memoryLimitRatio": 0.99}}}}
    done = run_rule_tests(raised, tmp_path)
    assert done.returncode != 0
    failed = set(re.findall(r"alertname: (\w+),", done.stdout + done.stderr))
    assert failed == {"VolcanoJobWebhookErrors", "VolcanoJobWebhookPodsRefused", "VolcanoJobWebhookSlow",
                      "VolcanoJobWebhookCertificateExpiresSoon", "VolcanoJobWebhookCACertificateExpiresSoon",
                      "VolcanoJobWebhookMemoryNearLimit"}, done.stdout + done.stderr
