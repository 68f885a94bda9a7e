"""Validation of produced objects against the real Kubernetes schemas (``kubernetes-validate``,
strict: unknown fields fail), plus the Pod rules the API server enforces that a JSON schema cannot
say: unique volume names, mounts of existing volumes, unique mount paths and port names, DNS labels
for hostname and subdomain, port numbers and IANA port names."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate

K8S_VERSION = "1.30"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate_object(obj: dict[str, Any]) -> None:
    """Raise AssertionError unless ``obj`` (with apiVersion and kind) fits its Kubernetes schema."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {exc.message} at {list(exc.path)}") from None


def validate_pod(pod: dict[str, Any]) -> None:
    """Schema and API-server rules for a Pod; apiVersion/kind are assumed when absent."""
    validate_object({"apiVersion": "v1", "kind": "Pod", **pod})
    spec = pod.get("spec") or {}
    for field in ("hostname", "subdomain"):
        value = spec.get(field)
        assert value is None or (len(value) <= 63 and _DNS_LABEL.match(value)), f"spec.{field} {value!r} is not a DNS-1123 label"
    volumes = [v["name"] for v in spec.get("volumes") or []]
    assert len(volumes) == len(set(volumes)), f"duplicate volume names: {volumes}"
    for v in volumes:
        assert len(v) <= 63 and _DNS_LABEL.match(v), f"volume name {v!r} is not a DNS-1123 label"
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        mounts = container.get("volumeMounts") or []
        for mount in mounts:
            assert mount["name"] in volumes, f"{container['name']}: mount of unknown volume {mount['name']!r}"
        paths = [m["mountPath"] for m in mounts]
        assert len(paths) == len(set(paths)), f"{container['name']}: duplicate mountPath in {paths}"
        ports = container.get("ports") or []
        names = [p["name"] for p in ports if p.get("name")]
        assert len(names) == len(set(names)), f"{container['name']}: duplicate port names {names}"
        for port in ports:
            assert 1 <= port["containerPort"] <= 65535, f"{container['name']}: containerPort {port['containerPort']}"
            name = port.get("name")
            assert name is None or (len(name) <= 15 and _IANA_SVC_NAME.match(name)), f"port name {name!r} is not an IANA_SVC_NAME"
