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


def _job_reference(obj: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == JOB_KIND and str(ref.get("apiVersion", "")).startswith(f"{JOB_GROUP}/"):
            return dict(ref)
    return None


def owner_job(obj: dict[str, Any]) -> JobKey | None:
    """The Volcano Job that controls ``obj``, by (namespace, name): whose reconcile an event on it
    queues. Which Job that is, of all that ever had the name, says :func:`owner_uid`."""
    ref = _job_reference(obj)
    if ref is None:
        return None
    return ((obj.get("metadata") or {}).get("namespace") or "default", str(ref.get("name")))


def owner_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the Volcano Job that controls ``obj``: a Job deleted and made again under the same
    name is another Job, whose objects these are not."""
    ref = _job_reference(obj)
    return None if ref is None else ref.get("uid")


def cached_form(obj: dict[str, Any]) -> dict[str, Any]:
    """What the reconciler keeps of an owned object: all of it but ``managedFields``, of which only
    the paths our field manager set are kept (under ``OWNED_FIELDS``), to tell what of ours the
    desired object no longer has."""
    fields = (obj.get("metadata") or {}).get("managedFields") or []
    obj[OWNED_FIELDS] = owned_paths(fields, FIELD_MANAGER)
    return without_managed_fields(obj)
