"""The Prometheus Operator's CRDs of the kinds the chart's monitoring makes (ServiceMonitor, PodMonitor,
PrometheusRule), as data: ``tests/fixtures/prometheus-operator/``, copied unchanged from the
operator's repository (each file's first line names the tag and commit).

* :func:`problems`: an object of those kinds against its CRD's ``openAPIV3Schema``, as the API server
  judges it with strict field validation (an unknown field is an error, as ``kubectl`` asks by
  default), offline;
* :func:`install_crds`: the CRDs created on a real API server (envtest), waiting until each kind is
  served.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import jsonschema
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prometheus-operator"
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
    """Create the CRDs (an existing one is left as it is) and wait until every kind is served."""
    extensions = client.ApiextensionsV1Api(api)
    for crd in crds().values():
        try:
            extensions.create_custom_resource_definition(cast(Any, crd))  # the client takes a dict as it is
        except ApiException as exc:
            if exc.status != 409:
                raise
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    for crd in crds().values():
        plural = crd["spec"]["names"]["plural"]
        version = next(v["name"] for v in crd["spec"]["versions"] if v["storage"])
        while True:
            try:
                custom.list_cluster_custom_object(GROUP, version, plural, limit=1)
                break
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
