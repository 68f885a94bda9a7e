"""The side-object kinds the reconciler manages, behind one small interface over the official client,
and retries as controller-runtime users expect: 429 honours ``Retry-After``, 5xx and connection
errors back off exponentially with jitter; 404/409 and other 4xx are the caller's to handle."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException


log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Kind:
    """CRUD for one namespaced kind, on dicts: the client's typed models are turned into plain JSON."""

    kind: str
    api_version: str
    group: str
    plural: str
    api_class: type
    suffix: str  # the client's method-name stem, e.g. "config_map"

    def _call(self, api: client.ApiClient, verb: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.api_class(api), f"{verb}_{self.suffix}")
        return method(*args, _request_timeout=30, **kwargs)

    def _plain(self, api: client.ApiClient, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = api.sanitize_for_serialization(obj)
        out.setdefault("apiVersion", self.api_version)
        out.setdefault("kind", self.kind)
        return out

    def read(self, api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._plain(api, self._call(api, "read_namespaced", name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api: client.ApiClient, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        if namespace:
            result = self._call(api, "list_namespaced", namespace, label_selector=label_selector)
        else:
            method = getattr(self.api_class(api), f"list_{self.suffix}_for_all_namespaces")
            result = method(label_selector=label_selector, _request_timeout=30)
        return [self._plain(api, item) for item in result.items]

    def create(self, api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
        return self._plain(api, self._call(api, "create_namespaced", obj["metadata"]["namespace"], obj))

    def replace(self, api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self._plain(api, self._call(api, "replace_namespaced", meta["name"], meta["namespace"], obj))

    def delete(self, api: client.ApiClient, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete; False when it was already gone. ``uid`` guards against deleting a re-created object."""
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid) if uid else None)
        try:
            self._call(api, "delete_namespaced", name, namespace, body=body)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise


KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind("ConfigMap", "v1", "", "configmaps", client.CoreV1Api, "config_map"),
        Kind("Secret", "v1", "", "secrets", client.CoreV1Api, "secret"),
        Kind("Service", "v1", "", "services", client.CoreV1Api, "service"),
        Kind("NetworkPolicy", "networking.k8s.io/v1", "networking.k8s.io", "networkpolicies", client.NetworkingV1Api, "network_policy"),
    )
}


