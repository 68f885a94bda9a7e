"""AdmissionReview ``admission.k8s.io/v1`` and ``v1beta1`` as pydantic models: what the routes
parse, what their OpenAPI schema shows, and the answer with the request's ``uid`` echoed (a
response with no change carries no patch fields at all, never a ``null`` patch)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
# The API server shows at most this many bytes per warning; longer ones are cut there anyway.
WARNING_MAX = 256


class ReviewError(ValueError):
    """The body is not an AdmissionReview we can answer (HTTP 400)."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str = Field(min_length=1)


class AdmissionRequest(_Model):
    """The fields of ``request`` the handlers read; ``object`` and ``oldObject`` as decoded."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    sub_resource: str = ""
    operation: str = Field(min_length=1)
    namespace: str = ""
    name: str = ""
    object: Any = None
    old_object: Any = None


class ReviewStatus(_Model):
    status: Literal["Failure"]
    code: int
    message: str


class ReviewResponse(_Model):
    uid: str
    allowed: bool
    patch_type: Literal["JSONPatch"] | None = None
    patch: str | None = Field(None, description="the JSON patch, base64")
    status: ReviewStatus | None = None
    warnings: list[str] | None = None


class AdmissionReview(_Model):
    """The API server sends ``request``; the webhook answers ``response``."""

    api_version: Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest | None = None
    response: ReviewResponse | None = None


@dataclass
class AdmissionResponse:
    """What a handler decides: allowed or not, an optional JSON patch, warnings, a denial message."""

    allowed: bool
    patch: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    code: int = 403
    # Why, in one word, for metrics and logs (allowed, patched, denied, no-job, ignored, ...).
    result: str = "allowed"

    @classmethod
    def allow(cls, result: str = "allowed", warnings: list[str] | None = None) -> AdmissionResponse:
        return cls(allowed=True, warnings=warnings or [], result=result)

    @classmethod
    def deny(cls, message: str, code: int = 403, result: str = "denied") -> AdmissionResponse:
        return cls(allowed=False, message=message, code=code, result=result)


def read_review(body: bytes | Any) -> AdmissionReview:
    """The AdmissionReview in ``body`` (JSON, or already decoded), with a ``request``; raises
    :class:`ReviewError` naming the field."""
    try:
        if isinstance(body, bytes):
            review = AdmissionReview.model_validate_json(body)
        else:
            review = AdmissionReview.model_validate(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] == "json_invalid":
            raise ReviewError(f"not JSON: {error['msg'].removeprefix('Invalid JSON: ')}") from None
        raise ReviewError(f"{'.'.join(map(str, error['loc'])) or 'body'}: {error['msg']}") from None
    if review.request is None:
        raise ReviewError("request: Field required")
    return review


def review_response(review: AdmissionReview, response: AdmissionResponse) -> dict[str, Any]:
    """The AdmissionReview to send back, in the request's API version."""
    assert review.request is not None
    out: dict[str, Any] = {"uid": review.request.uid, "allowed": response.allowed}
    if response.allowed and response.patch:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(orjson.dumps(response.patch)).decode()
    if not response.allowed:
        out["status"] = {"status": "Failure", "code": response.code, "message": response.message}
    if response.warnings:
        out["warnings"] = [w if len(w) <= WARNING_MAX else w[: WARNING_MAX - 3] + "..." for w in response.warnings]
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": out}
def admission_review(obj: dict[str, Any], *, api_version: str = API_VERSIONS[0], uid: str, operation: str = "CREATE",
                     old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The AdmissionReview the API server sends for ``obj`` (a Pod or a Volcano Job); ``old`` is
    the object before an UPDATE."""
    meta = obj.get("metadata") or {}
    api_group, _, version = str(obj.get("apiVersion") or "v1").rpartition("/")
    kind = str(obj.get("kind") or "Pod")
    resource = {"Pod": "pods", "Job": "jobs"}.get(kind, kind.lower() + "s")
    gvk = {"group": api_group, "version": version, "kind": kind}
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": {"group": api_group, "version": version, "resource": resource},
            "requestKind": gvk,
            "requestResource": {"group": api_group, "version": version, "resource": resource},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:volcano-system:volcano-controllers"},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions" if operation == "UPDATE" else "CreateOptions"},
        },
    }
