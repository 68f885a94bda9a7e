"""Produced objects against the strict Kubernetes schemas (``kubernetes-validate``), and Pods also
against the rules of the API server's Pod validation that a schema cannot say, for the fields the
plugins touch (names, volumes and mounts, ports). Duplicate env names are legal (the last wins) and
not checked. Each failure is an AssertionError naming the object, the field and the rule."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate

K8S_VERSION = "1.30"
LABEL_MAX = 63
PORT_NAME_MAX = 15
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IANA_SVC_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HAS_LETTER = re.compile(r"[a-z]")
_VOLUME_SOURCES = frozenset(
    {
        "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
        "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk",
        "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim",
        "photonPersistentDisk", "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret",
        "storageos", "vsphereVolume",
    }
)


def _where(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')} {meta.get('namespace', '')}/{meta.get('name', '?')}"


def validate_object(obj: dict[str, Any]) -> None:
    """Raise AssertionError unless ``obj`` (with apiVersion and kind) fits its strict Kubernetes schema."""
    assert isinstance(obj, dict), f"expected an object, got {type(obj).__name__}"
    assert obj.get("apiVersion") and obj.get("kind"), f"{_where(obj)}: apiVersion and kind are required for validation"
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path) or "(root)"
        raise AssertionError(f"{_where(obj)}: {path}: {exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError:
        raise AssertionError(f"{_where(obj)}: no Kubernetes {K8S_VERSION} schema for {obj['apiVersion']} {obj['kind']}") from None


def _dns_label_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{value!r} is not a string"
    if len(value) > LABEL_MAX:
        return f"{value!r} is {len(value)} characters, over the DNS-1123 label limit of {LABEL_MAX}"
    if not _DNS_LABEL.match(value):
        return f"{value!r} is not a DNS-1123 label"
    return None


def _port_name_problem(name: str) -> str | None:
    if len(name) > PORT_NAME_MAX:
        return f"{name!r} is {len(name)} characters, over the IANA_SVC_NAME limit of {PORT_NAME_MAX}"
    if not _IANA_SVC_NAME.match(name) or "--" in name:
        return f"{name!r} is not an IANA_SVC_NAME (lower-case alphanumerics and single '-' inside)"
    if not _HAS_LETTER.search(name):
        return f"{name!r} is not an IANA_SVC_NAME (needs at least one letter)"
    return None


def validate_pod(pod: dict[str, Any]) -> None:
    """Schema and API-server rules for a Pod; ``apiVersion: v1``/``kind: Pod`` are assumed when absent."""
    full = {"apiVersion": "v1", "kind": "Pod", **pod}
    validate_object(full)
    where = _where(full)
    spec = pod.get("spec") or {}

    for field in ("hostname", "subdomain"):
        if spec.get(field) is not None:
            problem = _dns_label_problem(spec[field])
            assert problem is None, f"{where}: spec.{field}: {problem}"

    volumes: list[str] = []
    for i, volume in enumerate(spec.get("volumes") or []):
        name = volume.get("name")
        problem = _dns_label_problem(name)
        assert problem is None, f"{where}: spec.volumes[{i}].name: {problem}"
        assert name not in volumes, f"{where}: spec.volumes[{i}].name: duplicate volume name {name!r}"
        volumes.append(name)
        sources = sorted(_VOLUME_SOURCES & set(volume))
        assert len(sources) == 1, f"{where}: spec.volumes[{i}] ({name}): exactly one volume source required, got {sources}"
        for source in ("configMap", "secret"):
            mode = (volume.get(source) or {}).get("defaultMode")
            assert mode is None or 0 <= mode <= 0o777, f"{where}: spec.volumes[{i}].{source}.defaultMode {mode} is not in 0..0777"

    seen_containers: list[str] = []
    for field in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(field) or []):
            cname = container.get("name")
            at = f"{where}: spec.{field}[{i}] ({cname})"
            assert cname not in seen_containers, f"{at}: duplicate container name {cname!r}"
            seen_containers.append(cname)

            paths: list[str] = []
            for j, mount in enumerate(container.get("volumeMounts") or []):
                assert mount.get("name") in volumes, f"{at}.volumeMounts[{j}]: mount of unknown volume {mount.get('name')!r} (volumes: {volumes})"
                path = mount.get("mountPath")
                assert path not in paths, f"{at}.volumeMounts[{j}]: duplicate mountPath {path!r}"
                paths.append(path)
                sub = mount.get("subPath")
                if sub:
                    assert not sub.startswith("/") and ".." not in sub.split("/"), f"{at}.volumeMounts[{j}].subPath {sub!r} must be relative without '..'"

            port_names: list[str] = []
            for j, port in enumerate(container.get("ports") or []):
                number = port.get("containerPort")
                assert isinstance(number, int) and 1 <= number <= 65535, f"{at}.ports[{j}].containerPort {number!r} is not in 1..65535"
                name = port.get("name")
                if name:
                    problem = _port_name_problem(name)
                    assert problem is None, f"{at}.ports[{j}].name: {problem}"
                    assert name not in port_names, f"{at}.ports[{j}].name: duplicate port name {name!r} in the container"
                    port_names.append(name)
