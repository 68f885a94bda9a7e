"""The Prometheus Operator's CRDs of the kinds the chart's monitoring makes, copied unchanged into
``tests/fixtures/prometheus-operator/``: objects checked offline against their schemas as the API
server's strict field validation would (:func:`problems`), and the CRDs installed on envtest."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes import client

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus-operator"
GROUP = "monitoring.coreos.com"
KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


@functools.cache
def crds() -> dict[str, dict[str, Any]]:
    """The CRDs, by kind."""
    found = {}
    for path in sorted(FIXTURES.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        found[crd["spec"]["names"]["kind"]] = crd
    assert set(found) == set(KINDS), f"{FIXTURES}: expected the CRDs of {KINDS}, found {sorted(found)}"
    return found


def _strict(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others, as structural
    schemas are under strict field validation (``x-kubernetes-preserve-unknown-fields`` keeps one open)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _validator(kind: str, version: str) -> jsonschema.protocols.Validator:
    (served,) = [v for v in crds()[kind]["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = _strict(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
    return jsonschema.Draft7Validator(schema)


def problems(obj: Mapping[str, Any]) -> list[str]:
    """What the CRD of ``obj``'s kind finds wrong with it (empty when it validates)."""
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    kind = obj.get("kind")
    if group != GROUP or kind not in KINDS:
        return [f"not a kind of these CRDs: {obj.get('apiVersion')} {kind}"]
    try:
        validator = _validator(kind, version)
    except ValueError:
        return [f"{kind}: version {version} is not served"]
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(dict(obj)), key=lambda e: list(map(str, e.absolute_path)))]


def install_crds(api: client.ApiClient, timeout: float = 60.0) -> None:
    """The CRDs applied to a real API server, once it serves every kind."""
    from tests.helpers.envtest import install_crds as install  # not at the top: envtest imports this module

    install(api, crds().values(), timeout)
