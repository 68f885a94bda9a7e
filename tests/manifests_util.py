"""The install manifests (``manifests/``) as ``kubectl apply -k`` would see them, without kustomize.

No kustomize binary is available to the tests, so :func:`build` does the part of ``kustomize build``
these manifests use — ``resources`` (files and directories), ``components`` (``kind: Component``
directories, applied to everything accumulated so far, as kustomize does), ``namespace``,
``patches``, ``patchesStrategicMerge``, ``patchesJson6902`` — and refuses any other kustomization
field, so it can never silently build something different from kustomize. Strategic-merge patches are applied as a
recursive map merge and may not contain lists (kustomize merges lists by key, which is not modelled).

Also here, for the other tests:

* :func:`selector_matches`: Kubernetes label-selector semantics (``matchLabels``, ``matchExpressions``
  with ``In``/``NotIn``/``Exists``/``DoesNotExist``);
* :func:`rbac_permissions`: the ``(apiGroup, resource, verb)`` triples a ServiceAccount is granted by
  the Roles and ClusterRoles bound to it — to compare with the API calls the code makes.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
OVERLAYS = MANIFESTS / "overlays"
COMPONENTS = MANIFESTS / "components"
VARIANTS: dict[str, Path] = {
    "cert-manager": OVERLAYS / "cert-manager",
    "self-managed": OVERLAYS / "self-managed",
    "split": OVERLAYS / "split",
}
DEFAULT_VARIANT = "self-managed"  # what manifests/kustomization.yaml installs

NAMESPACE = "volcano-job-webhook"
SERVICE_ACCOUNT = "volcano-job-webhook"
CERTGEN_SERVICE_ACCOUNT = "volcano-job-webhook-certgen"
RECONCILER_SERVICE_ACCOUNT = "volcano-job-webhook-reconciler"  # the split variant's reconciler

# Kinds without a namespace, among those these manifests use or might.
CLUSTER_SCOPED = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "CustomResourceDefinition", "PriorityClass", "StorageClass", "ClusterIssuer", "APIService",
})
KUSTOMIZATION_FIELDS = frozenset({
    "apiVersion", "kind", "namespace", "resources", "components", "patches", "patchesStrategicMerge", "patchesJson6902",
})
KINDS = {"Kustomization": "kustomize.config.k8s.io/v1beta1", "Component": "kustomize.config.k8s.io/v1alpha1"}
TARGET_FIELDS = frozenset({"group", "version", "kind", "name", "namespace", "labelSelector", "annotationSelector"})


class KustomizeError(Exception):
    """A kustomization that ``kustomize build`` would reject, or that this model cannot build."""


# Reading ----------------------------------------------------------------------------------------


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a file."""
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.load_all(f, Loader=_Loader) if doc is not None]


def read_kustomization(directory: Path) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    docs = load_documents(path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise KustomizeError(f"{path}: expected one mapping")
    k = docs[0]
    if KINDS.get(k.get("kind", "")) != k.get("apiVersion"):
        raise KustomizeError(f"{path}: neither a kustomize.config.k8s.io/v1beta1 Kustomization nor a v1alpha1 Component")
    unknown = set(k) - KUSTOMIZATION_FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields this model does not build: {sorted(unknown)}")
    return k


def kustomization_dirs(root: Path = MANIFESTS, *, components: bool = True) -> list[Path]:
    """Every directory with a kustomization.yaml; ``components=False`` leaves out Components."""
    dirs = sorted(p.parent for p in root.rglob("kustomization.yaml"))
    return dirs if components else [d for d in dirs if read_kustomization(d)["kind"] != "Component"]


def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def object_id(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name): what kustomize requires to be unique in a build."""
    meta = obj.get("metadata") or {}
    return (api_group(obj.get("apiVersion", "")), obj.get("kind", ""), meta.get("namespace") or "", meta.get("name") or "")


def describe(obj: Mapping[str, Any]) -> str:
    group, kind, namespace, name = object_id(obj)
    return f"{kind}.{group or 'core'} {namespace + '/' if namespace else ''}{name}"


# Patches ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Patch:
    """One patch of a kustomization: a strategic-merge patch (a mapping) or an RFC 6902 patch (a list)."""

    origin: str  # file path or "<inline patch>", for messages
    body: Any
    target: Mapping[str, Any] | None
    after_namespace: bool = False  # patchesJson6902 entries run after the namespace transformer

    @property
    def is_json6902(self) -> bool:
        return isinstance(self.body, list)

    def selector(self) -> dict[str, Any]:
        """The target, or for a strategic-merge patch without one, its own kind, name (and namespace)."""
        if self.target is not None:
            unknown = set(self.target) - TARGET_FIELDS
            if unknown:
                raise KustomizeError(f"{self.origin}: unknown target fields {sorted(unknown)}")
            return dict(self.target)
        if self.is_json6902:
            raise KustomizeError(f"{self.origin}: a JSON 6902 patch needs a target")
        meta = self.body.get("metadata") or {}
        if not self.body.get("kind") or not meta.get("name"):
            raise KustomizeError(f"{self.origin}: a patch without target must name its kind and metadata.name")
        selector = {"kind": self.body["kind"], "name": meta["name"]}
        if "apiVersion" in self.body:
            selector["group"] = api_group(self.body["apiVersion"])
        if meta.get("namespace"):
            selector["namespace"] = meta["namespace"]
        return selector


def _parse_patch_text(text: str, origin: str) -> Any:
    docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    if len(docs) != 1:
        raise KustomizeError(f"{origin}: expected one patch document, found {len(docs)}")
    return docs[0]


def patches_of(directory: Path, kustomization: Mapping[str, Any] | None = None) -> list[Patch]:
    """The patches of a kustomization, in the order kustomize applies them."""
    k = kustomization if kustomization is not None else read_kustomization(directory)
    out: list[Patch] = []
    for entry in k.get("patchesStrategicMerge") or []:
        path = directory / entry
        if not path.is_file():
            raise KustomizeError(f"{directory}: patchesStrategicMerge file {entry} does not exist")
        out.append(Patch(str(path), _parse_patch_text(path.read_text(encoding="utf-8"), str(path)), None))
    for entry in k.get("patches") or []:
        if not isinstance(entry, Mapping) or ("path" in entry) == ("patch" in entry):
            raise KustomizeError(f"{directory}: a patches entry needs exactly one of path, patch: {entry!r}")
        if "path" in entry:
            path = directory / entry["path"]
            if not path.is_file():
                raise KustomizeError(f"{directory}: patch file {entry['path']} does not exist")
            origin, text = str(path), path.read_text(encoding="utf-8")
        else:
            origin, text = f"{directory}/<inline patch>", entry["patch"]
        out.append(Patch(origin, _parse_patch_text(text, origin), entry.get("target")))
    for entry in k.get("patchesJson6902") or []:
        path = directory / entry.get("path", "")
        if "path" not in entry or not path.is_file():
            raise KustomizeError(f"{directory}: patchesJson6902 file {entry.get('path')} does not exist")
        body = _parse_patch_text(path.read_text(encoding="utf-8"), str(path))
        if not isinstance(body, list):
            raise KustomizeError(f"{path}: a patchesJson6902 file must hold a list of operations")
        out.append(Patch(str(path), body, entry.get("target"), after_namespace=True))
    return out


def _matches_string_selector(selector: str, values: Mapping[str, str]) -> bool:
    """kustomize's labelSelector/annotationSelector strings: equality-based terms only."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if m := re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term):
            key, op, value = m.groups()
            if (values.get(key) == value) != (op != "!="):
                return False
        elif m := re.fullmatch(r"(!?)([^=!\s()]+)", term):
            if (m.group(2) in values) == bool(m.group(1)):
                return False
        else:
            raise KustomizeError(f"selector term {term!r}: only equality-based terms are modelled")
    return True


def target_matches(selector: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    """kustomize's patch-target rule: group, version, kind, name, namespace are anchored regular
    expressions; label and annotation selectors are selector strings."""
    api_version = obj.get("apiVersion", "")
    meta = obj.get("metadata") or {}
    fields = {
        "group": api_group(api_version),
        "version": api_version.rpartition("/")[2],
        "kind": obj.get("kind", ""),
        "name": meta.get("name") or "",
        "namespace": meta.get("namespace") or "",
    }
    for key, actual in fields.items():
        if key in selector and selector[key] is not None and not re.fullmatch(str(selector[key]), actual):
            return False
    if selector.get("labelSelector") and not _matches_string_selector(selector["labelSelector"], meta.get("labels") or {}):
        return False
    if selector.get("annotationSelector"):
        return _matches_string_selector(selector["annotationSelector"], meta.get("annotations") or {})
    return True


def strategic_merge(target: Any, patch: Any, where: str = "") -> Any:
    """A strategic-merge patch made only of maps: maps merge key by key, ``null`` deletes a key,
    scalars replace. Lists (merged by key in kustomize) and ``$patch`` directives are refused."""
    if isinstance(patch, Mapping):
        if any(str(k).startswith("$") for k in patch):
            raise KustomizeError(f"{where or '/'}: strategic-merge directives are not modelled")
        out = dict(target) if isinstance(target, Mapping) else {}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(out.get(key), value, f"{where}/{key}")
        return out
    if isinstance(patch, list):
        raise KustomizeError(f"{where}: lists in strategic-merge patches are not modelled (merge keys)")
    return patch


def apply_patch(patch: Patch, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply one patch to every object its target selects; a patch that selects nothing is an error."""
    selector = patch.selector()
    hits = [i for i, obj in enumerate(objects) if target_matches(selector, obj)]
    if not hits:
        raise KustomizeError(f"{patch.origin}: target {selector} matches no object")
    if not patch.is_json6902 and patch.target is None and len(hits) > 1:
        raise KustomizeError(f"{patch.origin}: target {selector} is not unique")
    out = list(objects)
    for i in hits:
        if patch.is_json6902:
            out[i] = jsonpatch.JsonPatch(patch.body).apply(copy.deepcopy(objects[i]))
        else:
            body = dict(patch.body)
            if patch.target is not None:  # the target names the object; the patch's own id is not used
                body.pop("apiVersion", None)
                body.pop("kind", None)
                body["metadata"] = {k: v for k, v in (body.get("metadata") or {}).items() if k not in ("name", "namespace")}
            else:
                body = {k: v for k, v in body.items() if k not in ("apiVersion", "kind")}
            out[i] = strategic_merge(copy.deepcopy(objects[i]), body)
    return out


# Building ---------------------------------------------------------------------------------------


def build(directory: Path, _seen: tuple[Path, ...] = (), _accumulated: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``kustomize build directory``, for the fields listed in :data:`KUSTOMIZATION_FIELDS`.

    A Component is built only as part of a Kustomization that lists it (``_accumulated`` is then
    what that one had gathered: the component adds its resources to it and patches all of it)."""
    directory = directory.resolve()
    if directory in _seen:
        raise KustomizeError(f"{directory}: cycle through {[str(p) for p in _seen]}")
    k = read_kustomization(directory)
    if (k["kind"] == "Component") != (_accumulated is not None):
        raise KustomizeError(f"{directory}: a Component is listed under components, a Kustomization is not")
    objects: list[dict[str, Any]] = list(_accumulated or [])
    for entry in k.get("resources") or []:
        path = directory / entry
        if path.is_dir():
            objects += build(path, (*_seen, directory))
        elif path.is_file():
            objects += load_documents(path)
        else:
            raise KustomizeError(f"{directory}: resource {entry} does not exist")
    # kustomize applies components after the resources, before this kustomization's own patches.
    for entry in k.get("components") or []:
        path = directory / entry
        if not path.is_dir():
            raise KustomizeError(f"{directory}: component {entry} does not exist")
        objects = build(path, (*_seen, directory), objects)
    # kustomize's built-in order: strategic-merge patches and patches, then namespace, then
    # patchesJson6902 files.
    patches = patches_of(directory, k)
    for patch in patches:
        if not patch.after_namespace:
            objects = apply_patch(patch, objects)
    namespace = k.get("namespace")
    if namespace:
        objects = [_set_namespace(obj, namespace) for obj in objects]
    for patch in patches:
        if patch.after_namespace:
            objects = apply_patch(patch, objects)
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        if object_id(obj) in seen:
            raise KustomizeError(f"{directory}: {describe(obj)} is defined twice")
        seen.add(object_id(obj))
    return objects


def _set_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    if obj.get("kind") in CLUSTER_SCOPED:
        return obj
    out = copy.deepcopy(obj)
    out.setdefault("metadata", {})["namespace"] = namespace
    return out


def build_variant(name: str) -> list[dict[str, Any]]:
    return build(MANIFESTS if name == "default" else VARIANTS[name])


def find(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def find_one(objects: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = find(objects, kind, name)
    if len(hits) != 1:
        raise LookupError(f"expected one {kind} {name}, found {len(hits)}")
    return hits[0]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


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
    is the webhook's and the reconciler's in every variant but ``split``, where it is the webhook's
    alone and the reconciler has its own."""
    return {(g.api_group, g.resource, g.verb) for g in rbac_grants(build_variant(variant), service_account, namespace)}


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
