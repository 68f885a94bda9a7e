"""The API's size limits on the objects the reconciler writes, checked before anything is sent: past
them an object would be refused on every retry. ``DATA_LIMIT`` is kube-apiserver's ``MaxSecretSize``
(a ConfigMap's data and binaryData values, a Secret's decoded data); ``STORE_LIMIT`` etcd's default
``--max-request-bytes`` (the JSON size bounds the stored protobuf)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

# One source for both: the plugins size what they build against the same limits (plugins/budget.py).
from volcano_job_webhook.plugins.budget import DATA_LIMIT, STORE_LIMIT
from volcano_job_webhook.plugins.kinds import CONFIG_MAP, SECRET


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


def oversize(obj: dict[str, Any]) -> str | None:
    """Why ``obj`` cannot be stored, in a sentence naming it, its size and the limit; None when it can."""
    kind, name = obj.get("kind", ""), (obj.get("metadata") or {}).get("name", "")
    if kind in (CONFIG_MAP.kind, SECRET.kind) and (size := data_size(obj)) > DATA_LIMIT:
        return f"{kind} {name} not written: its data is {size} bytes, over the {DATA_LIMIT}-byte limit on a {kind}'s data"
    if (size := len(orjson.dumps(obj))) > STORE_LIMIT:
        return (f"{kind} {name} not written: the object is {size} bytes, over the {STORE_LIMIT}-byte limit on a stored object "
                "(etcd --max-request-bytes)")
    return None
