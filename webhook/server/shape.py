"""The types of the Pod fields the plugins read or write, checked before the chain: the webhook's
port is reachable by anyone and the plugins take the Pod's shape on trust, so a damaged Pod gets a
400 naming the field rather than an internal error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Per container: field -> (JSON type, for lists the type of each item).
_CONTAINER_FIELDS: dict[str, tuple[type, type | None]] = {
    "name": (str, None),
    "image": (str, None),
    "command": (list, str),
    "args": (list, str),
    "workingDir": (str, None),
    "env": (list, dict),
    "ports": (list, dict),
    "volumeMounts": (list, dict),
}
_ITEM_FIELDS: dict[str, dict[str, type]] = {
    "env": {"name": str, "value": str, "valueFrom": dict},
    "ports": {"name": str, "containerPort": int, "protocol": str},
    "volumeMounts": {"name": str, "mountPath": str, "subPath": str},
}
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def _wrong(value: Any, kind: type) -> bool:
    if kind is int:
        return type(value) is not int  # bool is not an integer here
    return not isinstance(value, kind)


def _problems(pod: dict[str, Any]) -> Iterator[str]:
    meta = pod.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            yield "metadata: must be an object"
            return
        if meta.get("name") is not None and not isinstance(meta["name"], str):
            yield "metadata.name: must be a string"
        for field in ("labels", "annotations"):
            values = meta.get(field)
            if values is None:
                continue
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                yield f"metadata.{field}: must be an object of strings"
    spec = pod.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        yield "spec: must be an object"
        return
    for field in ("hostname", "subdomain"):
        if spec.get(field) is not None and not isinstance(spec[field], str):
            yield f"spec.{field}: must be a string"
    volumes = spec.get("volumes")
    if volumes is not None and (not isinstance(volumes, list) or not all(isinstance(v, dict) for v in volumes)):
        yield "spec.volumes: must be a list of objects"
    elif volumes:
        for i, volume in enumerate(volumes):
            if volume.get("name") is not None and not isinstance(volume["name"], str):
                yield f"spec.volumes[{i}].name: must be a string"
    for list_field in ("containers", "initContainers"):
        found = spec.get(list_field)
        if found is None:
            continue
        if not isinstance(found, list):
            yield f"spec.{list_field}: must be a list of objects"
            continue
        for i, container in enumerate(found):
            where = f"spec.{list_field}[{i}]"
            if not isinstance(container, dict):
                yield f"{where}: must be an object"
                continue
            for field, (kind, item_kind) in _CONTAINER_FIELDS.items():
                value = container.get(field)
                if value is None:
                    continue
                if _wrong(value, kind):
                    yield f"{where}.{field}: must be {_TYPE_NAMES[kind]}"
                    continue
                if item_kind is None:
                    continue
                for j, item in enumerate(value):
                    if _wrong(item, item_kind):
                        yield f"{where}.{field}[{j}]: must be {_TYPE_NAMES[item_kind]}"
                        break
                    for key, key_kind in _ITEM_FIELDS.get(field, {}).items():
                        if item.get(key) is not None and _wrong(item[key], key_kind):
                            yield f"{where}.{field}[{j}].{key}: must be {_TYPE_NAMES[key_kind]}"


def pod_shape_problem(pod: dict[str, Any]) -> str | None:
    """The first field of ``pod`` (a dict) whose type the Pod API does not allow, as
    ``"field: must be ..."``; None when the fields the plugins use are well typed."""
    return next(_problems(pod), None)
