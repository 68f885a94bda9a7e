"""What the tests read out of the rendered install manifests (kustomize's or the chart's): objects, the
settings ConfigMap, schema problems, label selectors and webhook rules, RBAC grants, the image's
build files. Label selectors are matched here for every helper (tests/helpers/network_policy.py's too)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from kubernetes_validate.utils import latest_version, major_minor

from tests.helpers import prometheus_operator
from tests.helpers.kustomize import DEFAULT_VARIANT, ROOT, build_variant, documents

NAMESPACE = "volcano-job-webhook"
SERVICE_ACCOUNT = "volcano-job-webhook"
RECONCILER_SERVICE_ACCOUNT = "volcano-job-webhook-reconciler"  # the split variants' reconciler
SETTINGS_CONFIGMAP = "volcano-job-webhook-config"  # kustomize's generator appends a hash
SETTINGS_DIR = "/etc/volcano-job-webhook"  # where both containers mount it
CONFIG_ENV = "VOLCANO_WEBHOOK_CONFIG"

# Kinds without a namespace, among those these manifests use or might.
CLUSTER_SCOPED = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "CustomResourceDefinition", "PriorityClass", "StorageClass", "ClusterIssuer", "APIService",
})

# The Kubernetes versions whose schemas every rendering is checked against: the oldest supported, the newest known.
K8S_VERSIONS = ["1.30", major_minor(latest_version())]


# Reading ----------------------------------------------------------------------------------------


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a file."""
    return documents(path.read_text(encoding="utf-8"))


def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def object_id(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name): what kustomize requires to be unique in a build."""
    meta = obj.get("metadata") or {}
    return (api_group(obj.get("apiVersion", "")), obj.get("kind", ""), meta.get("namespace") or "", meta.get("name") or "")


def describe(obj: Mapping[str, Any]) -> str:
    group, kind, namespace, name = object_id(obj)
    return f"{kind}.{group or 'core'} {namespace + '/' if namespace else ''}{name}"


def find(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def find_one(objects: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = find(objects, kind, name)
    if len(hits) != 1:
        raise LookupError(f"expected one {kind} {name}, found {len(hits)}")
    return hits[0]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# The settings ConfigMap ---------------------------------------------------------------------------


def settings_configmap(objects: Iterable[Mapping[str, Any]], deployment: str = "volcano-job-webhook") -> dict[str, Any]:
    """The ConfigMap the webhook's Deployment mounts at :data:`SETTINGS_DIR` (by its generated name
    in a kustomize build)."""
    objects = list(objects)
    pod = find_one(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    (webhook,) = [c for c in pod["containers"] if c["name"] == "webhook"]
    (mount,) = [m for m in webhook["volumeMounts"] if m["mountPath"] == SETTINGS_DIR]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return find_one(objects, "ConfigMap", volume["configMap"]["name"])


def settings(objects: Iterable[Mapping[str, Any]], deployment: str = "volcano-job-webhook") -> dict[str, Any]:
    """``config.yaml`` of the settings ConfigMap: what both processes read."""
    loaded = yaml.safe_load(settings_configmap(objects, deployment)["data"]["config.yaml"])
    assert isinstance(loaded, dict)
    return loaded


def webhook_configurations(objects: Iterable[Mapping[str, Any]], deployment: str = "volcano-job-webhook") -> list[dict[str, Any]]:
    """``webhooks.yaml`` of the settings ConfigMap: the Mutating- and ValidatingWebhookConfiguration
    the reconciler registers, as written (no caBundle)."""
    loaded = yaml.safe_load(settings_configmap(objects, deployment)["data"]["webhooks.yaml"])
    assert isinstance(loaded, list)
    return loaded


# Label selectors ----------------------------------------------------------------------------------


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """Kubernetes ``metav1.LabelSelector`` semantics. A missing or empty selector matches everything
    (as an admission webhook's objectSelector/namespaceSelector does); ``NotIn`` and ``DoesNotExist``
    match when the key is absent. A malformed selector raises ValueError, as the API server rejects it."""
    labels = labels or {}
    if not selector:
        return True
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"unknown selector fields {sorted(unknown)}")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op in ("In", "NotIn"):
            if not values:
                raise ValueError(f"{key} {op}: values must be non-empty")
            present = key in labels and labels[key] in values
            if present != (op == "In"):
                return False
        elif op in ("Exists", "DoesNotExist"):
            if values:
                raise ValueError(f"{key} {op}: values must be empty")
            if (key in labels) != (op == "Exists"):
                return False
        else:
            raise ValueError(f"{key}: unknown operator {op!r}")
    return True


def rule_matches(rules: Iterable[Mapping[str, Any]], *, group: str, version: str, resource: str, operation: str) -> bool:
    """Whether a webhook's ``rules`` select a request (``*`` wildcards honoured; no subresources)."""
    def has(values: Iterable[str], value: str) -> bool:
        values = list(values)
        return "*" in values or value in values

    return any(
        has(r.get("operations", []), operation) and has(r.get("apiGroups", []), group)
        and has(r.get("apiVersions", []), version) and has(r.get("resources", []), resource)
        for r in rules
    )


# RBAC ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One verb on one resource, as granted: ``namespace`` None for cluster-wide, else the Role's
    namespace; ``resource_names`` empty for every object of the resource."""

    namespace: str | None
    api_group: str
    resource: str
    verb: str
    resource_names: frozenset[str]


def rbac_grants(
    objects: Iterable[Mapping[str, Any]], service_account: str = SERVICE_ACCOUNT, namespace: str = NAMESPACE
) -> list[Grant]:
    """What the Role- and ClusterRoleBindings among ``objects`` grant to one ServiceAccount."""
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o.get("kind") in ("Role", "ClusterRole")}
    grants: list[Grant] = []
    for binding in objects:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == service_account and s.get("namespace") == namespace
            for s in binding.get("subjects") or []
        ):
            continue
        ref = binding["roleRef"]
        binding_ns = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        key = (ref["kind"], binding_ns if ref["kind"] == "Role" else None, ref["name"])
        if key not in roles:
            raise LookupError(f"{describe(binding)} refers to missing {ref['kind']} {ref['name']}")
        for rule in roles[key].get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        grants.append(Grant(binding_ns, group, resource, verb, frozenset(rule.get("resourceNames") or ())))
    return grants


def rbac_permissions(
    service_account: str = SERVICE_ACCOUNT, variant: str = DEFAULT_VARIANT, namespace: str = NAMESPACE
) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples granted to ``service_account`` in an install variant,
    whatever the scope or resourceNames; ``""`` is the core group. ServiceAccount volcano-job-webhook
    is the webhook's and the reconciler's in every variant but the split ones, where it is the
    webhook's alone and the reconciler has its own."""
    return {(g.api_group, g.resource, g.verb) for g in rbac_grants(build_variant(variant), service_account, namespace)}


# Schemas ------------------------------------------------------------------------------------------


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
    """What the strict schema of Kubernetes ``version`` (kubernetes-validate) finds wrong with ``obj``."""
    if obj.get("apiVersion", "").startswith("cert-manager.io/"):
        return cert_manager_problems(obj)
    if obj.get("apiVersion", "").startswith(f"{prometheus_operator.GROUP}/"):
        return prometheus_operator.problems(obj)
    try:
        kubernetes_validate.validate(dict(obj), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


# The image ----------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[":
                j = pattern.index("]", i)
                out, i = out + pattern[i:j + 1], j + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out)

    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.lstrip("!").strip().strip("/")
        if any(regex(pattern).fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded
