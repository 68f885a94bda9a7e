"""The install manifests (``manifests/``), the image (``Dockerfile``, ``.dockerignore``) and their contract.

``manifests/`` is rendered from the Helm chart (tests/helpers/render_manifests.py; tests/apiserver/test_chart.py checks
they agree and tests the chart's values): what is asserted here of each kustomize variant holds of the
chart's rendering with the same values. Every object is checked against the Kubernetes OpenAPI schema
(kubernetes-validate, strict, for the oldest supported Kubernetes, 1.30, and the newest the package
knows), each kustomize variant is rendered by kubectl's built-in kustomize (``tests/helpers/kustomize.py``; the
tests that need it skip without kubectl), and the parts that must agree — Service and Deployment,
webhook registrations (``webhooks.yaml`` of the settings ConfigMap) and Service, certificate and
Secret, flags and CLI, settings and the code's settings, RBAC and the code's API calls — are checked
against each other.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.jobs import volcano_job
from tests.helpers.kustomize import (
    DEFAULT_VARIANT,
    MANIFESTS,
    OVERLAYS,
    ROOT,
    SETTINGS,
    SPLIT_VARIANTS,
    VARIANTS,
    build,
    build_variant,
    find_kubectl,
)
from tests.helpers.manifests_util import (
    CLUSTER_SCOPED,
    CONFIG_ENV,
    K8S_VERSIONS,
    NAMESPACE,
    RECONCILER_SERVICE_ACCOUNT,
    SERVICE_ACCOUNT,
    SETTINGS_CONFIGMAP,
    SETTINGS_DIR,
    Grant,
    canonical,
    cert_manager_problems,
    describe,
    dockerfile_instructions,
    dockerignore_excludes,
    find,
    find_one,
    load_documents,
    object_id,
    rbac_grants,
    rbac_permissions,
    rule_matches,
    schema_problems,
    selector_matches,
    settings,
    settings_configmap,
    webhook_configurations,
)

IMAGE = "ghcr.io/volcano-job-webhook/volcano-job-webhook:0.1.0"
CERTS_SECRET = "volcano-job-webhook-tls"
CA_SECRET = "volcano-job-webhook-ca"
UID = 65532
ALL_VARIANTS = [*VARIANTS, "default"]

WEBHOOK_ARGS = ["serve", "--port=8443", "--job-source=kube"]
RECONCILER_ARGS = [
    "reconcile", "--health-port=8081", "--leader-elect",
    "--lease-name=volcano-job-webhook-reconciler", "--lease-namespace=volcano-job-webhook",
]
WEBHOOK_CONFIGURATIONS = "volcano-job-webhook"  # the name of both


def self_managed(variant: str) -> bool:
    """Whether the reconciler makes the certificates (else cert-manager does)."""
    return not variant.startswith("cert-manager")


# The API calls the code makes (the product's contract); RBAC must grant exactly these.
# The reconciler's caches list and watch; it creates (POST), reads what a create found, patches
# (server-side apply, merge patch) and deletes.
OWNED_VERBS = ("get", "list", "watch", "create", "patch", "delete")
JOB_PERMISSIONS = {
    *(("batch.volcano.sh", "jobs", v) for v in ("get", "list", "watch")),
    ("batch.volcano.sh", "jobs/finalizers", "update"),
    *(("", r, v) for r in ("configmaps", "services", "secrets") for v in OWNED_VERBS),
    *(("networking.k8s.io", "networkpolicies", v) for v in OWNED_VERBS),
    *(("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")),
    ("", "events", "create"),
    # Opted-in Indexed Jobs and JobSets (docs/workloads.md): the webhook GETs them, the reconciler
    # caches them; their finalizers as for Volcano Jobs (blockOwnerDeletion).
    *((group, resource, v) for group, resource in (("batch", "jobs"), ("jobset.x-k8s.io", "jobsets")) for v in ("get", "list", "watch")),
    ("batch", "jobs/finalizers", "update"),
    ("jobset.x-k8s.io", "jobsets/finalizers", "update"),
}
# The webhook registration (the reconciler, leader only; webhook/reconciler/registration.py), woken
# by watches (list, watch) of what it reads, each by name: the two configurations, server-side
# applied (a patch; the first one creates), their owner ClusterRole (for its uid), the serving
# Secret (its ca.crt is the caBundle), the Service's EndpointSlices (a Ready webhook Pod?) and the
# Service (its cluster IP, asked before registering). With
# self-managed certificates it also makes the serving and CA Secrets and renews them in place
# (certs.cluster.sync: get, create, update).
REGISTRATION_PERMISSIONS = {
    *(("admissionregistration.k8s.io", r, v) for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
      for v in ("create", "list", "watch", "patch")),
    *(("rbac.authorization.k8s.io", "clusterroles", v) for v in ("list", "watch")),
    *(("discovery.k8s.io", "endpointslices", v) for v in ("list", "watch")),
    *(("", r, v) for r in ("secrets", "services") for v in ("list", "watch")),
}
CERTIFICATE_PERMISSIONS = {("", "secrets", v) for v in ("get", "create", "update")}
# ... each narrowed to what it needs: by name, or to the install's namespace.
REGISTRATION_GRANTS = {
    *(Grant(None, "admissionregistration.k8s.io", r, "create", frozenset())
      for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")),
    *(Grant(None, "admissionregistration.k8s.io", r, v, frozenset({WEBHOOK_CONFIGURATIONS}))
      for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations") for v in ("list", "watch", "patch")),
    *(Grant(None, "rbac.authorization.k8s.io", "clusterroles", v, frozenset({"volcano-job-webhook"})) for v in ("list", "watch")),
    *(Grant(NAMESPACE, "discovery.k8s.io", "endpointslices", v, frozenset()) for v in ("list", "watch")),
    *(Grant(NAMESPACE, "", "secrets", v, frozenset({CERTS_SECRET})) for v in ("list", "watch")),
    *(Grant(NAMESPACE, "", "services", v, frozenset({"volcano-job-webhook"})) for v in ("list", "watch")),
}
SERVING_SECRET_GRANTS = {Grant(NAMESPACE, "", "secrets", v, frozenset({CERTS_SECRET})) for v in ("list", "watch")}
CERTIFICATE_GRANTS = {
    Grant(NAMESPACE, "", "secrets", "create", frozenset()),
    *(Grant(NAMESPACE, "", "secrets", v, frozenset({CERTS_SECRET, CA_SECRET})) for v in ("get", "update")),
}


def narrowed(grants: list[Grant]) -> set[Grant]:
    """The grants of the registration and the certificates: in the install's namespace or by name
    (the Lease's apart), and the create of a webhook configuration (which no name can narrow)."""
    return {g for g in grants if g.resource != "leases" and (g.namespace or g.resource_names or g.api_group == "admissionregistration.k8s.io")}


def registration_grants(variant: str) -> set[Grant]:
    """What the reconciler's identity is granted by name or in the install's namespace."""
    return REGISTRATION_GRANTS | (CERTIFICATE_GRANTS if self_managed(variant) else set())


# The webhook alone (`serve --job-source=kube`): its Job cache and the GET of a Job not cached yet,
# and of an opted-in workload (never cached); the watch of its serving certificate (certs_from_secret).
EXPECTED_WEBHOOK_ONLY_PERMISSIONS = {("batch.volcano.sh", "jobs", v) for v in ("get", "list", "watch")} | {
    ("batch", "jobs", "get"), ("jobset.x-k8s.io", "jobsets", "get"), ("", "secrets", "list"), ("", "secrets", "watch")}


def expected_permissions(variant: str, process: str = "both") -> set[tuple[str, str, str]]:
    """The (group, resource, verb) triples of ``process`` (both, webhook, reconciler) in ``variant``."""
    if process == "webhook":
        return EXPECTED_WEBHOOK_ONLY_PERMISSIONS
    both = JOB_PERMISSIONS | REGISTRATION_PERMISSIONS | (CERTIFICATE_PERMISSIONS if self_managed(variant) else set())
    # The reconciler alone: all the rest; its caches list and watch, it never GETs a job.
    return both - {("batch.volcano.sh", "jobs", "get"), ("batch", "jobs", "get"), ("jobset.x-k8s.io", "jobsets", "get")} \
        if process == "reconciler" else both


@pytest.fixture(scope="module")
def variants() -> dict[str, list[dict[str, Any]]]:
    return {name: build_variant(name) for name in ALL_VARIANTS}


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    """The default variant (``kubectl apply -k manifests``), where one install's contract is read."""
    return build_variant("default")


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(description, Pod template spec) of every workload."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "DaemonSet", "StatefulSet"):
            yield describe(obj), obj["spec"]["template"]["spec"]
        elif obj["kind"] == "CronJob":
            yield describe(obj), obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def containers(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    deployment = find_one(objects, "Deployment", "volcano-job-webhook")
    (hit,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return hit


# Kustomize structure ------------------------------------------------------------------------------


# What the checks below read of a kustomization; another field (a patch, say) would slip past the
# file-usage check, so it fails here until they read it too. There are no patches: each variant is
# the chart rendered with its values, not a base patched.
KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "namespace", "resources", "components", "configMapGenerator"})


def kustomization(directory: Path) -> dict[str, Any]:
    (doc,) = load_documents(directory / "kustomization.yaml")
    return doc


def kustomization_dirs(*, components: bool = True) -> list[Path]:
    """Every directory with a kustomization.yaml; ``components=False`` leaves out Components."""
    dirs = sorted(p.parent for p in MANIFESTS.rglob("kustomization.yaml"))
    return dirs if components else [d for d in dirs if kustomization(d)["kind"] != "Component"]


def generator_files(directory: Path) -> list[Path]:
    """The files the configMapGenerators of a kustomization read (``files:`` entries, ``key=path`` too)."""
    return [directory / entry.rpartition("=")[2]
            for generator in kustomization(directory).get("configMapGenerator") or [] for entry in generator.get("files") or []]


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda p: str(p.relative_to(MANIFESTS)) or ".")
def test_kustomizations_use_only_the_fields_read_here(directory: Path) -> None:
    assert set(kustomization(directory)) <= KUSTOMIZATION_FIELDS


@pytest.mark.parametrize("directory", kustomization_dirs(components=False), ids=lambda p: str(p.relative_to(MANIFESTS)) or ".")
def test_kustomization_builds(directory: Path) -> None:
    """kubectl renders it (a missing file fails here)."""
    objects = build(directory)
    assert objects and len({object_id(o) for o in objects}) == len(objects)


def test_kustomizations_list_every_manifest_file() -> None:
    """No YAML file in manifests/ is left out of every kustomization (it would silently not apply)."""
    used: set[Path] = set()
    for directory in kustomization_dirs():
        used |= {(directory / e).resolve() for e in kustomization(directory).get("resources") or [] if (directory / e).is_file()}
        used |= {f.resolve() for f in generator_files(directory)}
    files = {p.resolve() for p in MANIFESTS.rglob("*.y*ml") if p.name != "kustomization.yaml"}
    assert files - used == set()
    for mode in ("self-managed", "cert-manager"):
        assert {f.relative_to(SETTINGS).as_posix() for f in generator_files(SETTINGS / mode)} == {f"{mode}/config.yaml", f"{mode}/webhooks.yaml"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_is_one_rendered_file_and_the_shared_settings(variant: str) -> None:
    """The load restrictor allows a kustomization files of its own directory only: each variant holds
    its rendering, and includes the settings as a Component (a kustomization directory)."""
    k = kustomization(VARIANTS[variant])
    assert k["resources"] == ["install.yaml"]
    mode = "self-managed" if self_managed(variant) else "cert-manager"
    assert [(VARIANTS[variant] / c).resolve() for c in k["components"]] == [(SETTINGS / mode).resolve()]
    assert sorted(p.name for p in VARIANTS[variant].iterdir()) == ["install.yaml", "kustomization.yaml"]
    assert kustomization(MANIFESTS)["resources"] == [VARIANTS[DEFAULT_VARIANT].relative_to(MANIFESTS).as_posix()]


def test_namespaced_objects_name_the_namespace_themselves() -> None:
    """The namespace transformer changes nothing: the files read on their own (kubectl apply -f)
    mean what the build means."""
    for directory in kustomization_dirs(components=False):
        if directory != MANIFESTS:
            assert kustomization(directory).get("namespace") == NAMESPACE, directory
    for mode in ("self-managed", "cert-manager"):
        (generator,) = kustomization(SETTINGS / mode)["configMapGenerator"]
        assert (generator["name"], generator["namespace"]) == (SETTINGS_CONFIGMAP, NAMESPACE)
    for label, doc in all_resource_documents():
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == NAMESPACE, label
        else:
            assert "namespace" not in doc["metadata"], label


def test_default_variant_is_self_managed(variants: dict[str, list[dict[str, Any]]]) -> None:
    assert DEFAULT_VARIANT == "self-managed"
    assert sorted(map(canonical, variants["default"])) == sorted(map(canonical, variants["self-managed"]))


# What every variant installs, whatever makes the certificate and however the processes are laid out.
EVERY_VARIANTS_OBJECTS = {
    ("", "Namespace", "", NAMESPACE),
    ("", "ServiceAccount", NAMESPACE, SERVICE_ACCOUNT),
    ("rbac.authorization.k8s.io", "ClusterRole", "", "volcano-job-webhook"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding", "", "volcano-job-webhook"),
    ("rbac.authorization.k8s.io", "Role", NAMESPACE, "volcano-job-webhook-leader-election"),
    ("rbac.authorization.k8s.io", "RoleBinding", NAMESPACE, "volcano-job-webhook-leader-election"),
    ("rbac.authorization.k8s.io", "ClusterRole", "", "volcano-job-webhook-registration"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding", "", "volcano-job-webhook-registration"),
    ("rbac.authorization.k8s.io", "Role", NAMESPACE, "volcano-job-webhook-registration"),
    ("rbac.authorization.k8s.io", "RoleBinding", NAMESPACE, "volcano-job-webhook-registration"),
    ("", "Service", NAMESPACE, "volcano-job-webhook"),
    ("apps", "Deployment", NAMESPACE, "volcano-job-webhook"),
    ("policy", "PodDisruptionBudget", NAMESPACE, "volcano-job-webhook"),
}


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_variant_installs_the_common_objects(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    ids = {object_id(o) for o in variants[variant]}
    assert ids >= EVERY_VARIANTS_OBJECTS
    (configmap,) = [o for o in variants[variant] if o["kind"] == "ConfigMap"]
    assert configmap == settings_configmap(variants[variant])
    assert configmap["metadata"]["name"].startswith(f"{SETTINGS_CONFIGMAP}-"), "the generator's hash suffix"
    # No webhook configuration among the objects: the reconciler registers them (webhooks.yaml).
    assert not find(variants[variant], "MutatingWebhookConfiguration") and not find(variants[variant], "ValidatingWebhookConfiguration")


# Schema validation --------------------------------------------------------------------------------


def all_resource_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for directory in kustomization_dirs():
        for entry in kustomization(directory).get("resources") or []:
            path = directory / entry
            if path.is_file():
                for doc in load_documents(path):
                    yield f"{path.relative_to(ROOT)}: {describe(doc)}", doc


def registered_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """The webhook configurations of manifests/settings/*/webhooks.yaml, as the reconciler registers them."""
    for path in sorted(SETTINGS.glob("*/webhooks.yaml")):
        (configurations,) = load_documents(path)
        for obj in configurations:
            yield f"{path.relative_to(ROOT)}: {describe(obj)}", obj


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(version: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """Every document in manifests/ as written, the webhook configurations the reconciler registers,
    and every object of every built variant, strictly."""
    labelled = [
        *all_resource_documents(),
        *registered_documents(),
        *((f"{v}: {describe(o)}", o) for v, objs in variants.items() for o in objs),
        *((f"{v}: webhooks.yaml: {describe(o)}", o) for v, objs in variants.items() for o in webhook_configurations(objs)),
    ]
    assert sum(1 for _ in registered_documents()) == 4
    checked: dict[str, list[str]] = {}
    failures = []
    for label, obj in labelled:
        key = canonical(obj)
        if key not in checked:
            checked[key] = schema_problems(obj, version)
        failures += [f"{label}: {p}" for p in checked[key]]
    assert not failures, "\n".join(failures)
    assert len(checked) >= 20


def test_schema_check_catches_mistakes() -> None:
    """The strict check is not vacuous: a misspelt field, a missing field, and a cert-manager slip fail."""
    deployment = find_one(build_variant(DEFAULT_VARIANT), "Deployment", "volcano-job-webhook")
    deployment["spec"]["replica"] = 2
    assert schema_problems(deployment, "1.30") == ["spec: Additional properties are not allowed ('replica' was unexpected)"]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"name": "p"}]}}
    assert schema_problems(service, "1.30") == ["spec.ports.0: 'port' is a required property"]
    certificate = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                   "metadata": {"name": "x", "namespace": "y"}, "spec": {"secretName": "s", "issuerRef": {"name": "i"}}}
    assert cert_manager_problems(certificate) == ["spec.dnsNames is required (or isCA with a commonName)"]
    issuer = {"apiVersion": "cert-manager.io/v1alpha2", "kind": "Issuer", "metadata": {"name": "x", "namespace": "y"}, "spec": {"selfSigned": {}}}
    assert cert_manager_problems(issuer) == ["apiVersion 'cert-manager.io/v1alpha2', want cert-manager.io/v1"]


# Webhook registrations ----------------------------------------------------------------------------


def mutating(objects: list[dict[str, Any]], name: str = "pods.volcano-job-webhook.io") -> dict[str, Any]:
    """An entry of the MutatingWebhookConfiguration the reconciler registers (webhooks.yaml of the
    variant's settings ConfigMap)."""
    webhooks = find_one(webhook_configurations(objects), "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATIONS)["webhooks"]
    assert [w["name"] for w in webhooks] == ["pods.volcano-job-webhook.io", "workloads.volcano-job-webhook.io"]
    (webhook,) = [w for w in webhooks if w["name"] == name]
    return webhook


def validating(objects: list[dict[str, Any]], name: str = "jobs.volcano-job-webhook.io") -> dict[str, Any]:
    webhooks = find_one(webhook_configurations(objects), "ValidatingWebhookConfiguration", WEBHOOK_CONFIGURATIONS)["webhooks"]
    assert [w["name"] for w in webhooks] == ["jobs.volcano-job-webhook.io", "workloads.volcano-job-webhook.io"]
    (webhook,) = [w for w in webhooks if w["name"] == name]
    return webhook


EXCLUDED_NAMESPACES = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE, "kube-system"]}


def test_mutating_webhook_contract(default: list[dict[str, Any]]) -> None:
    webhook = mutating(default)
    assert webhook["name"] == "pods.volcano-job-webhook.io"
    assert webhook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods"], "scope": "Namespaced"}]
    assert webhook["objectSelector"] == {"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]}
    assert webhook["namespaceSelector"] == {"matchExpressions": [EXCLUDED_NAMESPACES]}
    assert webhook["clientConfig"] == {"service": {"namespace": NAMESPACE, "name": "volcano-job-webhook", "path": "/mutate", "port": 443}}
    assert webhook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["timeoutSeconds"] == 5


def test_validating_webhook_contract(default: list[dict[str, Any]]) -> None:
    webhook = validating(default)
    assert webhook["name"] == "jobs.volcano-job-webhook.io"
    assert webhook["rules"] == [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["batch.volcano.sh"],
                                 "apiVersions": ["v1alpha1"], "resources": ["jobs"], "scope": "Namespaced"}]
    assert "objectSelector" not in webhook
    assert webhook["namespaceSelector"] == {"matchExpressions": [EXCLUDED_NAMESPACES]}
    assert webhook["clientConfig"] == {"service": {"namespace": NAMESPACE, "name": "volcano-job-webhook", "path": "/validate", "port": 443}}
    assert webhook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["failurePolicy"] == "Ignore"
    assert 1 <= webhook["timeoutSeconds"] <= 5


def test_mutating_timeout_outlasts_a_job_cache_miss(default: list[dict[str, Any]]) -> None:
    """On a cache miss the webhook GETs the Job with its own timeout; the API server must wait longer
    than that, or a slow GET turns into a failed (and, with Fail, refused) Pod creation."""
    from volcano_job_webhook.server.jobs.kube import KubeJobSource

    get_timeout = inspect.signature(KubeJobSource).parameters["get_timeout"].default
    assert get_timeout + 2 <= mutating(default)["timeoutSeconds"] < 10


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_ca_bundle_is_left_to_the_reconciler(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """No caBundle in webhooks.yaml: the reconciler sets ca.crt of the serving Secret, which
    cert-manager or the reconciler itself write, and keeps it current."""
    for configuration in webhook_configurations(variants[variant]):
        for webhook in configuration["webhooks"]:
            assert "caBundle" not in webhook["clientConfig"], webhook["name"]
    assert settings(variants[variant])["tls_secret"] == CERTS_SECRET


def namespace_object(name: str) -> dict[str, Any]:
    """A Namespace as the API server stores it (the name label is set by the API server since 1.22)."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}


def calls_webhook(webhook: Mapping[str, Any], obj: Mapping[str, Any], namespace: Mapping[str, Any], *,
                  group: str, version: str, resource: str, operation: str) -> bool:
    """Whether the API server sends this request to the webhook: rules, then namespace and object selectors."""
    return (
        rule_matches(webhook["rules"], group=group, version=version, resource=resource, operation=operation)
        and selector_matches(webhook.get("namespaceSelector"), namespace["metadata"].get("labels"))
        and selector_matches(webhook.get("objectSelector"), obj["metadata"].get("labels"))
    )


def volcano_pod(namespace: str = "default") -> dict[str, Any]:
    """A Pod as Volcano's job controller creates it (createJobPod's labels)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pytorch-demo-worker-0",
            "namespace": namespace,
            "labels": {
                "volcano.sh/job-name": "pytorch-demo",
                "volcano.sh/task-spec": "worker",
                "volcano.sh/task-index": "0",
                "volcano.sh/job-namespace": namespace,
                "volcano.sh/queue-name": "default",
            },
        },
        "spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch"}]},
    }


def pod_request(webhook: Mapping[str, Any], pod: Mapping[str, Any], operation: str = "CREATE") -> bool:
    return calls_webhook(webhook, pod, namespace_object(pod["metadata"]["namespace"]),
                         group="", version="v1", resource="pods", operation=operation)


def test_mutating_webhook_selects_pods_of_volcano_jobs(default: list[dict[str, Any]]) -> None:
    webhook = mutating(default)
    assert pod_request(webhook, volcano_pod("default"))
    assert pod_request(webhook, volcano_pod("team-a"))


def test_mutating_webhook_selects_pods_made_from_the_example_jobs(default: list[dict[str, Any]]) -> None:
    """The same, with the Pods the project's own model of Volcano's controller builds."""
    from volcano_job_webhook.documents import load_object
    from volcano_job_webhook.plugins import Job
    from volcano_job_webhook.plugins.podgen import make_pod

    webhook = mutating(default)
    jobs = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))
    assert jobs
    for path in jobs:
        job = Job.from_object(load_object(str(path), "Job"))
        for task in job.raw["spec"]["tasks"]:
            assert pod_request(webhook, make_pod(job, task["name"], 0)), f"{path.name} {task['name']}"


def test_mutating_webhook_leaves_other_pods_alone(default: list[dict[str, Any]]) -> None:
    webhook = mutating(default)
    plain = volcano_pod()
    plain["metadata"]["labels"] = {"app": "web"}
    assert not pod_request(webhook, plain)
    unlabelled = volcano_pod()
    del unlabelled["metadata"]["labels"]
    assert not pod_request(webhook, unlabelled)
    almost = volcano_pod()
    del almost["metadata"]["labels"]["volcano.sh/job-name"]  # the other Volcano labels are not enough
    assert not pod_request(webhook, almost)
    for namespace in (NAMESPACE, "kube-system"):
        assert not pod_request(webhook, volcano_pod(namespace)), namespace
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        assert not pod_request(webhook, volcano_pod(), operation), operation


def test_validating_webhook_selects_volcano_jobs(default: list[dict[str, Any]]) -> None:
    webhook = validating(default)
    job = volcano_job("j")

    def request(namespace: str, operation: str, group: str = "batch.volcano.sh", resource: str = "jobs") -> bool:
        return calls_webhook(webhook, job, namespace_object(namespace), group=group, version="v1alpha1",
                             resource=resource, operation=operation)

    assert request("default", "CREATE") and request("default", "UPDATE")
    assert not request("default", "DELETE")
    assert not request("kube-system", "CREATE") and not request(NAMESPACE, "CREATE")
    assert not request("default", "CREATE", group="batch")  # Kubernetes' own Jobs
    assert not request("default", "CREATE", resource="jobs/status")


def test_selector_semantics() -> None:
    """The matcher follows Kubernetes: NotIn and DoesNotExist match an absent key, empty matches all."""
    labels = {"a": "1", "b": "2"}
    assert selector_matches(None, labels) and selector_matches({}, {})
    assert selector_matches({"matchLabels": {"a": "1"}}, labels)
    assert not selector_matches({"matchLabels": {"a": "2"}}, labels)
    assert selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["0", "1"]}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "c", "operator": "In", "values": ["1"]}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["1"]}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "z", "operator": "Exists"}]}, labels)
    with pytest.raises(ValueError, match=r"^a In: values must be non-empty$"):
        selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, labels)
    with pytest.raises(ValueError, match=r"^a Exists: values must be empty$"):
        selector_matches({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]}, labels)


# Service, Deployment, certificates ----------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_webhooks_reach_the_webhook_container(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """clientConfig → Service port → targetPort → the webhook container's HTTPS port, and the
    Service selects the Deployment's Pods and nothing else (not the reconciler's)."""
    objects = variants[variant]
    deployment = find_one(objects, "Deployment", "volcano-job-webhook")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for webhook in (mutating(objects), validating(objects)):
        ref = webhook["clientConfig"]["service"]
        service = find_one(objects, "Service", ref["name"])
        assert service["metadata"]["namespace"] == ref["namespace"] == NAMESPACE
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
        assert port == {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels)
    assert selector_matches(deployment["spec"]["selector"], pod_labels)
    assert {"name": "https", "containerPort": 8443, "protocol": "TCP"} in container(objects, "webhook")["ports"]
    for label, template in other_pod_templates(objects):
        assert not selector_matches({"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"]), label


def other_pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Pod templates of every workload but the webhook's Deployment."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job") and describe(obj) != describe(find_one(objects, "Deployment", "volcano-job-webhook")):
            yield describe(obj), obj["spec"]["template"]
        elif obj["kind"] == "CronJob":
            yield describe(obj), obj["spec"]["jobTemplate"]["spec"]["template"]


def test_deployment_contract(default: list[dict[str, Any]]) -> None:
    deployment = find_one(default, "Deployment", "volcano-job-webhook")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "volcano-job-webhook"
    assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "volcano-job-webhook"
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert [c["name"] for c in pod["containers"]] == ["webhook", "reconciler"]
    assert container(default, "webhook")["args"] == WEBHOOK_ARGS
    assert container(default, "reconciler")["args"] == RECONCILER_ARGS
    assert "priorityClassName" not in pod  # system-cluster-critical is refused outside kube-system on some clusters
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in anti] == ["kubernetes.io/hostname"]
    assert selector_matches(anti[0]["podAffinityTerm"]["labelSelector"], spec["template"]["metadata"]["labels"])
    spread = pod["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for constraint in spread:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert selector_matches(constraint["labelSelector"], spec["template"]["metadata"]["labels"])


def test_pod_disruption_budget(default: list[dict[str, Any]]) -> None:
    pdb = find_one(default, "PodDisruptionBudget", "volcano-job-webhook")
    deployment = find_one(default, "Deployment", "volcano-job-webhook")
    assert pdb["spec"]["minAvailable"] == 1 < deployment["spec"]["replicas"]
    assert selector_matches(pdb["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_serve_reads_its_certificate_from_the_secret(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """No Secret volume a Pod would wait for in ContainerCreating: serve watches the serving Secret
    through the API (certs_from_secret)."""
    objects = variants[variant]
    webhook = container(objects, "webhook")
    assert webhook["args"] == WEBHOOK_ARGS
    config = settings(objects)
    assert config["certs_from_secret"] is True and config["tls_secret"] == CERTS_SECRET
    for label, pod in pod_specs(objects):
        assert not [v for v in pod.get("volumes", []) if "secret" in v], label


def test_reconciler_leader_election_wiring(default: list[dict[str, Any]]) -> None:
    reconciler = container(default, "reconciler")
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in reconciler["env"] if "valueFrom" in e}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    flags = dict(a.removeprefix("--").split("=", 1) for a in reconciler["args"] if "=" in a)
    assert flags["lease-namespace"] == find_one(default, "Deployment", "volcano-job-webhook")["metadata"]["namespace"]
    leases = [g for g in rbac_grants(default) if g.resource == "leases"]
    assert {g.namespace for g in leases} == {NAMESPACE}
    assert all(flags["lease-name"] in g.resource_names for g in leases if g.verb != "create")


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_both_processes_read_the_settings_configmap(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """Every container of both processes mounts the settings ConfigMap read-only and is pointed at its
    config.yaml; config.yaml names this install's Service, Secret and ClusterRole, and the file of
    configurations in the mount."""
    objects = variants[variant]
    configmap = settings_configmap(objects)
    checked = set()
    for deployment in find(objects, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == SETTINGS_DIR]
            assert mount["readOnly"] is True and volumes[mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"]
            assert {"name": CONFIG_ENV, "value": f"{SETTINGS_DIR}/config.yaml"} in c["env"], c["name"]
            checked.add(c["name"])
    assert checked == {"webhook", "reconciler"}
    assert set(configmap["data"]) == {"config.yaml", "webhooks.yaml"}
    config = settings(objects)
    service = find_one(objects, "Service", config["service_name"])
    assert service["metadata"]["namespace"] == config["service_namespace"] == NAMESPACE
    assert config["webhook_configurations"] == f"{SETTINGS_DIR}/webhooks.yaml"
    assert config["tls_secret"] == CERTS_SECRET and config["enforcement"] == "deny" and config["certs_from_secret"] is True
    assert config.get("ca_secret") == (CA_SECRET if self_managed(variant) else None)
    # Per-process flags stay arguments: config.yaml holds none of them.
    assert not set(config) & {"port", "certs_dir", "job_source", "host", "kubeconfig", "jobs_dir"}


@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_config_yaml_is_what_the_settings_accept(mode: str) -> None:
    """manifests/settings/*/config.yaml loads as WebhookSettings (unknown keys are refused), as the
    containers read it, with the values written there."""
    from volcano_job_webhook.config import load_settings

    path = SETTINGS / mode / "config.yaml"
    written = yaml.safe_load(path.read_text())
    loaded = load_settings(str(path))
    assert {key: getattr(loaded, key) for key in written} == {
        **written, "webhook_configurations": Path(written["webhook_configurations"])}


def test_a_settings_change_in_an_overlay_rolls_both_processes(tmp_path: Path) -> None:
    """docs/install.md's way: an overlay merging its own config.yaml into the generator. The
    ConfigMap gets another name, both Deployments follow it (a rollout), webhooks.yaml stays."""
    here = tmp_path / "mine"
    here.mkdir()
    (here / "config.yaml").write_text((SETTINGS / "self-managed" / "config.yaml").read_text().replace("enforcement: deny", "enforcement: audit"))
    (here / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(OVERLAYS / 'split', here)}\n"
        "configMapGenerator:\n  - name: volcano-job-webhook-config\n    namespace: volcano-job-webhook\n"
        "    behavior: merge\n    files:\n      - config.yaml\n")
    mine, shipped = build(here), build_variant("split")
    assert settings(mine)["enforcement"] == "audit" and settings(shipped)["enforcement"] == "deny"
    assert webhook_configurations(mine) == webhook_configurations(shipped)
    name = settings_configmap(mine)["metadata"]["name"]
    assert name != settings_configmap(shipped)["metadata"]["name"]
    for deployment in ("volcano-job-webhook", "volcano-job-webhook-reconciler"):
        volumes = find_one(mine, "Deployment", deployment)["spec"]["template"]["spec"]["volumes"]
        assert [v["configMap"]["name"] for v in volumes if "configMap" in v] == [name], deployment


@pytest.mark.parametrize("variant", ["cert-manager", "cert-manager-split"])
def test_cert_manager_variant_issues_the_mounted_secret(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    objects = variants[variant]
    certificates = {c["metadata"]["name"]: c for c in find(objects, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in find(objects, "Issuer")}
    serving = certificates[CERTS_SECRET]
    assert serving["spec"]["secretName"] == CERTS_SECRET
    assert serving["spec"]["dnsNames"] == [
        "volcano-job-webhook.volcano-job-webhook.svc", "volcano-job-webhook.volcano-job-webhook.svc.cluster.local",
    ]
    assert not serving["spec"].get("isCA")
    # serving ← CA Issuer ← CA Certificate ← self-signed Issuer
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    ca_cert = next(c for c in certificates.values() if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"])
    assert ca_cert["spec"]["isCA"] is True
    assert "selfSigned" in issuers[ca_cert["spec"]["issuerRef"]["name"]]["spec"]
    # No CA injector: the reconciler copies ca.crt of the mounted Secret into the caBundle.
    for configuration in webhook_configurations(objects):
        assert "annotations" not in configuration["metadata"], describe(configuration)
    assert settings(objects)["tls_secret"] == serving["spec"]["secretName"]
    assert not find(objects, "Job") and not find(objects, "CronJob")


@pytest.mark.parametrize("variant", ["self-managed", "split"])
def test_self_managed_variant_needs_no_certgen(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """The reconciler makes and renews the certificates (ca_secret): no Job whose template an upgrade
    could not change, no CronJob, no identity of their own, nothing of cert-manager."""
    objects = variants[variant]
    assert not find(objects, "Job") and not find(objects, "CronJob")
    assert not find(objects, "Certificate") and not find(objects, "Issuer")
    assert {o["metadata"]["name"] for o in find(objects, "ServiceAccount")} == (
        {SERVICE_ACCOUNT, RECONCILER_SERVICE_ACCOUNT} if variant in SPLIT_VARIANTS else {SERVICE_ACCOUNT})
    assert settings(objects)["ca_secret"] == CA_SECRET
    for configuration in webhook_configurations(objects):
        assert "annotations" not in configuration["metadata"]


def split_checks(objects: list[dict[str, Any]], combined: list[dict[str, Any]], variant: str) -> None:
    """What the split layout promises on top of the sidecar variant of the same certificates (``combined``)."""
    webhook_pod = find_one(objects, "Deployment", "volcano-job-webhook")["spec"]["template"]["spec"]
    assert [c["name"] for c in webhook_pod["containers"]] == ["webhook"]
    assert webhook_pod["containers"][0] == container(combined, "webhook")
    assert webhook_pod["serviceAccountName"] == SERVICE_ACCOUNT
    reconciler = find_one(objects, "Deployment", "volcano-job-webhook-reconciler")
    pod = reconciler["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RECONCILER_SERVICE_ACCOUNT
    (moved,) = pod["containers"]
    # The sidecar's reconciler container, only made Ready-aware now that its readiness gates nobody else.
    assert {k: v for k, v in moved.items() if k != "readinessProbe"} == container(combined, "reconciler")
    assert moved["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health", "scheme": "HTTP"}
    assert reconciler["spec"]["replicas"] >= 2 and "--leader-elect" in moved["args"]
    assert selector_matches(reconciler["spec"]["selector"], reconciler["spec"]["template"]["metadata"]["labels"])
    webhook_selector = find_one(objects, "Deployment", "volcano-job-webhook")["spec"]["selector"]
    assert not selector_matches(webhook_selector, reconciler["spec"]["template"]["metadata"]["labels"])
    # The Lease is the reconciler's, under the name its flags give.
    flags = dict(a.removeprefix("--").split("=", 1) for a in moved["args"] if "=" in a)
    leases = [g for g in rbac_grants(objects, RECONCILER_SERVICE_ACCOUNT) if g.resource == "leases"]
    assert leases and {g.namespace for g in leases} == {flags["lease-namespace"]}
    assert all(flags["lease-name"] in g.resource_names for g in leases if g.verb != "create")
    # The webhook's token reads Volcano Jobs and nothing else: no Secret, in any namespace.
    # (but its own serving certificate, by name, in this namespace).
    webhook_grants = rbac_grants(objects, SERVICE_ACCOUNT)
    assert {(g.api_group, g.resource, g.verb) for g in webhook_grants} == expected_permissions(variant, "webhook")
    assert {g for g in webhook_grants if g.resource == "secrets"} == SERVING_SECRET_GRANTS
    assert {(g.api_group, g.resource, g.verb) for g in rbac_grants(objects, RECONCILER_SERVICE_ACCOUNT)} == expected_permissions(variant, "reconciler")
    # The registration (and the certificates it registers) are the reconciler's.
    assert narrowed(rbac_grants(objects, RECONCILER_SERVICE_ACCOUNT)) == registration_grants(variant)
    # Nothing else differs from the combined variant (the settings ConfigMap, same content, same name).
    changed = {("apps", "Deployment", NAMESPACE, "volcano-job-webhook"),
               ("rbac.authorization.k8s.io", "ClusterRole", "", "volcano-job-webhook"),
               ("rbac.authorization.k8s.io", "RoleBinding", NAMESPACE, "volcano-job-webhook-leader-election"),
               ("rbac.authorization.k8s.io", "ClusterRoleBinding", "", "volcano-job-webhook-registration"),
               ("rbac.authorization.k8s.io", "RoleBinding", NAMESPACE, "volcano-job-webhook-registration"),
               ("rbac.authorization.k8s.io", "RoleBinding", NAMESPACE, "volcano-job-webhook-serving-certificate")}
    before = {object_id(o): o for o in combined}
    after = {object_id(o): o for o in objects}
    assert set(before) <= set(after) and changed <= set(before)
    assert sorted(describe(o) for i, o in after.items() if i not in before) == [
        "ClusterRole.rbac.authorization.k8s.io volcano-job-webhook-reconciler",
        "ClusterRoleBinding.rbac.authorization.k8s.io volcano-job-webhook-reconciler",
        f"Deployment.apps {NAMESPACE}/volcano-job-webhook-reconciler",
        f"ServiceAccount.core {NAMESPACE}/volcano-job-webhook-reconciler",
    ]
    assert [i for i in before if i not in changed and canonical(before[i]) != canonical(after[i])] == []


def test_split_variant_runs_each_process_under_its_own_identity(variants: dict[str, list[dict[str, Any]]]) -> None:
    split_checks(variants["split"], variants["self-managed"], "split")


def test_cert_manager_split_variant_is_the_split_of_the_cert_manager_one(variants: dict[str, list[dict[str, Any]]]) -> None:
    """A shipped variant now (an overlay of one's own needed a Component before)."""
    split_checks(variants["cert-manager-split"], variants["cert-manager"], "cert-manager-split")


def test_one_image_matching_the_package_version(variants: dict[str, list[dict[str, Any]]]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert IMAGE.endswith(f":{version}")
    for objects in variants.values():
        for label, pod in pod_specs(objects):
            for c in containers(pod):
                assert c["image"] == IMAGE, f"{label} {c['name']}"


def test_container_arguments_parse_with_the_cli(variants: dict[str, list[dict[str, Any]]]) -> None:
    """Every container's args are a valid `volcano-webhook` command line (ENTRYPOINT volcano-webhook)."""
    from volcano_job_webhook.cli import build_parser

    parser = build_parser()
    commands = {a.dest: a for a in parser._subparsers._group_actions}["command"].choices  # type: ignore[union-attr]
    for objects in variants.values():
        for label, pod in pod_specs(objects):
            for c in containers(pod):
                assert c["args"][0] in commands, f"{label} {c['name']}: no such command: {shlex.join(c['args'])}"
                args = parser.parse_args(c["args"])
                assert args.command == c["args"][0]
    args = parser.parse_args(WEBHOOK_ARGS)
    assert (args.port, args.certs_dir, args.job_source) == (8443, None, "kube")
    args = parser.parse_args(RECONCILER_ARGS)
    assert (args.health_port, args.leader_elect, args.lease_namespace) == (8081, True, NAMESPACE)


# Security -----------------------------------------------------------------------------------------


QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int) -> float:
    m = QUANTITY.match(str(value))
    assert m, f"not a quantity: {value!r}"
    return float(m.group(1)) * FACTORS[m.group(2)]


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_pods_are_locked_down(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """Pod Security "restricted" and then some: non-root 65532, read-only root, no privilege
    escalation, no capabilities, RuntimeDefault seccomp, a writable /tmp, requests and limits."""
    checked = 0
    for label, pod in pod_specs(variants[variant]):
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == UID and psc["runAsGroup"] == UID, label
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, label
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), label
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        assert all(set(v) - {"name"} <= {"secret", "emptyDir", "configMap", "projected"} for v in volumes.values()), label
        for c in containers(pod):
            where = f"{label} container {c['name']}"
            sc = c["securityContext"]
            assert sc.get("runAsNonRoot", psc["runAsNonRoot"]) is True, where
            assert sc.get("runAsUser", psc["runAsUser"]) == UID, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc.get("privileged", False) is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc.get("seccompProfile", psc["seccompProfile"]) == {"type": "RuntimeDefault"}, where
            res = c["resources"]
            for key in ("cpu", "memory"):
                assert quantity(res["requests"][key]) <= quantity(res["limits"][key]), f"{where} {key}"
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]] and not tmp[0].get("readOnly"), f"{where}: no writable /tmp"
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_namespace_enforces_restricted_pod_security(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    labels = find_one(variants[variant], "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_probes_point_at_declared_ports(default: list[dict[str, Any]]) -> None:
    webhook, reconciler = container(default, "webhook"), container(default, "reconciler")
    for c, scheme, port in ((webhook, "HTTPS", 8443), (reconciler, "HTTP", 8081)):
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        probes = {k: c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in c}
        assert "livenessProbe" in probes, c["name"]
        for kind, probe in probes.items():
            target = ports.get(probe["port"], probe["port"])
            assert target in ports.values(), f"{c['name']} {kind}: port {probe['port']} is not declared"
            assert target == port and probe["scheme"] == scheme, f"{c['name']} {kind}"
            assert probe["path"] in ("/healthz", "/readyz"), f"{c['name']} {kind}"
    assert webhook["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert webhook["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The reconciler's readiness would gate the webhook's Service endpoints (Pod readiness is all
    # containers'); see deployment.yaml.
    assert "readinessProbe" not in reconciler


# RBAC ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_webhook_service_account_gets_exactly_the_calls_the_code_makes(variant: str) -> None:
    if variant in SPLIT_VARIANTS:
        assert rbac_permissions(SERVICE_ACCOUNT, variant) == expected_permissions(variant, "webhook")
        assert rbac_permissions(RECONCILER_SERVICE_ACCOUNT, variant) == expected_permissions(variant, "reconciler")
    else:
        assert rbac_permissions(SERVICE_ACCOUNT, variant) == expected_permissions(variant)
        assert rbac_permissions(RECONCILER_SERVICE_ACCOUNT, variant) == set()
    assert rbac_permissions("volcano-job-webhook-certgen", variant) == set(), "no certgen Job: the reconciler makes them"


@pytest.mark.parametrize(("variant", "account"), [(v, a) for v in ALL_VARIANTS for a in (SERVICE_ACCOUNT, RECONCILER_SERVICE_ACCOUNT)
                                                  if v in SPLIT_VARIANTS or a == SERVICE_ACCOUNT])
def test_leases_and_the_registration_are_narrowed_and_the_rest_cluster_wide(
        variant: str, account: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """The Lease, the registration and the certificates are granted in the install's namespace or
    by name; the job objects, which live in any namespace, cluster-wide."""
    grants = rbac_grants(variants[variant], account)
    for grant in grants:
        if grant.resource == "leases":
            assert grant.namespace == NAMESPACE
        elif grant not in narrowed(grants):
            assert grant.namespace is None and not grant.resource_names, grant
    registers = variant not in SPLIT_VARIANTS or account == RECONCILER_SERVICE_ACCOUNT
    serves = variant not in SPLIT_VARIANTS or account == SERVICE_ACCOUNT
    assert narrowed(grants) == (registration_grants(variant) if registers else set()) | (SERVING_SECRET_GRANTS if serves else set())
    assert bool([g for g in grants if g.resource == "leases"]) == registers


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_the_registration_owner_and_targets_are_the_installs(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """The ClusterRole config.yaml names as every registration's owner exists (its deletion is what
    removes the registrations), and the names the rules allow are the configurations' and Secrets'
    config.yaml names."""
    objects = variants[variant]
    config = settings(objects)
    owner = find_one(objects, "ClusterRole", config["registration_owner"])
    assert owner["metadata"]["name"] == "volcano-job-webhook"
    names = {c["metadata"]["name"] for c in webhook_configurations(objects)}
    assert names == {WEBHOOK_CONFIGURATIONS}
    registrar = RECONCILER_SERVICE_ACCOUNT if variant in SPLIT_VARIANTS else SERVICE_ACCOUNT
    grants = rbac_grants(objects, registrar)
    assert {g.resource_names for g in grants if g.api_group == "admissionregistration.k8s.io" and g.verb != "create"} == {frozenset(names)}
    assert {g.resource_names for g in grants if g.resource == "clusterroles"} == {frozenset({config["registration_owner"]})}
    secrets = {config["tls_secret"], *([config["ca_secret"]] if "ca_secret" in config else [])}
    assert set().union(*(g.resource_names for g in grants if g.resource == "secrets" and g.namespace)) == secrets
    assert ("ca_secret" in config) == self_managed(variant)
    # The webhook's own identity (split) registers nothing.
    if variant in SPLIT_VARIANTS:
        assert not any(g.api_group == "admissionregistration.k8s.io" for g in rbac_grants(objects, SERVICE_ACCOUNT))


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_rbac_is_explicit_and_complete(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """No wildcards; every binding's role and subject exist; every Pod's ServiceAccount exists."""
    objects = variants[variant]
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in find(objects, "ServiceAccount")}
    for role in [*find(objects, "Role"), *find(objects, "ClusterRole")]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], describe(role)
    for binding in [*find(objects, "RoleBinding"), *find(objects, "ClusterRoleBinding")]:
        assert find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"]), describe(binding)
        for subject in binding["subjects"]:
            assert (subject["namespace"], subject["name"]) in accounts, describe(binding)
    for label, pod in pod_specs(objects):
        assert (NAMESPACE, pod["serviceAccountName"]) in accounts, label


# The image ----------------------------------------------------------------------------------------


def test_dockerfile_builds_the_contracted_image() -> None:
    instructions = dockerfile_instructions()
    stages = [rest for word, rest in instructions if word == "FROM"]
    assert len(stages) >= 2, "multi-stage: build a wheel and a venv, copy the venv"
    base_arg = dict(r.split("=", 1) for w, r in instructions if w == "ARG" and "=" in r)
    assert base_arg["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(s.split()[0] == "${PYTHON_IMAGE}" for s in stages), "every stage on the same base (the venv's python symlink)"
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM"):]
    last = dict(final)
    assert last["USER"] == f"{UID}:{UID}"
    assert json.loads(last["ENTRYPOINT"]) == ["volcano-webhook"]
    assert json.loads(last["CMD"]) == ["serve"]
    assert "COPY" in last and "--from=build" in last["COPY"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "volcano-webhook" in pyproject["project"]["scripts"]
    # What the build stage's steps make is run and used in tests/programs/test_install.py.


def test_build_context_holds_what_the_wheel_needs_and_no_secrets() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = []
    for word, rest in dockerfile_instructions():
        if word == "COPY" and "--from" not in rest:
            copied += rest.split()[:-1]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"], *(p + "/" for p in pyproject["tool"]["setuptools"]["package-dir"].values())}
    assert needed <= set(copied)
    for source in copied:
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else list(path.rglob("*.py"))
        assert files, source
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            assert not dockerignore_excludes(rel, patterns), f"{rel} is copied but excluded from the context"
    for kept_out in ("certs/tls.key", "certs/ca.key", ".venv/bin/python", ".git/config", "tests/unit/server/test_app.py",
                     "bench/run.py", "plugins/__pycache__/env.cpython-311.pyc", "volcano_job_webhook.egg-info/PKG-INFO"):
        assert dockerignore_excludes(kept_out, patterns), kept_out


# The install guide --------------------------------------------------------------------------------


def test_install_guide_names_real_paths_and_objects() -> None:
    text = (ROOT / "docs" / "install.md").read_text()
    for path in set(re.findall(r"(?<![\w/.])((?:manifests|examples|docs|charts)/[\w./-]*[\w])", text)):
        assert (ROOT / path).exists(), path
    for variant in VARIANTS:
        assert f"kubectl apply -k manifests/overlays/{variant}" in text
    # Helm first, the recommended path; kustomize after it.
    helm_install = "helm install volcano-job-webhook charts/volcano-job-webhook -n volcano-job-webhook --create-namespace"
    assert helm_install in text and text.index(helm_install) < text.index("kubectl apply -k manifests/overlays/")
    objects = [o for variant in VARIANTS for o in build_variant(variant)]
    for kind, name in re.findall(r"\b(job|deployment|secret|lease|certificate)/(volcano-job-webhook[\w-]*)", text):
        made_at_run_time = {"volcano-job-webhook-reconciler", CERTS_SECRET, "volcano-job-webhook-ca"}
        assert name in {o["metadata"]["name"] for o in objects} | made_at_run_time, f"{kind}/{name}"


# Finding kubectl ----------------------------------------------------------------------------------


def test_kubectl_is_looked_for_in_the_documented_order(tmp_path: Path) -> None:
    """$KUBECTL alone when set, then $KUBEBUILDER_ASSETS, PATH and the cache .ci/run fills."""
    places = {name: tmp_path / name / "kubectl" for name in ("explicit", "assets", "path", "cache/volcano-job-webhook/bin")}
    for place in places.values():
        place.parent.mkdir(parents=True)
        place.write_text("#!/bin/sh\n")
        place.chmod(0o755)
    environ = {"KUBECTL": str(places["explicit"]), "KUBEBUILDER_ASSETS": str(places["assets"].parent),
               "PATH": str(places["path"].parent), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    order = [find_kubectl(environ)]
    del environ["KUBECTL"]
    order.append(find_kubectl(environ))
    del environ["KUBEBUILDER_ASSETS"]
    order.append(find_kubectl(environ))
    environ["PATH"] = str(tmp_path)  # no kubectl there
    order.append(find_kubectl(environ))
    assert order == list(places.values())
    assert find_kubectl({"KUBECTL": "", "PATH": str(places["path"].parent)}) is None, "KUBECTL set empty: none"
    assert find_kubectl({"KUBECTL": str(tmp_path / "absent"), "PATH": str(places["path"].parent)}) is None
    places["cache/volcano-job-webhook/bin"].chmod(0o644)
    assert find_kubectl(environ) is None, "not executable"


# Indexed Jobs and JobSets (docs/workloads.md) -----------------------------------------------------

WORKLOADS_HOOK = "workloads.volcano-job-webhook.io"


def test_workload_pod_webhook_selects_only_opted_in_pods(default: list[dict[str, Any]]) -> None:
    from volcano_job_webhook.plugins import read_workload
    from volcano_job_webhook.plugins.podgen import make_pod

    webhook = mutating(default, WORKLOADS_HOOK)
    assert webhook["failurePolicy"] == "Fail" and webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["clientConfig"]["service"]["path"] == "/mutate"
    assert webhook["namespaceSelector"] == {"matchExpressions": [EXCLUDED_NAMESPACES]}
    for path in sorted((ROOT / "examples" / "workloads").glob("*.yaml")):
        job = read_workload(yaml.safe_load(path.read_text()))
        for task in job.tasks:
            pod = make_pod(job, task.name, 0)
            pod["metadata"]["name"] = "p"
            assert pod_request(webhook, pod), f"{path.name} {task.name}"
            assert not pod_request(mutating(default), pod), "the Volcano entry leaves it alone"
            del pod["metadata"]["labels"]["volcano-job-webhook/enabled"]
            assert not pod_request(webhook, pod), "a workload that did not opt in never calls us"
    both = volcano_pod()
    both["metadata"]["labels"]["volcano-job-webhook/enabled"] = "true"
    assert pod_request(mutating(default), both) and not pod_request(webhook, both), "one call per Pod"


def test_workload_validating_webhook_rules(default: list[dict[str, Any]]) -> None:
    webhook = validating(default, WORKLOADS_HOOK)
    assert webhook["rules"] == [
        {"operations": ["CREATE", "UPDATE"], "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"], "scope": "Namespaced"},
        {"operations": ["CREATE", "UPDATE"], "apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
         "resources": ["jobsets"], "scope": "Namespaced"},
    ]
    (condition,) = webhook["matchConditions"]
    assert "volcano-job-webhook/plugins" in condition["expression"]
    assert webhook["failurePolicy"] == "Ignore" and webhook["clientConfig"]["service"]["path"] == "/validate"
