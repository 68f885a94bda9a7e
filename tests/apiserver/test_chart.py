"""The Helm chart (``charts/volcano-job-webhook``): the one source of the install's objects.

* ``helm lint --strict`` finds nothing, with the defaults and with each variant's values;
* ``manifests/`` is the chart rendered (tests/helpers/render_manifests.py): a fresh rendering equals what is
  committed, so the two cannot drift (tests/programs/test_manifests.py checks the contract on the manifests);
* every variant's rendering, and the webhook configurations of its ``webhooks.yaml``, validate
  against the strict Kubernetes schemas, also with every value set (the monitoring objects against
  the Prometheus Operator's CRDs; tests/programs/test_chart_monitoring.py has the rest of the monitoring);
* each value changes what it says and nothing it should not (image, replicas, layout, enforcement
  and settings into config.yaml, namespaceSelector, timeouts, certificates, scheduling, the
  NetworkPolicy, names from the release), and values.schema.json refuses what the settings would;
* against a real kube-apiserver (``KUBEBUILDER_ASSETS``; skipped without it, saying so): every
  variant's rendering, the chart's and kustomize's, is accepted (server-side dry-run apply), and
  with the monitoring on, with the Prometheus Operator's CRDs installed
  (tests/fixtures/prometheus-operator/); ``helm install``, ``helm upgrade`` (a setting, the image,
  the layout) and ``helm uninstall`` go through with no other step, and after the uninstall nothing
  of the release is left (also with the monitoring on); ``kubectl apply -k manifests`` and
  ``kubectl delete -k manifests`` the same (with kube-controller-manager's namespace controller and
  garbage collector, which the directory's assets hold).

helm is found as tests/helpers/helm.py says; without it these tests skip naming what was looked for.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import prometheus_operator, render_manifests
from tests.helpers.envtest import ASSETS_ENV, EnvTest, controller_manager, create, find_assets, read, wait_until
from tests.helpers.helm import CHART, HELM_ENV, NAMESPACE, RELEASE, cached_helm, find_helm, helm_or_skip, run, template, template_text
from tests.helpers.kustomize import MANIFESTS, OVERLAYS, SETTINGS, SPLIT_VARIANTS, VARIANTS, kubectl_or_skip
from tests.helpers.manifests_util import (
    CLUSTER_SCOPED,
    K8S_VERSIONS,
    canonical,
    describe,
    find,
    find_one,
    object_id,
    schema_problems,
    settings,
    webhook_configurations,
)

REPOSITORY = "ghcr.io/volcano-job-webhook/volcano-job-webhook"
APP_VERSION = "0.1.0"
DIGEST = "sha256:" + "0123456789abcdef" * 4
CHART_VARIANTS = render_manifests.VARIANTS
# Every value the chart has, set to something other than its default (the schema check of a full rendering).
EVERY_VALUE: dict[str, Any] = {
    "image": {"repository": "registry.example.com/platform/vjw", "tag": "9.9.9", "digest": DIGEST, "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "replicaCount": 3,
    "layout": "split",
    "enforcement": "audit",
    "settings": {"default_plugins": {"env": []}, "volcano_controller_plugins": [], "allowed_plugins": ["env", "svc"],
                 "namespaces": ["team-a"], "workloads": [], "log_level": "debug", "hosts_env_limit": None, "env_placement": "first",
                 "max_connections": 2048},
    "webhook": {"resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
                "namespaceSelector": {"matchLabels": {"volcano": "on"}}, "timeoutSeconds": 8, "validatingTimeoutSeconds": 2},
    "reconciler": {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "2Gi"}}},
    "certificates": {"mode": "cert-manager"},
    "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
    "networkPolicy": {"enabled": True, "ingressFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                      "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
                                   "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "volcano-job-webhook"}}}],
    "priorityClassName": "platform-critical",
    "podAnnotations": {"prometheus.io/scrape": "true"},
    "namespace": {"create": True, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    "metrics": {
        "serviceMonitor": {"enabled": True, "namespace": "monitoring", "labels": {"release": "kps"}, "annotations": {"team": "platform"},
                           "interval": "1m", "scrapeTimeout": "20s",
                           "tlsConfig": {"serverName": "team-volcano-job-webhook.ml-system.svc",
                                         "ca": {"configMap": {"name": "volcano-job-webhook-ca", "key": "ca.crt"}}}},
        "prometheusRule": {"enabled": True, "namespace": "monitoring", "labels": {"release": "kps"}, "annotations": {"team": "platform"},
                           "thresholds": {"errorRatio": 0.1, "refusedPods": 3, "admissionLatencySeconds": 2, "certificateExpiryDays": 30,
                                          "certificateExpiryCriticalDays": 10, "memoryLimitRatio": 0.8}},
        "dashboard": {"enabled": True, "namespace": "grafana", "labels": {"grafana_dashboard": "1", "team": "platform"},
                      "annotations": {"grafana_folder": "Batch"}},
    },
}
# Where EVERY_VALUE puts the monitoring objects (metrics.*.namespace).
MONITORING_NAMESPACES = {"ServiceMonitor": "monitoring", "PodMonitor": "monitoring", "PrometheusRule": "monitoring", "ConfigMap": "grafana"}


def deployments(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return find(objects, "Deployment")


def pod_spec(objects: list[dict[str, Any]], name: str = RELEASE) -> dict[str, Any]:
    return find_one(objects, "Deployment", name)["spec"]["template"]["spec"]


def containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every container of every Deployment, by name."""
    return {c["name"]: c for d in deployments(objects) for c in d["spec"]["template"]["spec"]["containers"]}


def refused(values: Mapping[str, Any]) -> str:
    """What helm says when the values are refused (values.schema.json); fails when they are not."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(values, f)
        f.flush()
        done = run(["template", RELEASE, str(CHART), "--values", f.name], check=False)
    assert done.returncode != 0, f"accepted: {values}"
    return done.stderr


# helm, and the chart as helm sees it ----------------------------------------------------------------


def test_helm_is_looked_for_in_the_documented_order(tmp_path: Path) -> None:
    """$HELM alone when set, then PATH, then the cache .ci/run fills."""
    places = {name: tmp_path / name / "helm" for name in ("explicit", "path", "cache/volcano-job-webhook/bin")}
    for place in places.values():
        place.parent.mkdir(parents=True)
        place.write_text("#!/bin/sh\n")
        place.chmod(0o755)
    environ = {HELM_ENV: str(places["explicit"]), "PATH": str(places["path"].parent), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    order = [find_helm(environ)]
    del environ[HELM_ENV]
    order.append(find_helm(environ))
    environ["PATH"] = str(tmp_path)  # no helm there
    order.append(find_helm(environ))
    assert order == list(places.values())
    assert cached_helm(environ) == places["cache/volcano-job-webhook/bin"]
    assert find_helm({HELM_ENV: "", "PATH": str(places["path"].parent)}) is None, "HELM set empty: none"
    places["cache/volcano-job-webhook/bin"].chmod(0o644)
    assert find_helm(environ) is None, "not executable"


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["appVersion"]) == ("v2", "volcano-job-webhook", APP_VERSION)
    import tomllib

    assert tomllib.loads((CHART.parent.parent / "pyproject.toml").read_text())["project"]["version"] == APP_VERSION


@pytest.mark.parametrize("variant", [None, *CHART_VARIANTS])
def test_helm_lint_strict_finds_nothing(variant: str | None, tmp_path: Path) -> None:
    args = ["lint", "--strict", str(CHART)]
    if variant is not None:
        (tmp_path / "values.json").write_text(json.dumps(CHART_VARIANTS[variant]))
        args += ["--values", str(tmp_path / "values.json")]
    done = run(args)
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


# One source: manifests/ is the chart rendered ------------------------------------------------------------


def test_the_manifests_are_the_chart_rendered() -> None:
    """A fresh rendering equals the committed files (run `python -m tests.helpers.render_manifests` after
    changing the chart), and those are all the files of the variants and the settings."""
    files = render_manifests.render()
    diff = render_manifests.differences(files)
    assert diff == "", f"manifests/ differ from the chart; run .venv/bin/python -m tests.helpers.render_manifests:\n{diff[:6000]}"
    rendered = {p.relative_to(MANIFESTS).as_posix() for p in files}
    on_disk = {p.relative_to(MANIFESTS).as_posix() for d in (OVERLAYS, SETTINGS) for p in d.rglob("*") if p.is_file()
               and p.name != "kustomization.yaml"}
    assert on_disk == rendered


def test_the_kustomize_variants_are_the_rendered_ones() -> None:
    assert set(VARIANTS) == set(CHART_VARIANTS)
    assert {v for v, values in CHART_VARIANTS.items() if values["layout"] == "split"} == SPLIT_VARIANTS
    for variant in CHART_VARIANTS:
        assert render_manifests.settings_dir(variant).is_relative_to(SETTINGS)


def test_the_static_rendering_drops_only_what_kustomize_supplies() -> None:
    """Each install.yaml is the chart's objects less the settings ConfigMap, with the Helm labels and
    the checksum annotation gone and nothing else changed."""
    for variant, values in CHART_VARIANTS.items():
        chart = template({**values, **render_manifests.COMMON_VALUES})
        static = yaml.safe_load_all((OVERLAYS / variant / "install.yaml").read_text())
        static_objects = {object_id(o): o for o in static if o}
        chart_objects = {object_id(o): o for o in chart}
        (configmap,) = [i for i in chart_objects if i[1] == "ConfigMap"]
        assert set(chart_objects) - set(static_objects) == {configmap}
        for key, obj in chart_objects.items():
            if key == configmap:
                continue
            obj = copy.deepcopy(obj)
            for meta in (obj["metadata"], obj.get("spec", {}).get("template", {}).get("metadata", {})):
                labels = meta.get("labels") or {}
                assert labels.pop("helm.sh/chart", "volcano-job-webhook-0.1.0") == "volcano-job-webhook-0.1.0"
                assert labels.pop("app.kubernetes.io/managed-by", "Helm") == "Helm"
                annotations = meta.get("annotations")
                if annotations is not None:
                    annotations.pop("checksum/config")
                    if not annotations:
                        del meta["annotations"]
            assert canonical(obj) == canonical(static_objects[key]), f"{variant}: {describe(obj)}"
        rendered_settings = render_manifests.settings_dir(variant)
        for key, content in chart_objects[configmap]["data"].items():
            assert (rendered_settings / key).read_text() == content


# Schemas ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values", [*CHART_VARIANTS.values(), EVERY_VALUE, {**EVERY_VALUE, "layout": "sidecar", "certificates": {"mode": "self-managed"}}],
                         ids=[*CHART_VARIANTS, "every-value-split-cert-manager", "every-value-sidecar-self-managed"])
def test_every_rendering_validates(values: dict[str, Any], version: str) -> None:
    objects = template(values, release="team", namespace="ml-system")
    labelled = [*((describe(o), o) for o in objects),
                *((f"webhooks.yaml: {describe(o)}", o)
                  for o in webhook_configurations(objects, "team-volcano-job-webhook"))]
    failures = [f"{label}: {p}" for label, obj in labelled for p in schema_problems(obj, version)]
    assert failures == []
    for obj in objects:  # every namespaced object in the release's namespace, as helm install puts it, or where metrics.* say
        expected = None if obj["kind"] in CLUSTER_SCOPED else "ml-system"
        if "metrics" in values and (obj["kind"] != "ConfigMap" or obj["metadata"]["name"].endswith("-dashboard")):
            expected = MONITORING_NAMESPACES.get(obj["kind"], expected)
        assert obj["metadata"].get("namespace") == expected, describe(obj)


def test_settings_schema_covers_the_settings_the_chart_does_not_set() -> None:
    """values.schema.json's ``settings`` names every setting of webhook/config.py but those the chart
    sets itself (from other values) and the per-process flags."""
    from volcano_job_webhook.config import WebhookSettings

    chart_sets = {"service_name", "service_namespace", "tls_secret", "webhook_configurations", "registration_owner",
                  "enforcement", "ca_secret", "certs_from_secret"}
    per_process = {"host", "port", "certs_dir", "client_ca_file", "job_source", "jobs_dir", "kubeconfig", "max_job_file_bytes",
                   "health_port", "leader_elect", "lease_name", "lease_namespace"}
    fields = set(WebhookSettings.model_fields)
    assert chart_sets | per_process <= fields
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["settings"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == fields - chart_sets - per_process
    config = settings(template({"settings": EVERY_VALUE["settings"]}))
    assert chart_sets - {"ca_secret"} <= set(config)


def test_config_yaml_with_settings_is_what_the_processes_read(tmp_path: Path) -> None:
    """config.yaml of a rendering with settings loads as WebhookSettings, with those values."""
    from volcano_job_webhook.config import load_settings

    config = find_one(template({"settings": EVERY_VALUE["settings"], "enforcement": "audit"}), "ConfigMap", f"{RELEASE}-config")
    (tmp_path / "config.yaml").write_text(config["data"]["config.yaml"])
    loaded = load_settings(str(tmp_path / "config.yaml"))
    assert {k: getattr(loaded, k) for k in EVERY_VALUE["settings"]} == EVERY_VALUE["settings"]
    assert loaded.enforcement == "audit" and loaded.certs_from_secret is True and loaded.ca_secret == f"{RELEASE}-ca"


# Helm 3 says "Additional property X is not allowed", Helm 4 "'X' not allowed".
NOT_ALLOWED = r"(Additional property {0} is|'{0}') not allowed"


@pytest.mark.parametrize(("values", "complaint"), [
    ({"settings": {"service_name": "x"}}, NOT_ALLOWED.format("service_name")),
    ({"settings": {"port": 9443}}, NOT_ALLOWED.format("port")),
    ({"settings": {"enforcement": "audit"}}, NOT_ALLOWED.format("enforcement")),
    ({"settings": {"log_level": "loud"}}, "log_level"),
    ({"settings": {"workloads": ["deployments.apps"]}}, "workloads"),
    ({"enforcement": "warn"}, "enforcement"),
    ({"layout": "both"}, "layout"),
    ({"certificates": {"mode": "vault"}}, "certificates"),
    ({"image": {"digest": "latest"}}, "digest"),
    ({"webhook": {"timeoutSeconds": 31}}, "timeoutSeconds"),
    ({"replicaCount": 0}, "replicaCount"),
    ({"replicas": 2}, NOT_ALLOWED.format("replicas")),
])
def test_the_schema_refuses_what_would_not_work(values: dict[str, Any], complaint: str) -> None:
    assert re.search(complaint, refused(values))


# Each value does what it says ----------------------------------------------------------------------


def test_defaults_render_the_default_variant() -> None:
    assert canonical(template()) == canonical(template(CHART_VARIANTS["self-managed"]))
    assert not find(template(), "Namespace"), "the namespace is Helm's (--create-namespace), not the chart's"


def test_image_tag_digest_and_pull_policy() -> None:
    for values, image in (
        ({}, f"{REPOSITORY}:{APP_VERSION}"),
        ({"image": {"tag": "0.2.0"}}, f"{REPOSITORY}:0.2.0"),
        ({"image": {"repository": "registry.example.com/vjw", "tag": "0.2.0", "digest": DIGEST}}, f"registry.example.com/vjw@{DIGEST}"),
    ):
        for layout in ("sidecar", "split"):
            found = containers(template({**values, "layout": layout}))
            assert {c["image"] for c in found.values()} == {image} and set(found) == {"webhook", "reconciler"}
    found = containers(template({"image": {"pullPolicy": "Always"}, "imagePullSecrets": [{"name": "regcred"}], "layout": "split"}))
    assert {c["imagePullPolicy"] for c in found.values()} == {"Always"}
    for deployment in deployments(template({"imagePullSecrets": [{"name": "regcred"}], "layout": "split"})):
        assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert all("imagePullSecrets" not in d["spec"]["template"]["spec"] for d in deployments(template()))


def test_replicas_and_layout() -> None:
    sidecar, split = template({"replicaCount": 3}), template({"replicaCount": 3, "layout": "split"})
    assert [(d["metadata"]["name"], d["spec"]["replicas"]) for d in deployments(sidecar)] == [(RELEASE, 3)]
    assert sorted((d["metadata"]["name"], d["spec"]["replicas"]) for d in deployments(split)) == [(RELEASE, 3), (f"{RELEASE}-reconciler", 3)]
    assert [c["name"] for c in pod_spec(sidecar)["containers"]] == ["webhook", "reconciler"]
    assert [c["name"] for c in pod_spec(split)["containers"]] == ["webhook"]
    assert [c["name"] for c in pod_spec(split, f"{RELEASE}-reconciler")["containers"]] == ["reconciler"]
    assert {o["metadata"]["name"] for o in find(sidecar, "ServiceAccount")} == {RELEASE}
    assert {o["metadata"]["name"] for o in find(split, "ServiceAccount")} == {RELEASE, f"{RELEASE}-reconciler"}
    assert pod_spec(split, f"{RELEASE}-reconciler")["serviceAccountName"] == f"{RELEASE}-reconciler"


def checksums(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for d in deployments(objects)}


@pytest.mark.parametrize("change", [{"enforcement": "audit"}, {"settings": {"log_level": "debug"}},
                                    {"webhook": {"timeoutSeconds": 7}}, {"certificates": {"mode": "cert-manager"}}],
                         ids=["enforcement", "settings", "webhooks.yaml", "certificates"])
def test_a_change_of_settings_rolls_both_deployments(change: dict[str, Any]) -> None:
    """What config.yaml or webhooks.yaml say changes the checksum in both Pod templates (a rollout),
    and nothing else of the Deployments."""
    before, after = template({"layout": "split"}), template({"layout": "split", **change})
    assert settings_configmap_data(before) != settings_configmap_data(after)
    old, new = checksums(before), checksums(after)
    assert set(old) == {RELEASE, f"{RELEASE}-reconciler"} and all(old[name] != new[name] for name in old)
    for name in old:
        a, b = find_one(before, "Deployment", name), find_one(after, "Deployment", name)
        for d in (a, b):
            del d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert canonical(a) == canonical(b)
    assert checksums(template({"layout": "split", "replicaCount": 4})) == old, "a value outside the ConfigMap rolls nothing"


def settings_configmap_data(objects: list[dict[str, Any]]) -> dict[str, str]:
    return find_one(objects, "ConfigMap", f"{RELEASE}-config")["data"]


def test_enforcement_and_settings_go_into_config_yaml() -> None:
    assert settings(template())["enforcement"] == "deny"
    config = settings(template({"enforcement": "audit", "settings": {"default_plugins": {"env": []}, "namespaces": ["a", "b"]}}))
    assert (config["enforcement"], config["default_plugins"], config["namespaces"]) == ("audit", {"env": []}, ["a", "b"])
    assert set(settings(template())) == {"service_name", "service_namespace", "tls_secret", "certs_from_secret", "ca_secret",
                                         "webhook_configurations", "registration_owner", "enforcement"}


def selectors(objects: list[dict[str, Any]]) -> list[Any]:
    return [hook["namespaceSelector"] for c in webhook_configurations(objects) for hook in c["webhooks"]]


def test_namespace_selector() -> None:
    """Default: neither the release's namespace nor kube-system. Set: as written, plus the release's
    namespace excluded (the webhook must never gate its own Pods)."""
    own = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["ml-system"]}
    default = selectors(template(namespace="ml-system"))
    assert default == [{"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                              "values": ["ml-system", "kube-system"]}]}] * 4
    chosen = selectors(template({"webhook": {"namespaceSelector": {"matchLabels": {"volcano": "on"}}}}, namespace="ml-system"))
    assert chosen == [{"matchLabels": {"volcano": "on"}, "matchExpressions": [own]}] * 4
    expressions = [{"key": "tier", "operator": "In", "values": ["batch"]}]
    chosen = selectors(template({"webhook": {"namespaceSelector": {"matchExpressions": expressions}}}, namespace="ml-system"))
    assert chosen == [{"matchExpressions": [*expressions, own]}] * 4


def test_webhook_timeouts() -> None:
    configurations = {c["kind"]: c for c in webhook_configurations(template({"webhook": {"timeoutSeconds": 8, "validatingTimeoutSeconds": 2}}))}
    assert [h["timeoutSeconds"] for h in configurations["MutatingWebhookConfiguration"]["webhooks"]] == [8, 8]
    assert [h["timeoutSeconds"] for h in configurations["ValidatingWebhookConfiguration"]["webhooks"]] == [2, 2]


def test_certificates_mode() -> None:
    """self-managed: the reconciler keeps the CA Secret (config ca_secret, RBAC by name); cert-manager:
    the Issuers and Certificates, no ca_secret, the serving Secret only read."""
    mine, theirs = template(), template({"certificates": {"mode": "cert-manager"}})
    assert settings(mine)["ca_secret"] == f"{RELEASE}-ca" and "ca_secret" not in settings(theirs)
    assert not find(mine, "Issuer") and not find(mine, "Certificate")
    assert sorted(o["metadata"]["name"] for o in find(theirs, "Certificate")) == [f"{RELEASE}-ca", f"{RELEASE}-tls"]
    assert sorted(o["metadata"]["name"] for o in find(theirs, "Issuer")) == [f"{RELEASE}-ca", f"{RELEASE}-selfsigned"]
    def secret_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in find_one(objects, "Role", f"{RELEASE}-registration")["rules"] if r["resources"] == ["secrets"]]
    watched = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{RELEASE}-tls"], "verbs": ["list", "watch"]}
    assert secret_rules(mine) == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                                  {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{RELEASE}-tls", f"{RELEASE}-ca"],
                                   "verbs": ["get", "update"]}, watched]
    assert secret_rules(theirs) == [watched]
    for objects in (mine, theirs):
        assert not find(objects, "Job") and not find(objects, "CronJob")


def test_network_policy_admits_the_api_server_and_the_scrapers_only_when_asked() -> None:
    """Off by default. On: the webhook's Pods (its Deployment's selector) take connections from
    ``ingressFrom`` on the port the Service sends the API server's calls to, and from ``metricsFrom``
    on the ports the monitors scrape (the webhook's, and the reconciler's where it runs in the same
    Pods), and the reconciler's Pods on the webhook's port (it asks the Service before registering);
    on without ``ingressFrom``, helm refuses rather than shut the API server out."""
    api_server, scrapers = EVERY_VALUE["networkPolicy"]["ingressFrom"], EVERY_VALUE["networkPolicy"]["metricsFrom"]
    assert not find(template(), "NetworkPolicy") and not find(template({"layout": "split"}), "NetworkPolicy")
    for layout in ("sidecar", "split"):
        objects = template({"layout": layout, "networkPolicy": EVERY_VALUE["networkPolicy"],
                            "metrics": {"serviceMonitor": {"enabled": True}}})
        policy = find_one(objects, "NetworkPolicy", RELEASE)
        assert policy["spec"]["podSelector"] == find_one(objects, "Deployment", RELEASE)["spec"]["selector"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        ports = {p["name"]: p["containerPort"] for c in pod_spec(objects)["containers"] for p in c["ports"]}
        (service_port,) = find_one(objects, "Service", RELEASE)["spec"]["ports"]
        assert service_port["targetPort"] == ports["https"]
        scraped = [find_one(objects, "ServiceMonitor", RELEASE)["spec"]["endpoints"][0]["port"]]
        if layout == "sidecar":  # the PodMonitor scrapes the reconciler in the webhook's Pods
            scraped.append(find_one(objects, "PodMonitor", f"{RELEASE}-reconciler")["spec"]["podMetricsEndpoints"][0]["port"])
        *_, reconciler = policy["spec"]["ingress"][0]["from"]
        assert policy["spec"]["ingress"] == [
            {"from": [*api_server, reconciler], "ports": [{"port": ports["https"], "protocol": "TCP"}]},
            {"from": scrapers, "ports": [{"port": ports[name], "protocol": "TCP"} for name in scraped]}]
        (running,) = [d for d in deployments(objects) if "reconcile" in {(c.get("args") or [""])[0] for c in d["spec"]["template"]["spec"]["containers"]}]
        labels = running["spec"]["template"]["metadata"]["labels"]
        assert set(reconciler) == {"podSelector"} and reconciler["podSelector"]["matchLabels"].items() <= labels.items()
    alone = find_one(template({"networkPolicy": {"enabled": True, "ingressFrom": api_server}}), "NetworkPolicy", RELEASE)
    assert alone["spec"]["ingress"] == [{"from": [*api_server, reconciler], "ports": [{"port": 8443, "protocol": "TCP"}]}], "no scrapers: no second rule"
    assert "networkPolicy.enabled needs networkPolicy.ingressFrom" in refused({"networkPolicy": {"enabled": True}})


def test_pod_disruption_budget_values() -> None:
    assert find_one(template({"podDisruptionBudget": {"minAvailable": "50%"}}), "PodDisruptionBudget", RELEASE)["spec"]["minAvailable"] == "50%"
    assert not find(template({"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")


def test_scheduling_resources_and_annotations() -> None:
    values = {key: EVERY_VALUE[key] for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints",
                                                 "priorityClassName", "podAnnotations", "webhook", "reconciler")}
    objects = template({**values, "layout": "split"})
    for deployment in deployments(objects):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == values["nodeSelector"] and pod["tolerations"] == values["tolerations"]
        assert pod["affinity"] == values["affinity"] and pod["priorityClassName"] == values["priorityClassName"]
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod_spec(objects)["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    found = containers(objects)
    assert found["webhook"]["resources"] == values["webhook"]["resources"]
    assert found["reconciler"]["resources"] == values["reconciler"]["resources"]
    # The defaults: a preferred anti-affinity per Deployment on its own Pods, spread over zones and nodes.
    default = template({"layout": "split"})
    for deployment in deployments(default):
        pod = deployment["spec"]["template"]["spec"]
        (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"] == deployment["spec"]["selector"]
        assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(pod)
    assert [c["topologyKey"] for c in pod_spec(default)["topologySpreadConstraints"]] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]


def test_namespace_object_only_when_asked() -> None:
    made = find_one(template({"namespace": {"create": True}}, namespace="ml-system"), "Namespace", "ml-system")
    assert made["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_names_come_from_the_release() -> None:
    """Another release name and namespace: every object named after it, every reference following."""
    for release, fullname in (("team", "team-volcano-job-webhook"), ("volcano-job-webhook-prod", "volcano-job-webhook-prod")):
        objects = template({"layout": "split"}, release=release, namespace="ml-system")
        assert {o["metadata"]["name"] for o in objects} == {
            fullname, f"{fullname}-reconciler", f"{fullname}-config", f"{fullname}-leader-election", f"{fullname}-registration",
            f"{fullname}-serving-certificate"}
        config = settings(objects, fullname)
        assert (config["service_name"], config["service_namespace"], config["tls_secret"], config["ca_secret"], config["registration_owner"]) \
            == (fullname, "ml-system", f"{fullname}-tls", f"{fullname}-ca", fullname)
        for configuration in webhook_configurations(objects, fullname):
            assert configuration["metadata"]["name"] == fullname
            for hook in configuration["webhooks"]:
                assert hook["clientConfig"]["service"] == {**hook["clientConfig"]["service"], "namespace": "ml-system", "name": fullname}
        reconciler = find_one(objects, "Deployment", f"{fullname}-reconciler")["spec"]["template"]["spec"]["containers"][0]
        assert f"--lease-name={fullname}-reconciler" in reconciler["args"] and "--lease-namespace=ml-system" in reconciler["args"]
        rules = [r for o in [*find(objects, "Role"), *find(objects, "ClusterRole")] for r in o["rules"]]
        names = {n for r in rules for n in r.get("resourceNames") or []}
        assert names == {fullname, f"{fullname}-reconciler", f"{fullname}-tls", f"{fullname}-ca"}
    assert {o["metadata"]["name"] for o in template({"fullnameOverride": "vjw"}) if o["kind"] == "Deployment"} == {"vjw"}


# Against a real API server ----------------------------------------------------------------------------

# cert-manager's own CRDs are not at hand: stand-ins that serve its two kinds so the API server
# accepts them (their fields are checked by schema_problems above, as cert-manager's CRDs would).
CERT_MANAGER_KINDS = (("Issuer", "issuers"), ("Certificate", "certificates"))


def stand_in_crd(kind: str, plural: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.cert-manager.io"},
            "spec": {"group": "cert-manager.io", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def start_cluster(workdir: Path) -> EnvTest:
    assets = find_assets()
    if assets is None:
        pytest.skip(f"{ASSETS_ENV} is not set to a directory with kube-apiserver and etcd")
    helm_or_skip()
    kubectl_or_skip()
    server = EnvTest(assets, workdir, users=()).start()
    admin = server.api_client()
    for kind, plural in CERT_MANAGER_KINDS:
        create(admin, stand_in_crd(kind, plural))
    wait_until(lambda: all(_served(server, plural) for _, plural in CERT_MANAGER_KINDS), 30, "cert-manager's stand-in kinds")
    # The Prometheus Operator's own CRDs (tests/fixtures/prometheus-operator/): the monitoring objects
    # are judged by their schemas.
    prometheus_operator.install_crds(admin)
    return server


def _served(server: EnvTest, plural: str) -> bool:
    done = subprocess.run([str(kubectl_or_skip()), f"--kubeconfig={server.kubeconfig()}", "get", f"{plural}.cert-manager.io", "-A"],
                          capture_output=True, text=True, timeout=30, check=False)
    return done.returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvTest]:
    """A kube-apiserver of this module's own (its tests install cluster-scoped objects under the
    default names), with cert-manager's kinds and the Prometheus Operator's CRDs."""
    server = start_cluster(tmp_path_factory.mktemp("chart"))
    try:
        yield server
    finally:
        server.stop()


def kubectl(server: EnvTest, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([str(kubectl_or_skip()), f"--kubeconfig={server.kubeconfig()}", *args], input=stdin,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def helm(server: EnvTest, *args: str) -> str:
    return run([*args, f"--kubeconfig={server.kubeconfig()}"], timeout=300).stdout


def ensure_namespace(server: EnvTest, name: str) -> None:
    if read(server.api_client(), "v1", "Namespace", name) is None:
        create(server.api_client(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.mark.parametrize("variant", list(CHART_VARIANTS))
def test_every_variant_is_accepted_by_the_api_server(variant: str, cluster: EnvTest) -> None:
    """Server-side dry-run apply of the chart's rendering (release in a namespace of its own) and of
    the kustomize directory: the real API server's validation and defaulting accept every object."""
    namespace = f"dry-{variant}"
    ensure_namespace(cluster, namespace)
    ensure_namespace(cluster, NAMESPACE)
    out = kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-f", "-",
                  stdin=template_text(CHART_VARIANTS[variant], release=f"dry-{variant}", namespace=namespace))
    assert out.count("(server dry run)") == len(template(CHART_VARIANTS[variant], release=f"dry-{variant}", namespace=namespace))
    out = kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-k", str(VARIANTS[variant]))
    assert "(server dry run)" in out and "configmap/volcano-job-webhook-config-" in out
    # The configurations the reconciler would register, too.
    configurations = webhook_configurations(template(CHART_VARIANTS[variant], release=f"dry-{variant}", namespace=namespace), f"dry-{variant}-volcano-job-webhook")
    out = kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(configurations))
    assert out.count("(server dry run)") == 2


# What the chart can make, and what the install makes at run time (none here: no Pod runs).
RELEASE_KINDS = ("namespaces", "serviceaccounts", "configmaps", "secrets", "services", "deployments.apps", "poddisruptionbudgets.policy",
                 "clusterroles.rbac.authorization.k8s.io", "clusterrolebindings.rbac.authorization.k8s.io",
                 "roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io", "leases.coordination.k8s.io",
                 "jobs.batch", "cronjobs.batch", "issuers.cert-manager.io", "certificates.cert-manager.io",
                 "mutatingwebhookconfigurations.admissionregistration.k8s.io", "validatingwebhookconfigurations.admissionregistration.k8s.io",
                 "servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com",
                 "networkpolicies.networking.k8s.io")


def left_of(server: EnvTest, prefix: str, namespace: str) -> list[str]:
    """Every object of :data:`RELEASE_KINDS` named after ``prefix`` (cluster-wide), or in ``namespace``
    but the namespace's own ServiceAccount and root CA ConfigMap; and Helm's release records."""
    left = []
    for kind in RELEASE_KINDS:
        items = json.loads(kubectl(server, "get", kind, "-A", "-o", "json"))["items"]
        for item in items:
            meta = item["metadata"]
            name, ns = meta["name"], meta.get("namespace")
            if name.startswith(prefix) or (ns == namespace and name not in ("default", "kube-root-ca.crt")):
                left.append(f"{kind} {ns + '/' if ns else ''}{name}")
    return left


def test_the_kinds_looked_at_are_every_kind_the_chart_makes() -> None:
    made = {re.sub("y$", "ie", o["kind"].lower()) + "s" for values in (*CHART_VARIANTS.values(), EVERY_VALUE) for o in template(values)}
    assert made <= {k.split(".")[0] for k in RELEASE_KINDS}


def test_helm_install_upgrade_and_uninstall_need_no_other_step(cluster: EnvTest) -> None:
    """helm install, upgrade (a setting and the image; then the layout) and uninstall against the real
    API server, each on its own; after the uninstall nothing of the release is left."""
    release, namespace = "vjw", "helm-install"
    fullname = f"{release}-volcano-job-webhook"
    api = cluster.api_client()
    helm(cluster, "install", release, str(CHART), "-n", namespace, "--create-namespace", "--set", "image.repository=registry.example.com/vjw")
    deployment = read(api, "apps/v1", "Deployment", fullname, namespace)
    assert deployment is not None
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"registry.example.com/vjw:{APP_VERSION}"
    first_checksum = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    configmap = read(api, "v1", "ConfigMap", f"{fullname}-config", namespace)
    assert configmap is not None and yaml.safe_load(configmap["data"]["config.yaml"])["enforcement"] == "deny"

    helm(cluster, "upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "enforcement=audit", "--set", "image.tag=0.1.1")
    deployment = read(api, "apps/v1", "Deployment", fullname, namespace)
    assert deployment is not None
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/vjw:0.1.1"
    assert {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} == {"registry.example.com/vjw:0.1.1"}
    assert deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != first_checksum, "both processes roll"
    configmap = read(api, "v1", "ConfigMap", f"{fullname}-config", namespace)
    assert configmap is not None and yaml.safe_load(configmap["data"]["config.yaml"])["enforcement"] == "audit"

    helm(cluster, "upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "layout=split")
    reconciler = read(api, "apps/v1", "Deployment", f"{fullname}-reconciler", namespace)
    assert reconciler is not None and reconciler["spec"]["template"]["spec"]["serviceAccountName"] == f"{fullname}-reconciler"
    deployment = read(api, "apps/v1", "Deployment", fullname, namespace)
    assert deployment is not None and [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["webhook"]
    history = json.loads(helm(cluster, "history", release, "-n", namespace, "-o", "json"))
    assert [h["status"] for h in history] == ["superseded", "superseded", "deployed"]

    helm(cluster, "uninstall", release, "-n", namespace)
    assert left_of(cluster, fullname, namespace) == []
    assert read(api, "v1", "Namespace", namespace) is not None, "the namespace is Helm's --create-namespace, left to the user"


@pytest.mark.parametrize("variant", list(CHART_VARIANTS))
def test_monitoring_objects_are_accepted_by_the_api_server(variant: str, cluster: EnvTest) -> None:
    """With the Prometheus Operator's CRDs installed, every variant's rendering with all monitoring on
    (the ServiceMonitor, PodMonitor and PrometheusRule, and the dashboard's ConfigMap), and the
    NetworkPolicy, passes a server-side dry-run apply: the CRDs' schemas, strict field validation."""
    release, namespace = f"mon-{variant}", f"mon-{variant}"
    ensure_namespace(cluster, namespace)
    values = {**CHART_VARIANTS[variant], "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                                                     "dashboard": {"enabled": True}},
              "networkPolicy": EVERY_VALUE["networkPolicy"]}
    objects = template(values, release=release, namespace=namespace)
    assert {o["kind"] for o in objects} >= {"ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy"}
    out = kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=template_text(values, release=release, namespace=namespace))
    assert out.count("(server dry run)") == len(objects)
    for kind in ("servicemonitor", "podmonitor", "prometheusrule"):
        assert f"{kind}.monitoring.coreos.com/{release}" in out, out


def test_helm_install_and_uninstall_with_monitoring(cluster: EnvTest) -> None:
    """helm install with the monitoring on, its objects elsewhere, and the NetworkPolicy: made where the
    values say; helm uninstall leaves nothing."""
    release, namespace = "vjw-mon", "helm-monitoring"
    fullname = f"{release}-volcano-job-webhook"
    for name in (namespace, "monitoring"):
        ensure_namespace(cluster, name)
    helm(cluster, "install", release, str(CHART), "-n", namespace, "--set", "layout=split",
         "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
         "--set", "metrics.dashboard.enabled=true", "--set", "metrics.prometheusRule.namespace=monitoring",
         "--set", "metrics.serviceMonitor.labels.release=kps",
         "--set", "networkPolicy.enabled=true", "--set-json", f"networkPolicy.ingressFrom={json.dumps(EVERY_VALUE['networkPolicy']['ingressFrom'])}")
    api = cluster.api_client()
    policy = read(api, "networking.k8s.io/v1", "NetworkPolicy", fullname, namespace)
    assert policy is not None and policy["spec"]["ingress"][0]["from"][:-1] == EVERY_VALUE["networkPolicy"]["ingressFrom"]
    monitor = read(api, "monitoring.coreos.com/v1", "ServiceMonitor", fullname, namespace)
    assert monitor is not None and monitor["metadata"]["labels"]["release"] == "kps"
    assert read(api, "monitoring.coreos.com/v1", "PodMonitor", f"{fullname}-reconciler", namespace) is not None
    assert read(api, "monitoring.coreos.com/v1", "PrometheusRule", fullname, "monitoring") is not None
    dashboard = read(api, "v1", "ConfigMap", f"{fullname}-dashboard", namespace)
    assert dashboard is not None and dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    helm(cluster, "uninstall", release, "-n", namespace)
    assert left_of(cluster, fullname, namespace) == []


def test_helm_install_and_uninstall_with_cert_manager_split(cluster: EnvTest) -> None:
    release, namespace = "vjw-cm", "helm-cert-manager"
    fullname = f"{release}-volcano-job-webhook"
    ensure_namespace(cluster, namespace)
    helm(cluster, "install", release, str(CHART), "-n", namespace, "--set", "certificates.mode=cert-manager", "--set", "layout=split")
    api = cluster.api_client()
    assert read(api, "cert-manager.io/v1", "Certificate", f"{fullname}-tls", namespace) is not None
    assert read(api, "apps/v1", "Deployment", f"{fullname}-reconciler", namespace) is not None
    helm(cluster, "uninstall", release, "-n", namespace)
    assert left_of(cluster, fullname, namespace) == []


def test_kubectl_apply_and_delete_the_manifests(tmp_path: Path) -> None:
    """`kubectl apply -k manifests`, again (nothing to do), then `kubectl delete -k manifests`: with the
    namespace controller and garbage collector running, nothing of the install is left."""
    server = start_cluster(tmp_path / "apiserver")
    try:
        with controller_manager(server, tmp_path, ("namespace-controller", "garbage-collector-controller")):
            out = kubectl(server, "apply", "-k", str(MANIFESTS))
            assert "deployment.apps/volcano-job-webhook created" in out
            api = server.api_client()
            before = read(api, "apps/v1", "Deployment", "volcano-job-webhook", NAMESPACE)
            # Again: nothing new, no rollout (kubectl reports a PodDisruptionBudget "configured" every
            # time, its selector being patched whole, with no change).
            out = kubectl(server, "apply", "-k", str(MANIFESTS))
            assert "created" not in out, out
            after = read(api, "apps/v1", "Deployment", "volcano-job-webhook", NAMESPACE)
            assert before is not None and after is not None
            assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
            kubectl(server, "delete", "-k", str(MANIFESTS), "--wait=false")
            wait_until(lambda: read(api, "v1", "Namespace", NAMESPACE) is None, 60, "the namespace deleted")
            assert left_of(server, "volcano-job-webhook", NAMESPACE) == []
    finally:
        server.stop()
