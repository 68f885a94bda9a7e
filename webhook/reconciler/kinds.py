"""The kinds the reconciler owns, how it recognises its own objects, and what of them it caches."""

from __future__ import annotations

from typing import Any

from volcano_job_webhook.kube.informer import without_managed_fields
from volcano_job_webhook.kube.rest import Resource
from volcano_job_webhook.plugins.keys import (
    JOB_GROUP,
    JOB_KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    JobKey,
)

from .compare import OWNED_FIELDS, owned_paths

# The field manager of every write (creates, applies, merge patches): what it set is ours to remove.
FIELD_MANAGER = MANAGED_BY
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

OWNED: dict[str, Resource] = {
    r.kind: r
    for r in (
        Resource("ConfigMap", "v1", "configmaps"),
        Resource("Secret", "v1", "secrets"),
        Resource("Service", "v1", "services"),
        Resource("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies"),
    )
}
EVENT = Resource("Event", "v1", "events")


def managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def owner_job(obj: dict[str, Any]) -> JobKey | None:
    """The Volcano Job that controls ``obj``, by (namespace, name)."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == JOB_KIND and str(ref.get("apiVersion", "")).startswith(f"{JOB_GROUP}/"):
            return (meta.get("namespace") or "default", str(ref.get("name")))
    return None


def cached_form(obj: dict[str, Any]) -> dict[str, Any]:
    """What the reconciler keeps of an owned object: all of it but ``managedFields``, of which only
    the paths our field manager set are kept (under ``OWNED_FIELDS``), to tell what of ours the
    desired object no longer has."""
    fields = (obj.get("metadata") or {}).get("managedFields") or []
    obj[OWNED_FIELDS] = owned_paths(fields, FIELD_MANAGER)
    return without_managed_fields(obj)
