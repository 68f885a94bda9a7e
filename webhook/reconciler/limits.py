"""The API's size limits on the objects the reconciler writes, checked before anything is sent: an
object past them would be refused (422, or etcd's "request is too large") on every retry.

* ``DATA_LIMIT``: the values of a ConfigMap's data and binaryData together, or a Secret's decoded
  data values (keys not counted): kube-apiserver's ``MaxSecretSize``, 1 MiB.
* ``STORE_LIMIT``: etcd's default ``--max-request-bytes``, 1.5 MiB; the API server stores protobuf,
  never larger than the JSON, so a JSON size under it is safe.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

# One source for both: the plugins size what they build against the same limits (plugins/budget.py).
from volcano_job_webhook.plugins.budget import DATA_LIMIT, STORE_LIMIT
from volcano_job_webhook.plugins.kinds import CONFIG_MAP, SECRET

__all__ = ["DATA_LIMIT", "STORE_LIMIT", "Oversize", "data_size", "oversize"]


@dataclass(frozen=True)
class Oversize:
    kind: str
    name: str
    size: int
    limit: int
    what: str  # which limit: "data" or "object"

    def message(self) -> str:
        measured = "its data" if self.what == "data" else "the object"
        rule = (f"the {self.limit}-byte limit on a {self.kind}'s data" if self.what == "data"
                else f"the {self.limit}-byte limit on a stored object (etcd --max-request-bytes)")
        return f"{self.kind} {self.name} not written: {measured} is {self.size} bytes, over {rule}"


def _decoded_length(value: str) -> int:
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return len(value)


def data_size(obj: dict[str, Any]) -> int:
    if obj.get("kind") == SECRET.kind:
        return sum(_decoded_length(v) for v in (obj.get("data") or {}).values()) + sum(
            len(v.encode()) for v in (obj.get("stringData") or {}).values())
    return sum(len(v.encode()) for v in (obj.get("data") or {}).values()) + sum(
        _decoded_length(v) for v in (obj.get("binaryData") or {}).values())


def oversize(obj: dict[str, Any]) -> Oversize | None:
    """Why ``obj`` cannot be stored, or None."""
    kind, name = obj.get("kind", ""), (obj.get("metadata") or {}).get("name", "")
    if kind in (CONFIG_MAP.kind, SECRET.kind):
        size = data_size(obj)
        if size > DATA_LIMIT:
            return Oversize(kind, name, size, DATA_LIMIT, "data")
    size = len(orjson.dumps(obj))
    if size > STORE_LIMIT:
        return Oversize(kind, name, size, STORE_LIMIT, "object")
    return None
