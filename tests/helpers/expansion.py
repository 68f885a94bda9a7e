"""Kubernetes' ``$(NAME)`` expansion as the kubelet applies it to a container's environment: a port
of ``third_party/forked/golang/expansion/expand.go`` (:func:`expand`) and of the kubelet's
``makeEnvironmentVariables`` (:func:`container_env`), so a test sees what a variable's value will
be in the running container (``$(RANK)`` expands only when ``RANK`` comes earlier in the list)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

OPERATOR, OPENER, CLOSER = "$", "(", ")"


def mapping_func_for(*contexts: Mapping[str, str]) -> Callable[[str], str]:
    """The value of a name in the first context that has it, else the reference as written."""

    def mapping(name: str) -> str:
        for context in contexts:
            if name in context:
                return context[name]
        return f"{OPERATOR}{OPENER}{name}{CLOSER}"

    return mapping


def _read_reference(rest: str) -> tuple[str, bool, int]:
    """What follows a ``$`` (``rest``, not empty): the text read, whether it is a name to map, and
    how many characters it took."""
    if rest[0] == OPERATOR:  # "$$": an escaped operator
        return OPERATOR, False, 1
    if rest[0] == OPENER:
        closer = rest.find(CLOSER, 1)
        if closer != -1:
            return rest[1:closer], True, closer + 1
        return OPERATOR + OPENER, False, 1  # unclosed: "$(" as written, the rest read on
    return OPERATOR + rest[0], False, 1


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """``text`` with its ``$(NAME)`` references replaced through ``mapping``."""
    out: list[str] = []
    checkpoint = cursor = 0
    while cursor < len(text):
        if text[cursor] == OPERATOR and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_name, advance = _read_reference(text[cursor + 1:])
            out.append(mapping(read) if is_name else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


_LABEL_OR_ANNOTATION = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def _field(pod: Mapping[str, Any], path: str) -> str:
    """A ``fieldRef``'s value, for the fields the tests use."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"), "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"), "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"), "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    found = _LABEL_OR_ANNOTATION.match(path)
    if found:
        return str((meta.get(found.group(1)) or {}).get(found.group(2), ""))
    raise NotImplementedError(f"fieldRef {path!r}")


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], *,
                  config_maps: Mapping[str, Mapping[str, str]] | None = None,
                  secrets: Mapping[str, Mapping[str, str]] | None = None,
                  service_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the kubelet starts ``container`` of ``pod`` with. ``config_maps`` and
    ``secrets`` hold the ``data`` of each object by name (a Secret's values base64, as stored);
    ``service_env`` the service variables of the Pod's namespace."""
    config_maps, secrets, service_env = config_maps or {}, secrets or {}, service_env or {}

    def source(kind: str, ref: Mapping[str, Any]) -> Mapping[str, str] | None:
        objects = config_maps if kind == "configMap" else secrets
        data = objects.get(ref["name"])
        if data is None and not ref.get("optional"):
            raise LookupError(f"{kind} {ref['name']!r} not found")
        if data is not None and kind == "secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return data

    env: dict[str, str] = {}
    for entry in container.get("envFrom") or []:
        kind = "configMap" if "configMapRef" in entry else "secret"
        data = source(kind, entry[f"{kind}Ref"])
        for key, value in (data or {}).items():
            env[entry.get("prefix", "") + key] = value
    mapping = mapping_func_for(env, service_env)  # env grows as entries are read: later ones see earlier ones
    for entry in container.get("env") or []:
        value = entry.get("value") or ""
        ref = entry.get("valueFrom")
        if value:
            value = expand(value, mapping)
        elif ref:
            if "fieldRef" in ref:
                value = _field(pod, ref["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in ref or "secretKeyRef" in ref:
                kind = "configMap" if "configMapKeyRef" in ref else "secret"
                key_ref = ref[f"{kind}KeyRef"]
                data = source(kind, key_ref)
                if data is None or key_ref["key"] not in data:
                    if key_ref.get("optional"):
                        continue
                    raise LookupError(f"{kind} {key_ref['name']!r} has no key {key_ref['key']!r}")
                value = data[key_ref["key"]]
            else:
                raise NotImplementedError(f"valueFrom {sorted(ref)}")
        env[entry["name"]] = value
    return {**service_env, **env}
