"""Long values of a ConfigMap's or Secret's data (host files, SSH keys) as digests: what the reconciler's
caches keep and compare instead of the values, and how it recognises one a plugin handed back."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from volcano_job_webhook.plugins.base import Digest

# Values of a ConfigMap's or Secret's data longer than this are kept as a digest (host files, keys).
DIGEST_OVER = 64
_DIGEST_PREFIX = "\x00digest:"
_DATA_MAPS = ("data", "binaryData", "stringData")


def digest(value: str) -> Digest:
    return Digest(_DIGEST_PREFIX + hashlib.blake2b(value.encode(), digest_size=16).hexdigest())


def digested(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with every long value of its data maps replaced by its :class:`Digest` (a shallow
    copy where anything changes): what the reconciler compares, and what it keeps."""
    out = obj
    for field in _DATA_MAPS:
        data = obj.get(field)
        if not isinstance(data, Mapping):
            continue
        if any(isinstance(v, str) and len(v) > DIGEST_OVER and not isinstance(v, Digest) for v in data.values()):
            if out is obj:
                out = dict(obj)
            out[field] = {k: digest(v) if isinstance(v, str) and len(v) > DIGEST_OVER and not isinstance(v, Digest) else v
                          for k, v in data.items()}
    return out


def undigested(obj: dict[str, Any]) -> dict[str, Any]:
    """Digests read back from packed JSON (where they are plain strings) as :class:`Digest`."""
    for field in _DATA_MAPS:
        data = obj.get(field)
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, str) and value.startswith(_DIGEST_PREFIX):
                    data[key] = Digest(value)
    return obj


def has_digests(obj: Mapping[str, Any]) -> bool:
    return any(isinstance(v, Digest) for field in _DATA_MAPS for v in (obj.get(field) or {}).values())
