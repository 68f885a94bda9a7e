"""An operator's day two on a real node (issue #35 parts 2 and 3): the install watched by a real
Prometheus, and upgraded and rolled back under a running Volcano job.

On the one-node cluster of tests/on_node/conftest.py, with the chart installed as docs/install.md
installs it (the image values pointing at the local image):

1. **Monitoring** (:func:`test_prometheus_scrapes_both_processes_dashboard_and_an_alert`). Debian's
   Prometheus (``/usr/bin/prometheus``, or ``$PROMETHEUS``) runs as a process of the test on
   127.0.0.1, its data in the test's directory. Its scrape jobs are what the Prometheus Operator
   makes of the chart's ServiceMonitor and PodMonitor (``helm template`` with
   ``metrics.serviceMonitor.enabled``; :func:`monitor_jobs`): the same selectors, ports, paths and
   schemes, the webhook's certificate checked against ``ca.crt`` of the install's Secret (read from
   the cluster) for the Service's name, the Operator's target labels (``namespace``, ``pod``,
   ``container``...). Debian builds Prometheus without ``kubernetes_sd_configs``, so the targets come
   through its ``http_sd_configs`` from :class:`Standins`, which reads the release's Pods,
   EndpointSlices and Services and the Node from the real API server at each refresh (2 s) and gives
   them the ``__meta_kubernetes_*`` labels Kubernetes discovery sets; the relabelling is
   Prometheus's. Besides the two processes, what docs/install.md says the alerts and the dashboard
   read: the API server, the kubelet's cAdvisor, and kube-state-metrics, not at hand here: the
   stand-in serves the two of its series they read. The rules are the chart's PrometheusRule
   (``metrics.prometheusRule.enabled``) with every ``for:`` shortened to :data:`FOR` (the chart's are
   minutes, and no value sets them). Scrapes and evaluations every 2 s (the chart's ``interval``,
   30 s, is overridden too). Checked: every target up (two webhook replicas, two reconciler ones,
   the API server, the kubelet, kube-state-metrics); no alert pending or firing on the healthy
   install; once a Volcano job's Pods are wired, every dashboard panel has data, and every query but
   the ones that have data only when something fails or with cert-manager (:data:`ONLY_ON_FAILURE`;
   ``$namespace`` the release's, ``$__rate_interval`` 1m); the Deployment scaled to 0 with the
   registration in place fires VolcanoJobWebhookDown, and scaled back to 2 it resolves.
2. **Upgrades** (:func:`test_upgrades_and_rollback_under_a_running_job`): a Volcano job running,
   its side objects made by the reconciler (``svc``, ``ssh``); then, each while a Pod of another
   Volcano job is created every 0.2 s (the conftest's :class:`PodStream`): ``helm
   upgrade --set layout=split``; ``helm rollback`` to the default install; ``helm upgrade`` to the
   chart of the newest commit whose chart differs from this one (``git archive`` into the test's
   directory) and ``helm upgrade`` from it to this chart. None refused, every one wired, the running
   job's Pods and side objects unchanged (uid and resourceVersion). The image is this tree's
   throughout (the previous commit's is not built): the release is taken to the previous chart and
   upgraded from there, rather than installed from it, so that a permission this tree's code needs
   and the previous chart lacks cannot stop its first Pods. Last, ``helm upgrade --set
   certificates.mode=cert-manager`` (and ``helm template --dry-run=server``) where cert-manager is
   absent: refused with the chart's message, nothing changed.

Figures are printed at the end (with ``-s``) and written to ``node-operations.json``;
docs/benchmarks.md ("Monitoring and upgrades on a real node") records a run. Skips as the conftest
says, and naming Prometheus or git history where they are missing.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity

from tests.helpers import node as node_module
from tests.helpers.envtest import Process, free_port, read, request, wait_until
from tests.helpers.helm import CHART, helm_or_skip
from tests.helpers.jobs import volcano_job
from tests.helpers.kustomize import ROOT
from tests.on_node.conftest import (
    DEPLOYMENT,
    IMAGE_VALUES,
    NAMESPACE,
    RELEASE,
    WIRED,
    Cluster,
    Figures,
    PodStream,
    cut_drains_short,
    figures_fixture,
    install,
    registrations,
    uninstall,
    wait_installed,
    window_job,
)
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL
from volcano_job_webhook.reconciler.owned import OWNED

Obj = dict[str, Any]
PROMETHEUS_ENV = "PROMETHEUS"
INTERVAL = "2s"  # Prometheus's scrape and evaluation interval here
FOR = "6s"  # every rule's ``for:`` here
RATE_INTERVAL = "1m"  # the dashboard's $__rate_interval
ALERT = "VolcanoJobWebhookDown"
DASHBOARD = CHART / "dashboards" / "volcano-job-webhook.json"
# Dashboard queries with data only when something fails (refusals, errors, API errors, audit) or
# with cert-manager: the healthy install on this node has none of them.
ONLY_ON_FAILURE = ('result=~"denied|error"', 'result="audit"', "apiserver_admission_webhook_rejection_count",
                   "volcano_reconciler_api_errors_total", "certmanager_")
RECONCILER = f"{DEPLOYMENT}-reconciler"  # the split layout's second Deployment
CERT_MANAGER_REFUSAL = "this cluster does not serve cert-manager.io/v1 Issuer and Certificate"
PAUSE = node_module.PAUSE_IMAGE  # busybox: the running job's Pods sleep

figures = figures_fixture("node-operations", "Monitoring and upgrades on a real node")


def find_prometheus() -> str | None:
    value = os.environ.get(PROMETHEUS_ENV) or shutil.which("prometheus") or "/usr/bin/prometheus"
    return value if os.access(value, os.X_OK) else None


def previous_chart_commit() -> str | None:
    """The newest commit whose charts/volcano-job-webhook differs from this tree's (None without git
    or its history, e.g. a shallow clone)."""
    path = str(CHART.relative_to(ROOT))
    try:
        log = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "--", path], capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
        for commit in log:
            same = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", commit, "--", path], timeout=60, check=False)
            if same.returncode == 1:
                return commit
    except (OSError, subprocess.SubprocessError):
        return None
    return None


# Prometheus -----------------------------------------------------------------------------------------


def _labels(prefix: str, labels: dict[str, str] | None) -> dict[str, str]:
    return {prefix + _label(k): v for k, v in (labels or {}).items()}


def pod_targets(pods: list[Obj], namespace: str) -> list[Obj]:
    """Prometheus's ``kubernetes_sd_configs`` role ``pod``: a target a container port, its labels."""
    groups = []
    for pod in pods:
        meta = pod["metadata"]
        common = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": meta["name"],
                  "__meta_kubernetes_pod_phase": (pod.get("status") or {}).get("phase", ""),
                  **_labels("__meta_kubernetes_pod_label_", meta.get("labels"))}
        ip = (pod.get("status") or {}).get("podIP")
        for container in pod["spec"]["containers"] if ip else []:
            for port in container.get("ports") or []:
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **common, "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", "")}})
    return groups


def endpoint_targets(services: list[Obj], slices: list[Obj], pods: list[Obj], namespace: str) -> list[Obj]:
    """Role ``endpoints`` (from EndpointSlices): a target an address and port of a Service, with the
    Service's labels and the Pod's and container's behind it."""
    by_name = {s["metadata"]["name"]: s for s in services}
    by_pod = {p["metadata"]["name"]: p for p in pods}
    groups = []
    for endpoint_slice in slices:
        service = by_name.get((endpoint_slice["metadata"].get("labels") or {}).get("kubernetes.io/service-name", ""))
        if service is None:
            continue
        for endpoint in endpoint_slice.get("endpoints") or []:
            pod = by_pod.get(((endpoint.get("targetRef") or {}).get("name")) or "")
            for port in endpoint_slice.get("ports") or []:
                labels = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_service_name": service["metadata"]["name"],
                          **_labels("__meta_kubernetes_service_label_", service["metadata"].get("labels")),
                          "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                          "__meta_kubernetes_endpoint_ready": str(bool((endpoint.get("conditions") or {}).get("ready"))).lower()}
                if pod is not None:
                    labels |= {"__meta_kubernetes_pod_name": pod["metadata"]["name"],
                               **_labels("__meta_kubernetes_pod_label_", pod["metadata"].get("labels"))}
                    for c in pod["spec"]["containers"]:
                        if any(cp["containerPort"] == port["port"] for cp in c.get("ports") or []):
                            labels["__meta_kubernetes_pod_container_name"] = c["name"]
                groups += [{"targets": [f"{address}:{port['port']}"], "labels": labels} for address in endpoint["addresses"]]
    return groups


class Standins:
    """What Debian's Prometheus and this node lack, served on 127.0.0.1 from the API server at each
    request: Kubernetes service discovery (Debian builds Prometheus without ``kubernetes_sd_configs``;
    it has ``http_sd_configs``), as ``/sd/pod``, ``/sd/endpoints`` and ``/sd/node`` with the
    ``__meta_kubernetes_*`` labels that discovery sets, for the release's namespace; and
    kube-state-metrics, as ``/metrics`` with the two of its series the chart's rules and dashboard
    read (``kube_pod_container_resource_limits``, ``kube_pod_container_status_ready``), its labels."""

    def __init__(self, cluster: Cluster) -> None:
        api = cluster.node.api_client()

        def items(path: str) -> list[Obj]:
            return list(request(api, "GET", path)["items"])

        def answer(path: str) -> tuple[str, str]:
            pods = items(f"/api/v1/namespaces/{NAMESPACE}/pods")
            if path == "/sd/pod":
                return "application/json", json.dumps(pod_targets(pods, NAMESPACE))
            if path == "/sd/endpoints":
                return "application/json", json.dumps(endpoint_targets(
                    items(f"/api/v1/namespaces/{NAMESPACE}/services"),
                    items(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"), pods, NAMESPACE))
            if path == "/sd/node":
                return "application/json", json.dumps([{
                    "targets": [f"{a['address']}:{n['status']['daemonEndpoints']['kubeletEndpoint']['Port']}"
                                for a in n["status"]["addresses"] if a["type"] == "InternalIP"],
                    "labels": {"__meta_kubernetes_node_name": n["metadata"]["name"]}} for n in items("/api/v1/nodes")])
            lines = []
            for pod in pods:
                meta = pod["metadata"]
                common = f'namespace="{meta["namespace"]}",pod="{meta["name"]}",uid="{meta["uid"]}"'
                ready = {s["name"]: s.get("ready", False) for s in (pod.get("status") or {}).get("containerStatuses") or []}
                for container in pod["spec"]["containers"]:
                    name = container["name"]
                    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
                    if limit:
                        lines.append(f'kube_pod_container_resource_limits{{{common},container="{name}",'
                                     f'node="{pod["spec"].get("nodeName", "")}",resource="memory",unit="byte"}} '
                                     f"{int(parse_quantity(limit))}")
                    lines.append(f'kube_pod_container_status_ready{{{common},container="{name}"}} {int(ready.get(name, False))}')
            return "text/plain; version=0.0.4", "\n".join(lines) + "\n"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                content_type, text = answer(self.path)
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="standins", daemon=True)

    def sd(self, role: str) -> Obj:
        return {"url": f"http://{self.address}/sd/{role}", "refresh_interval": INTERVAL}

    def __enter__(self) -> Standins:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _keep(source: str, value: str) -> Obj:
    return {"action": "keep", "source_labels": [source], "regex": value.replace(".", "\\.")}


def _label(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _replace(source: str, target: str) -> Obj:
    return {"action": "replace", "source_labels": [source], "target_label": target}


def monitor_jobs(cluster: Cluster, monitors: list[Obj], standins: Standins, workdir: Path) -> list[Obj]:
    """The scrape jobs the Prometheus Operator makes of a ServiceMonitor's and a PodMonitor's
    endpoints: the same selection, port, path, scheme and TLS, its target labels; each interval
    :data:`INTERVAL`."""
    jobs = []
    for monitor in monitors:
        spec, name = monitor["spec"], monitor["metadata"]["name"]
        service = monitor["kind"] == "ServiceMonitor"
        role = "endpoints" if service else "pod"
        prefix = "__meta_kubernetes_service_label_" if service else "__meta_kubernetes_pod_label_"
        for i, endpoint in enumerate(spec["endpoints"] if service else spec["podMetricsEndpoints"]):
            assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE], spec["namespaceSelector"]
            relabel = [_keep(prefix + _label(k), v) for k, v in spec["selector"]["matchLabels"].items()]
            port_label = "__meta_kubernetes_endpoint_port_name" if service else "__meta_kubernetes_pod_container_port_name"
            relabel.append(_keep(port_label, endpoint["port"]))
            if not service:  # the Operator drops finished Pods
                relabel.append({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"})
            relabel += [_replace("__meta_kubernetes_namespace", "namespace"), _replace("__meta_kubernetes_pod_name", "pod"),
                        _replace("__meta_kubernetes_pod_container_name", "container")]
            relabel.append({"action": "replace", "target_label": "endpoint", "replacement": endpoint["port"]})
            if service:
                relabel += [_replace("__meta_kubernetes_service_name", "service"), _replace("__meta_kubernetes_service_name", "job")]
            else:
                relabel.append({"action": "replace", "target_label": "job", "replacement": f"{monitor['metadata']['namespace']}/{name}"})
            job: Obj = {
                "job_name": f"{'serviceMonitor' if service else 'podMonitor'}/{monitor['metadata']['namespace']}/{name}/{i}",
                "scheme": endpoint.get("scheme", "http"), "metrics_path": endpoint.get("path", "/metrics"),
                "scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "honor_labels": endpoint.get("honorLabels", False),
                "http_sd_configs": [standins.sd(role)],
                "relabel_configs": relabel,
            }
            tls = endpoint.get("tlsConfig")
            if tls:
                secret = tls["ca"]["secret"]
                found = read(cluster.admin, "v1", "Secret", secret["name"], NAMESPACE)
                assert found, f"Secret {NAMESPACE}/{secret['name']} the monitor reads the CA from"
                ca = workdir / f"{secret['name']}-{secret['key']}"
                ca.write_bytes(base64.b64decode(found["data"][secret["key"]]))
                job["tls_config"] = {"ca_file": str(ca), "server_name": tls["serverName"]}
            jobs.append(job)
    return jobs


class Prometheus:
    """Debian's Prometheus, a process of the test on 127.0.0.1, its data in ``workdir``."""

    def __init__(self, binary: str, workdir: Path, scrape_configs: list[Obj], groups: list[Obj]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL, "scrape_timeout": INTERVAL},
            "rule_files": [str(workdir / "rules.yaml")], "scrape_configs": scrape_configs,
        }))
        self.binary, self.workdir = binary, workdir
        self.url = f"http://127.0.0.1:{free_port()}"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.process: Process | None = None

    def __enter__(self) -> Prometheus:
        self.process = Process.start("prometheus", [
            self.binary, f"--config.file={self.workdir / 'prometheus.yaml'}", f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}", "--storage.tsdb.retention.time=1h",
        ], self.workdir / "prometheus.log", env=node_module.clean_env(), cwd=self.workdir)
        wait_until(self._ready, 60, "Prometheus ready", interval=0.2, log=self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.stop()

    def log(self, tail: int = 30) -> str:
        return self.process.log(tail=tail) if self.process else ""

    def _ready(self) -> bool:
        assert self.process is not None and self.process.alive, f"prometheus exited:\n{self.log()}"
        try:
            with self._opener.open(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with self._opener.open(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Obj]:
        return list(self.api("query", query=expr)["result"])

    def targets(self) -> list[Obj]:
        return list(self.api("targets", state="active")["activeTargets"])

    def alerts(self, state: str = "firing") -> list[str]:
        return sorted(a["labels"]["alertname"] for a in self.api("alerts")["alerts"] if a["state"] == state)


def panel_queries() -> dict[str, list[str]]:
    """Each dashboard panel's queries, with the dashboard's variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {panel["title"]: [t["expr"].replace("$namespace", NAMESPACE).replace("$__rate_interval", RATE_INTERVAL)
                             for t in panel.get("targets") or []] for panel in dashboard["panels"]}


def rule_groups(cluster: Cluster) -> list[Obj]:
    """The chart's PrometheusRule's groups, each ``for:`` :data:`FOR`."""
    rendered = cluster.helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--set=metrics.prometheusRule.enabled=true",
                            "--show-only=templates/prometheusrule.yaml")
    groups: list[Obj] = yaml.safe_load(rendered)["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = FOR
    return groups


def monitors(cluster: Cluster) -> list[Obj]:
    rendered = cluster.helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--set=metrics.serviceMonitor.enabled=true",
                            "--show-only=templates/servicemonitor.yaml")
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def running_job(cluster: Cluster, namespace: str, name: str) -> Obj:
    """A Volcano Job whose Pods Volcano's controller makes and runs (they sleep), wired by the webhook
    (``env``) and with side objects the reconciler makes (``svc``: a ConfigMap of hosts, a headless
    Service; ``ssh``: a Secret)."""
    job = volcano_job(name, namespace=namespace, tasks=[("master", 1), ("worker", 1)], image=PAUSE,
                      annotation={"env": [], "svc": [], "ssh": []}, schedulerName="volcano", minAvailable=2)
    for task in job["spec"]["tasks"]:
        task["template"]["spec"]["containers"][0].update(imagePullPolicy="Never", command=["/bin/busybox", "sleep", "3600"])
    volcano = cluster.volcano(namespace)
    volcano.create(job)

    def running() -> list[Obj]:
        made: list[Obj] = volcano.pods(name)
        up = [p for p in made if (p.get("status") or {}).get("phase") == "Running"]
        return made if len(up) == 2 and volcano.phase(name) == "Running" and side_objects(cluster, namespace) else []

    pods: list[Obj] = volcano.wait(running, f"Volcano Job {namespace}/{name} Running with its side objects")
    for pod in pods:
        env = {e["name"] for e in pod["spec"]["containers"][0].get("env") or []}
        assert WIRED in env, (pod["metadata"]["name"], env)
    return job


def side_objects(cluster: Cluster, namespace: str) -> dict[str, tuple[str, str]]:
    """The reconciler's objects in ``namespace``: ``kind/name`` → (uid, resourceVersion)."""
    found: dict[str, tuple[str, str]] = {}
    for kind in OWNED.values():
        path = f"/api/{kind.version}" if not kind.group else f"/apis/{kind.group}/{kind.version}"
        items = request(cluster.admin, "GET", f"{path}/namespaces/{namespace}/{kind.plural}",
                        query=[("labelSelector", f"{MANAGED_BY_LABEL}={MANAGED_BY}")])["items"]
        found |= {f"{kind.kind}/{o['metadata']['name']}": (o["metadata"]["uid"], o["metadata"]["resourceVersion"]) for o in items}
    return found


def job_pods(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    pods: list[Obj] = cluster.volcano(namespace).pods(name)
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


@contextmanager
def installed(cluster: Cluster, chart: Path, *values: str) -> Iterator[None]:
    install(cluster, chart, *values)
    try:
        yield
    finally:
        uninstall(cluster)


# The tests ------------------------------------------------------------------------------------------


@pytest.mark.skipif(find_prometheus() is None, reason=f"prometheus not found (apt-get install prometheus, or set {PROMETHEUS_ENV})")
def test_prometheus_scrapes_both_processes_dashboard_and_an_alert(cluster: Cluster, figures: Figures, tmp_path: Path) -> None:
    binary = find_prometheus()
    assert binary is not None
    envtest = cluster.node.envtest
    token = tmp_path / "token"
    token.write_text(envtest.token())
    auth = {"authorization": {"credentials_file": str(token)}}
    with installed(cluster, CHART), Standins(cluster) as standins:
        scrape = [
            *monitor_jobs(cluster, monitors(cluster), standins, tmp_path),
            {"job_name": "apiserver", "scheme": "https", **auth, "tls_config": {"ca_file": str(envtest.ca_file)},
             "static_configs": [{"targets": [urllib.parse.urlparse(envtest.host).netloc]}]},
            # The kubelet (its serving certificate is its own, self-signed). Its resource metrics, not
            # cAdvisor's: this node's cAdvisor does not reach its containerd (its socket is not at the
            # usual path) and names no container; container_memory_working_set_bytes is the same
            # series there, with the same labels (namespace, pod, container).
            {"job_name": "kubelet", "scheme": "https", "metrics_path": "/metrics/resource", **auth,
             "tls_config": {"insecure_skip_verify": True}, "http_sd_configs": [standins.sd("node")]},
            {"job_name": "kube-state-metrics", "honor_labels": True, "static_configs": [{"targets": [standins.address]}]},
        ]
        with Prometheus(binary, tmp_path / "prometheus", scrape, rule_groups(cluster)) as prometheus:
            started = time.monotonic()

            def all_up() -> list[Obj]:
                targets = prometheus.targets()
                ours = [t for t in targets if t["labels"].get("namespace") == NAMESPACE]
                webhook = [t for t in ours if t["labels"].get("container") == "webhook"]
                reconciler = [t for t in ours if t["labels"].get("container") == "reconciler"]
                ok = len(webhook) == len(reconciler) == 2 and len(targets) == len(ours) + 3
                return targets if ok and all(t["health"] == "up" for t in targets) else []

            targets = wait_until(all_up, 120, "every target up (2 webhook, 2 reconciler, API server, kubelet, kube-state-metrics)",
                                 interval=0.5, log=lambda: json.dumps([(t["scrapePool"], t["scrapeUrl"], t["health"], t["lastError"])
                                                                       for t in prometheus.targets()], indent=1) + prometheus.log())
            figures["targets_up_s"] = time.monotonic() - started
            figures["targets"] = ", ".join(sorted(f"{t['scrapePool']} {t['scrapeUrl']}" for t in targets))
            wait_until(lambda: not prometheus.alerts("firing") and not prometheus.alerts("pending"), 60,
                       "no alert on the healthy install", interval=0.5, log=lambda: str(prometheus.api("alerts")))

            namespace = cluster.namespace("monitoring-")
            running_job(cluster, namespace, "watched")
            wired = time.monotonic()
            queries = panel_queries()
            expected = {expr for exprs in queries.values() for expr in exprs if not any(s in expr for s in ONLY_ON_FAILURE)}
            with_data: set[str] = set()

            def every_panel() -> bool:
                with_data.update(expr for expr in expected - with_data if prometheus.query(expr))
                return with_data == expected

            wait_until(every_panel, 120, "data for every dashboard query", interval=1,
                       log=lambda: "no data: " + "\n".join(sorted(expected - with_data)))
            figures["dashboard_panels"] = len(queries)
            figures["dashboard_queries"] = sum(map(len, queries.values()))
            figures["dashboard_queries_with_data"] = len(with_data)
            figures["dashboard_data_after_wiring_s"] = time.monotonic() - wired
            assert all(with_data & set(exprs) for exprs in queries.values()), "a panel with no data"

            # The alert: no webhook replica, the registration in place (the reconciler never withdraws it).
            begun = time.monotonic()
            cluster.kubectl("-n", NAMESPACE, "scale", f"deployment/{DEPLOYMENT}", "--replicas=0")
            cut_drains_short(cluster, "-l", "app.kubernetes.io/component=webhook")  # no Pod is made meanwhile
            wait_until(lambda: ALERT in prometheus.alerts("firing"), 120, f"{ALERT} firing", interval=0.5,
                       log=lambda: str(prometheus.api("alerts")))
            figures["alert_firing_s"] = time.monotonic() - begun
            assert None not in registrations(cluster).values(), "the registration was withdrawn"
            begun = time.monotonic()
            cluster.kubectl("-n", NAMESPACE, "scale", f"deployment/{DEPLOYMENT}", "--replicas=2")
            wait_until(lambda: ALERT not in prometheus.alerts("firing") + prometheus.alerts("pending"), 180,
                       f"{ALERT} resolved", interval=0.5, log=lambda: str(prometheus.api("alerts")) + cluster.kubectl(
                           "-n", NAMESPACE, "get", "pods"))
            figures["alert_resolved_s"] = time.monotonic() - begun
            figures["alert_for"] = FOR


previous = previous_chart_commit()


@pytest.mark.skipif(previous is None, reason="no earlier commit of charts/volcano-job-webhook (git or its history missing)")
def test_upgrades_and_rollback_under_a_running_job(cluster: Cluster, figures: Figures, tmp_path: Path) -> None:
    assert previous is not None
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", previous, str(CHART.relative_to(ROOT))],
                             capture_output=True, check=True, timeout=60).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path / "previous", filter="data")
    figures["previous_chart_commit"] = previous[:12]
    upgrade = ["upgrade", RELEASE, "-n", NAMESPACE, *IMAGE_VALUES]
    with installed(cluster, CHART):
        namespace = cluster.namespace("upgrade-")
        running_job(cluster, namespace, "running")
        objects, pods = side_objects(cluster, namespace), job_pods(cluster, namespace, "running")
        figures["side_objects"] = ", ".join(sorted(objects))
        stream_job = window_job(cluster, namespace, "stream")
        steps = [  # revisions: 1 the install, 2 split, 3 sidecar again, 4 the previous chart, 5 this one
            ("upgrade_split", [*upgrade, str(CHART), "--set=layout=split"], (DEPLOYMENT, RECONCILER)),
            ("rollback", ["rollback", RELEASE, "1", "-n", NAMESPACE], (DEPLOYMENT,)),
            ("to_previous", [*upgrade, str(tmp_path / "previous" / CHART.relative_to(ROOT))], (DEPLOYMENT,)),
            ("upgrade_previous", [*upgrade, str(CHART)], (DEPLOYMENT,)),
        ]
        for step, command, deployments in steps:
            with PodStream(cluster, stream_job, step) as stream:
                time.sleep(1.0)
                begun = time.monotonic()
                cluster.helm(*command, timeout=180)
                wait_installed(cluster, *deployments)
                if step == "rollback":
                    wait_until(lambda: read(cluster.admin, "apps/v1", "Deployment", RECONCILER, NAMESPACE) is None, 60,
                               f"Deployment {RECONCILER} deleted by the rollback")
                figures[f"{step}_s"] = time.monotonic() - begun
                time.sleep(3.0)
            stream.record(figures, step)
            assert not stream.failures(), (step, stream.failures()[:5])
            assert stream.count("wired") == len(stream.outcomes) > 0, (step, [o.result for o in stream.outcomes])
            assert side_objects(cluster, namespace) == objects, f"{step}: the running job's side objects changed"
            assert job_pods(cluster, namespace, "running") == pods, f"{step}: the running job's Pods changed"
            assert cluster.volcano(namespace).phase("running") == "Running"

        # cert-manager where it is absent: refused by the chart, before anything is changed.
        revision = json.loads(cluster.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json"))["version"]
        generation = ((read(cluster.admin, "apps/v1", "Deployment", DEPLOYMENT, NAMESPACE) or {}).get("metadata") or {}).get("generation")
        for command in (["upgrade", RELEASE, str(CHART)], ["template", RELEASE, str(CHART), "--dry-run=server"]):
            done = subprocess.run([str(helm_or_skip()), *command, "-n", NAMESPACE, *IMAGE_VALUES,
                                   "--set=certificates.mode=cert-manager"], capture_output=True, text=True, timeout=120,
                                  env=cluster.node.tool_env(), check=False)
            assert done.returncode != 0 and CERT_MANAGER_REFUSAL in done.stderr, (command, done.stdout[-2000:], done.stderr)
            figures[f"cert_manager_{command[0]}_refusal"] = next(line for line in done.stderr.splitlines() if CERT_MANAGER_REFUSAL in line)
        assert json.loads(cluster.helm("status", RELEASE, "-n", NAMESPACE, "-o", "json"))["version"] == revision
        assert ((read(cluster.admin, "apps/v1", "Deployment", DEPLOYMENT, NAMESPACE) or {}).get("metadata") or {}).get("generation") == generation
        assert side_objects(cluster, namespace) == objects
