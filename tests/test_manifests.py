"""The install manifests (``manifests/``), the image (``Dockerfile``, ``.dockerignore``) and their contract.

Every object is checked against the Kubernetes OpenAPI schema (kubernetes-validate, strict, for the
oldest supported Kubernetes, 1.30, and the newest the package knows), each kustomize variant is rendered
by kubectl's built-in kustomize (``tests/kustomize.py``; the tests that need it skip without kubectl),
and the parts that must agree — Service and Deployment, webhook
registrations and Service, certificate and Secret, flags and CLI, RBAC and the code's API calls — are
checked against each other.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import shutil
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor

from tests.jobs import volcano_job
from tests.kustomize import BASE, COMPONENTS, DEFAULT_VARIANT, MANIFESTS, OVERLAYS, ROOT, VARIANTS, build, build_variant, find_kubectl
from tests.manifests_util import (
    CERTGEN_SERVICE_ACCOUNT,
    CLUSTER_SCOPED,
    NAMESPACE,
    RECONCILER_SERVICE_ACCOUNT,
    SERVICE_ACCOUNT,
    canonical,
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
    selector_matches,
)

K8S_VERSIONS = ["1.30", major_minor(latest_version())]
IMAGE = "ghcr.io/volcano-job-webhook/volcano-job-webhook:0.1.0"
CERTS_SECRET = "volcano-job-webhook-tls"
CA_SECRET = "volcano-job-webhook-ca"
CERTS_DIR = "/etc/webhook/certs"
UID = 65532
ALL_VARIANTS = [*VARIANTS, "default"]

WEBHOOK_ARGS = ["serve", "--port=8443", f"--certs-dir={CERTS_DIR}", "--job-source=kube"]
RECONCILER_ARGS = [
    "reconcile", "--health-port=8081", "--leader-elect",
    "--lease-name=volcano-job-webhook-reconciler", "--lease-namespace=volcano-job-webhook",
]
CERTGEN_ARGS = ["certs", "--secret", f"{NAMESPACE}/{CERTS_SECRET}", "--ca-secret", CA_SECRET, "--patch-webhook", "volcano-job-webhook"]

# The API calls the code makes (the product's contract); RBAC must grant exactly these.
# The reconciler's caches list and watch; it creates (POST), reads what a create found, patches
# (server-side apply, merge patch) and deletes.
OWNED_VERBS = ("get", "list", "watch", "create", "patch", "delete")
EXPECTED_PERMISSIONS = {
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
# The webhook alone (`serve --job-source=kube`): its Job cache and the GET of a Job not cached yet,
# and of an opted-in workload (never cached).
EXPECTED_WEBHOOK_ONLY_PERMISSIONS = {("batch.volcano.sh", "jobs", v) for v in ("get", "list", "watch")} | {
    ("batch", "jobs", "get"), ("jobset.x-k8s.io", "jobsets", "get")}
# The reconciler alone: all the rest; its caches list and watch, it never GETs a job.
EXPECTED_RECONCILER_ONLY_PERMISSIONS = EXPECTED_PERMISSIONS - {
    ("batch.volcano.sh", "jobs", "get"), ("batch", "jobs", "get"), ("jobset.x-k8s.io", "jobsets", "get")}
EXPECTED_CERTGEN_PERMISSIONS = {
    *(("", "secrets", v) for v in ("get", "create", "update")),
    *(("admissionregistration.k8s.io", r, v)
      for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations") for v in ("get", "patch")),
}


@pytest.fixture(scope="module")
def variants() -> dict[str, list[dict[str, Any]]]:
    return {name: build_variant(name) for name in ALL_VARIANTS}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return build(BASE)


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


# What the checks below read of a kustomization; another field (a generator's files, say) would slip
# past the file-usage check, so it fails here until they read it too.
KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "namespace", "resources", "components", "patches"})


@dataclass(frozen=True)
class PatchEntry:
    """One ``patches`` entry of a kustomization, as written."""

    directory: Path
    index: int
    file: Path | None  # None for an inline patch
    body: Any
    target: Mapping[str, Any] | None

    @property
    def origin(self) -> str:
        return str(self.file.relative_to(ROOT)) if self.file else f"{self.directory.relative_to(ROOT)}/patches[{self.index}]"


def kustomization(directory: Path) -> dict[str, Any]:
    (doc,) = load_documents(directory / "kustomization.yaml")
    return doc


def kustomization_dirs(*, components: bool = True) -> list[Path]:
    """Every directory with a kustomization.yaml; ``components=False`` leaves out Components."""
    dirs = sorted(p.parent for p in MANIFESTS.rglob("kustomization.yaml"))
    return dirs if components else [d for d in dirs if kustomization(d)["kind"] != "Component"]


def patch_entries(directory: Path) -> list[PatchEntry]:
    out = []
    for index, entry in enumerate(kustomization(directory).get("patches") or []):
        file = directory / entry["path"] if "path" in entry else None
        (body,) = load_documents(file) if file else [yaml.safe_load(entry["patch"])]
        out.append(PatchEntry(directory, index, file, body, entry.get("target")))
    return out


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda p: str(p.relative_to(MANIFESTS)) or ".")
def test_kustomizations_use_only_the_fields_read_here(directory: Path) -> None:
    assert set(kustomization(directory)) <= KUSTOMIZATION_FIELDS


@pytest.mark.parametrize("directory", kustomization_dirs(components=False), ids=lambda p: str(p.relative_to(MANIFESTS)) or ".")
def test_kustomization_builds(directory: Path) -> None:
    """kubectl renders it (a missing file or a patch that fails its test op fails here)."""
    objects = build(directory)
    assert objects and len({object_id(o) for o in objects}) == len(objects)


def test_kustomizations_list_every_manifest_file() -> None:
    """No YAML file in manifests/ is left out of every kustomization (it would silently not apply)."""
    used: set[Path] = set()
    for directory in kustomization_dirs():
        used |= {(directory / e).resolve() for e in kustomization(directory).get("resources") or [] if (directory / e).is_file()}
        used |= {p.file.resolve() for p in patch_entries(directory) if p.file}
    files = {p.resolve() for p in MANIFESTS.rglob("*.y*ml") if p.name != "kustomization.yaml"}
    assert files - used == set()


def test_namespaced_objects_name_the_namespace_themselves() -> None:
    """The namespace transformer changes nothing: the files read on their own (kubectl apply -f)
    mean what the build means."""
    for directory in kustomization_dirs(components=False):
        if directory != MANIFESTS:
            assert kustomization(directory).get("namespace") == NAMESPACE, directory
    for label, doc in all_resource_documents():
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == NAMESPACE, label
        else:
            assert "namespace" not in doc["metadata"], label


def without_patch(patch: PatchEntry, copy_root: Path) -> Path:
    """A copy of manifests/ under ``copy_root`` whose kustomization lacks ``patch``."""
    copy = copy_root / "manifests"
    shutil.copytree(MANIFESTS, copy)
    directory = copy / patch.directory.relative_to(MANIFESTS)
    k = kustomization(directory)
    del k["patches"][patch.index]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return copy


def overlay_of(directory: Path) -> Path:
    """The kustomization rendered to see a patch at work: for a component, the overlay using it."""
    if kustomization(directory)["kind"] != "Component":
        return directory
    return next(d for d in kustomization_dirs(components=False)
                if any((d / c).resolve() == directory for c in kustomization(d).get("components") or []))


@pytest.mark.parametrize("patch", [p for d in kustomization_dirs() for p in patch_entries(d)], ids=lambda p: p.origin)
def test_each_patch_changes_exactly_the_object_it_names(patch: PatchEntry, tmp_path: Path) -> None:
    """kustomize applies a patch whose target matches nothing, or several objects, without a word:
    rendered without it, the build differs in the one object the patch names and nowhere else."""
    overlay = overlay_of(patch.directory)
    with_it = {object_id(o): canonical(o) for o in build(overlay)}
    without_it = {object_id(o): canonical(o) for o in build(without_patch(patch, tmp_path) / overlay.relative_to(MANIFESTS))}
    changed = [i for i in with_it.keys() | without_it.keys() if with_it.get(i) != without_it.get(i)]
    named = patch.target or {"kind": patch.body["kind"], "name": patch.body["metadata"]["name"]}
    assert [(kind, name) for _, kind, _, name in changed] == [(named["kind"], named["name"])], patch.origin


def test_default_variant_is_self_managed(variants: dict[str, list[dict[str, Any]]]) -> None:
    assert DEFAULT_VARIANT == "self-managed"
    assert sorted(map(canonical, variants["default"])) == sorted(map(canonical, variants["self-managed"]))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_overlays_keep_every_base_object(variant: str, variants: dict[str, list[dict[str, Any]]], base: list[dict[str, Any]]) -> None:
    ids = {object_id(o) for o in variants[variant]}
    assert {object_id(o) for o in base} <= ids


# Schema validation --------------------------------------------------------------------------------


CERTIFICATE_SPEC_FIELDS = {
    "secretName", "secretTemplate", "commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses",
    "otherNames", "duration", "renewBefore", "renewBeforePercentage", "issuerRef", "isCA", "usages",
    "privateKey", "subject", "literalSubject", "revisionHistoryLimit", "keystores", "encodeUsagesInRequest",
    "additionalOutputFormats", "nameConstraints",
}
ISSUER_TYPES = {"selfSigned", "ca", "acme", "vault", "venafi"}
KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
    "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
    "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
}
DURATION = re.compile(r"^(\d+(\.\d+)?(h|m|s|ms))+$")


def cert_manager_problems(obj: Mapping[str, Any]) -> list[str]:
    """Required fields of cert-manager's Issuer and Certificate (its CRD schemas are not shipped here)."""
    problems: list[str] = []
    if obj.get("apiVersion") != "cert-manager.io/v1":
        problems.append(f"apiVersion {obj.get('apiVersion')!r}, want cert-manager.io/v1")
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if not meta.get("name") or not meta.get("namespace"):
        problems.append("metadata.name and metadata.namespace are required")
    if obj.get("kind") == "Issuer":
        kinds = set(spec) & ISSUER_TYPES
        if len(kinds) != 1 or set(spec) - ISSUER_TYPES:
            problems.append(f"spec must hold exactly one issuer type of {sorted(ISSUER_TYPES)}, has {sorted(spec)}")
        if "ca" in spec and not (spec["ca"] or {}).get("secretName"):
            problems.append("spec.ca.secretName is required")
        if "selfSigned" in spec and not isinstance(spec["selfSigned"], dict):
            problems.append("spec.selfSigned must be an object")
    elif obj.get("kind") == "Certificate":
        if unknown := set(spec) - CERTIFICATE_SPEC_FIELDS:
            problems.append(f"unknown spec fields {sorted(unknown)}")
        if not spec.get("secretName"):
            problems.append("spec.secretName is required")
        ref = spec.get("issuerRef") or {}
        if not ref.get("name") or ref.get("kind", "Issuer") not in ("Issuer", "ClusterIssuer") \
                or ref.get("group", "cert-manager.io") != "cert-manager.io":
            problems.append(f"spec.issuerRef must name a cert-manager.io Issuer or ClusterIssuer: {ref}")
        if not spec.get("dnsNames") and not (spec.get("isCA") and spec.get("commonName")):
            problems.append("spec.dnsNames is required (or isCA with a commonName)")
        for key in ("duration", "renewBefore"):
            if key in spec and not DURATION.match(str(spec[key])):
                problems.append(f"spec.{key} {spec[key]!r} is not a Go duration")
        if bad := set(spec.get("usages") or []) - KEY_USAGES:
            problems.append(f"unknown usages {sorted(bad)}")
        key = spec.get("privateKey") or {}
        if key.get("algorithm", "RSA") not in ("RSA", "ECDSA", "Ed25519") or key.get("rotationPolicy", "Always") not in ("Always", "Never") \
                or key.get("encoding", "PKCS1") not in ("PKCS1", "PKCS8"):
            problems.append(f"bad privateKey {key}")
    else:
        problems.append(f"no check for cert-manager kind {obj.get('kind')}")
    return problems


def schema_problems(obj: Mapping[str, Any], version: str) -> list[str]:
    if obj.get("apiVersion", "").startswith("cert-manager.io/"):
        return cert_manager_problems(obj)
    try:
        kubernetes_validate.validate(dict(obj), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def all_resource_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for directory in kustomization_dirs():
        for entry in kustomization(directory).get("resources") or []:
            path = directory / entry
            if path.is_file():
                for doc in load_documents(path):
                    yield f"{path.relative_to(ROOT)}: {describe(doc)}", doc


def all_patch_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """Strategic-merge patches written as whole objects (ours are: apiVersion, kind, metadata)."""
    for directory in kustomization_dirs():
        for patch in patch_entries(directory):
            if isinstance(patch.body, dict) and {"apiVersion", "kind"} <= set(patch.body):
                yield f"{patch.origin}: {describe(patch.body)}", patch.body


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates(version: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """Every document in manifests/ as written (resources and patches), and every object of every
    built (patched) variant, strictly."""
    labelled = [
        *all_resource_documents(),
        *all_patch_documents(),
        *((f"{v}: {describe(o)}", o) for v, objs in variants.items() for o in objs),
    ]
    assert sum(1 for _ in all_patch_documents()) == 2
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
    deployment = find_one(build(BASE), "Deployment", "volcano-job-webhook")
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
    webhooks = find_one(objects, "MutatingWebhookConfiguration", "volcano-job-webhook")["webhooks"]
    assert [w["name"] for w in webhooks] == ["pods.volcano-job-webhook.io", "workloads.volcano-job-webhook.io"]
    (webhook,) = [w for w in webhooks if w["name"] == name]
    return webhook


def validating(objects: list[dict[str, Any]], name: str = "jobs.volcano-job-webhook.io") -> dict[str, Any]:
    webhooks = find_one(objects, "ValidatingWebhookConfiguration", "volcano-job-webhook")["webhooks"]
    assert [w["name"] for w in webhooks] == ["jobs.volcano-job-webhook.io", "workloads.volcano-job-webhook.io"]
    (webhook,) = [w for w in webhooks if w["name"] == name]
    return webhook


EXCLUDED_NAMESPACES = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE, "kube-system"]}


def test_mutating_webhook_contract(base: list[dict[str, Any]]) -> None:
    webhook = mutating(base)
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


def test_validating_webhook_contract(base: list[dict[str, Any]]) -> None:
    webhook = validating(base)
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


def test_mutating_timeout_outlasts_a_job_cache_miss(base: list[dict[str, Any]]) -> None:
    """On a cache miss the webhook GETs the Job with its own timeout; the API server must wait longer
    than that, or a slow GET turns into a failed (and, with Fail, refused) Pod creation."""
    from volcano_job_webhook.server.jobs.kube import KubeJobSource

    get_timeout = inspect.signature(KubeJobSource).parameters["get_timeout"].default
    assert get_timeout + 2 <= mutating(base)["timeoutSeconds"] < 10


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_ca_bundle_is_left_to_the_injector(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    """No caBundle in any manifest: a re-apply must never wipe the CA that cert-manager or certgen set."""
    for webhook in (mutating(variants[variant]), validating(variants[variant])):
        assert "caBundle" not in webhook["clientConfig"]


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


def test_mutating_webhook_selects_pods_of_volcano_jobs(base: list[dict[str, Any]]) -> None:
    webhook = mutating(base)
    assert pod_request(webhook, volcano_pod("default"))
    assert pod_request(webhook, volcano_pod("team-a"))


def test_mutating_webhook_selects_pods_made_from_the_example_jobs(base: list[dict[str, Any]]) -> None:
    """The same, with the Pods the project's own model of Volcano's controller builds."""
    from volcano_job_webhook.documents import load_object
    from volcano_job_webhook.plugins import Job
    from volcano_job_webhook.plugins.podgen import make_pod

    webhook = mutating(base)
    jobs = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))
    assert jobs
    for path in jobs:
        job = Job.from_object(load_object(str(path), "Job"))
        for task in job.raw["spec"]["tasks"]:
            assert pod_request(webhook, make_pod(job, task["name"], 0)), f"{path.name} {task['name']}"


def test_mutating_webhook_leaves_other_pods_alone(base: list[dict[str, Any]]) -> None:
    webhook = mutating(base)
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


def test_validating_webhook_selects_volcano_jobs(base: list[dict[str, Any]]) -> None:
    webhook = validating(base)
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
    Service selects the Deployment's Pods and nothing else (not the certgen Job's)."""
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


def test_deployment_contract(base: list[dict[str, Any]]) -> None:
    deployment = find_one(base, "Deployment", "volcano-job-webhook")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "volcano-job-webhook"
    assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "volcano-job-webhook"
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert [c["name"] for c in pod["containers"]] == ["webhook", "reconciler"]
    assert container(base, "webhook")["args"] == WEBHOOK_ARGS
    assert container(base, "reconciler")["args"] == RECONCILER_ARGS
    assert "priorityClassName" not in pod  # system-cluster-critical is refused outside kube-system on some clusters
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in anti] == ["kubernetes.io/hostname"]
    assert selector_matches(anti[0]["podAffinityTerm"]["labelSelector"], spec["template"]["metadata"]["labels"])
    spread = pod["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for constraint in spread:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert selector_matches(constraint["labelSelector"], spec["template"]["metadata"]["labels"])


def test_pod_disruption_budget(base: list[dict[str, Any]]) -> None:
    pdb = find_one(base, "PodDisruptionBudget", "volcano-job-webhook")
    deployment = find_one(base, "Deployment", "volcano-job-webhook")
    assert pdb["spec"]["minAvailable"] == 1 < deployment["spec"]["replicas"]
    assert selector_matches(pdb["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])


def test_certificates_are_mounted_where_serve_reads_them(base: list[dict[str, Any]]) -> None:
    webhook = container(base, "webhook")
    pod = find_one(base, "Deployment", "volcano-job-webhook")["spec"]["template"]["spec"]
    (mount,) = [m for m in webhook["volumeMounts"] if m["mountPath"] == CERTS_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == CERTS_SECRET
    mode = volume["secret"].get("defaultMode", 0o644)
    assert mode & 0o007 == 0 and mode & 0o040, "tls.key readable by the fsGroup, not by others"
    assert pod["securityContext"]["fsGroup"] == UID
    assert not any(m["mountPath"] == CERTS_DIR for m in container(base, "reconciler").get("volumeMounts", []))


def test_reconciler_leader_election_wiring(base: list[dict[str, Any]]) -> None:
    reconciler = container(base, "reconciler")
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in reconciler["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    flags = dict(a.removeprefix("--").split("=", 1) for a in reconciler["args"] if "=" in a)
    assert flags["lease-namespace"] == find_one(base, "Deployment", "volcano-job-webhook")["metadata"]["namespace"]
    leases = [g for g in rbac_grants(base) if g.resource == "leases"]
    assert {g.namespace for g in leases} == {NAMESPACE}
    assert all(flags["lease-name"] in g.resource_names for g in leases if g.verb != "create")


def test_cert_manager_variant_issues_the_mounted_secret(variants: dict[str, list[dict[str, Any]]]) -> None:
    objects = variants["cert-manager"]
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
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = find_one(objects, kind, "volcano-job-webhook")["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{CERTS_SECRET}"}
    assert not find(objects, "Job") and not find(objects, "ServiceAccount", CERTGEN_SERVICE_ACCOUNT)


def test_self_managed_variant_runs_certgen(variants: dict[str, list[dict[str, Any]]]) -> None:
    objects = variants["self-managed"]
    job = find_one(objects, "Job", "volcano-job-webhook-certgen")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == CERTGEN_SERVICE_ACCOUNT
    assert pod["restartPolicy"] == "OnFailure" and job["spec"]["backoffLimit"] >= 3
    (certgen,) = pod["containers"]
    assert certgen["args"] == CERTGEN_ARGS
    assert not find(objects, "Certificate") and not find(objects, "Issuer")
    # The renewal: the same command, daily, one run at a time, with the install Job's Pod.
    cron = find_one(objects, "CronJob", "volcano-job-webhook-cert-renewal")
    assert cron["spec"]["jobTemplate"]["spec"]["template"] == job["spec"]["template"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    minute, hour, day, month, weekday = cron["spec"]["schedule"].split()
    assert (day, month, weekday) == ("*", "*", "*") and minute.isdigit() and hour.isdigit(), "once a day"
    assert cron["spec"]["jobTemplate"]["spec"]["backoffLimit"] >= 3
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "annotations" not in find_one(objects, kind, "volcano-job-webhook")["metadata"]


def split_checks(objects: list[dict[str, Any]], combined: list[dict[str, Any]]) -> None:
    """What the split component promises on top of a combined variant (``combined``)."""
    webhook_pod = find_one(objects, "Deployment", "volcano-job-webhook")["spec"]["template"]["spec"]
    assert [c["name"] for c in webhook_pod["containers"]] == ["webhook"]
    assert webhook_pod["containers"][0] == container(combined, "webhook")
    assert webhook_pod["serviceAccountName"] == SERVICE_ACCOUNT
    reconciler = find_one(objects, "Deployment", "volcano-job-webhook-reconciler")
    pod = reconciler["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RECONCILER_SERVICE_ACCOUNT
    (moved,) = pod["containers"]
    # The base's reconciler container, only made Ready-aware now that its readiness gates nobody else.
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
    assert {(g.api_group, g.resource, g.verb) for g in rbac_grants(objects, SERVICE_ACCOUNT)} == EXPECTED_WEBHOOK_ONLY_PERMISSIONS
    assert {(g.api_group, g.resource, g.verb) for g in rbac_grants(objects, RECONCILER_SERVICE_ACCOUNT)} == EXPECTED_RECONCILER_ONLY_PERMISSIONS
    # Nothing else differs from the combined variant.
    changed = {("apps", "Deployment", NAMESPACE, "volcano-job-webhook"),
               ("rbac.authorization.k8s.io", "ClusterRole", "", "volcano-job-webhook"),
               ("rbac.authorization.k8s.io", "RoleBinding", NAMESPACE, "volcano-job-webhook-leader-election")}
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
    split_checks(variants["split"], variants["self-managed"])


def test_split_component_goes_on_the_cert_manager_variant_too(tmp_path: Path) -> None:
    """As docs/install.md shows: an overlay of one's own, cert-manager's resources plus the component."""
    here = tmp_path / "mine"
    here.mkdir()
    (here / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: volcano-job-webhook\n"
        f"resources:\n  - {os.path.relpath(OVERLAYS / 'cert-manager', here)}\n"
        f"components:\n  - {os.path.relpath(COMPONENTS / 'split', here)}\n")
    objects = build(here)
    split_checks(objects, build_variant("cert-manager"))
    failures = [f"{describe(o)}: {p}" for o in objects for p in schema_problems(o, "1.30")]
    assert failures == []


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
    assert (args.port, str(args.certs_dir), args.job_source) == (8443, CERTS_DIR, "kube")
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


def test_probes_point_at_declared_ports(base: list[dict[str, Any]]) -> None:
    webhook, reconciler = container(base, "webhook"), container(base, "reconciler")
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
    if variant == "split":
        assert rbac_permissions(SERVICE_ACCOUNT, variant) == EXPECTED_WEBHOOK_ONLY_PERMISSIONS
        assert rbac_permissions(RECONCILER_SERVICE_ACCOUNT, variant) == EXPECTED_RECONCILER_ONLY_PERMISSIONS
    else:
        assert rbac_permissions(SERVICE_ACCOUNT, variant) == EXPECTED_PERMISSIONS
        assert rbac_permissions(RECONCILER_SERVICE_ACCOUNT, variant) == set()


def test_leases_are_namespaced_and_the_rest_cluster_wide(base: list[dict[str, Any]]) -> None:
    for grant in rbac_grants(base):
        if grant.resource == "leases":
            assert grant.namespace == NAMESPACE
        else:
            assert grant.namespace is None and not grant.resource_names, grant


@pytest.mark.parametrize("variant", ["self-managed", "split"])
def test_certgen_service_account_gets_exactly_what_certs_needs(variant: str, variants: dict[str, list[dict[str, Any]]]) -> None:
    assert rbac_permissions(CERTGEN_SERVICE_ACCOUNT, variant) == EXPECTED_CERTGEN_PERMISSIONS
    for grant in rbac_grants(variants[variant], CERTGEN_SERVICE_ACCOUNT):
        if grant.resource == "secrets":
            assert grant.namespace == NAMESPACE
            assert grant.resource_names == ({CERTS_SECRET, CA_SECRET} if grant.verb != "create" else set())
        else:
            assert grant.namespace is None and grant.resource_names == {"volcano-job-webhook"}, grant
    assert rbac_permissions(CERTGEN_SERVICE_ACCOUNT, "cert-manager") == set()


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
    # What the build stage's steps make is run and used in tests/test_install.py.


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
    for kept_out in ("certs/tls.key", "certs/ca.key", ".venv/bin/python", ".git/config", "tests/test_app.py",
                     "bench/run.py", "plugins/__pycache__/env.cpython-311.pyc", "volcano_job_webhook.egg-info/PKG-INFO"):
        assert dockerignore_excludes(kept_out, patterns), kept_out


# The install guide --------------------------------------------------------------------------------


def test_install_guide_names_real_paths_and_objects() -> None:
    text = (ROOT / "docs" / "install.md").read_text()
    for path in set(re.findall(r"(?<![\w/.])((?:manifests|examples|docs)/[\w./-]*[\w])", text)):
        assert (ROOT / path).exists(), path
    for variant in VARIANTS:
        assert f"kubectl apply -k manifests/overlays/{variant}" in text
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


def test_workload_pod_webhook_selects_only_opted_in_pods(base: list[dict[str, Any]]) -> None:
    from volcano_job_webhook.plugins import read_workload
    from volcano_job_webhook.plugins.podgen import make_pod

    webhook = mutating(base, WORKLOADS_HOOK)
    assert webhook["failurePolicy"] == "Fail" and webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["clientConfig"]["service"]["path"] == "/mutate"
    assert webhook["namespaceSelector"] == {"matchExpressions": [EXCLUDED_NAMESPACES]}
    for path in sorted((ROOT / "examples" / "workloads").glob("*.yaml")):
        job = read_workload(yaml.safe_load(path.read_text()))
        for task in job.tasks:
            pod = make_pod(job, task.name, 0)
            pod["metadata"]["name"] = "p"
            assert pod_request(webhook, pod), f"{path.name} {task.name}"
            assert not pod_request(mutating(base), pod), "the Volcano entry leaves it alone"
            del pod["metadata"]["labels"]["volcano-job-webhook/enabled"]
            assert not pod_request(webhook, pod), "a workload that did not opt in never calls us"
    both = volcano_pod()
    both["metadata"]["labels"]["volcano-job-webhook/enabled"] = "true"
    assert pod_request(mutating(base), both) and not pod_request(webhook, both), "one call per Pod"


def test_workload_validating_webhook_rules(base: list[dict[str, Any]]) -> None:
    webhook = validating(base, WORKLOADS_HOOK)
    assert webhook["rules"] == [
        {"operations": ["CREATE", "UPDATE"], "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"], "scope": "Namespaced"},
        {"operations": ["CREATE", "UPDATE"], "apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
         "resources": ["jobsets"], "scope": "Namespaced"},
    ]
    (condition,) = webhook["matchConditions"]
    assert "volcano-job-webhook/plugins" in condition["expression"]
    assert webhook["failurePolicy"] == "Ignore" and webhook["clientConfig"]["service"]["path"] == "/validate"
