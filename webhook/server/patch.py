"""RFC 6902 JSON patches that address only what changed (lists appended to with ``/-``, values
replaced in place), so changes other mutating webhooks made to the Pod survive
(docs/volcano-behaviour.md#admission-answer)."""

from __future__ import annotations

from typing import Any

Operation = dict[str, Any]


def escape(key: str) -> str:
    """RFC 6901 escaping of one path segment: ``~`` → ``~0``, ``/`` → ``~1``."""
    if "~" not in key and "/" not in key:
        return key
    return key.replace("~", "~0").replace("/", "~1")


def make_patch(old: Any, new: Any) -> list[Operation]:
    """Operations that turn ``old`` into ``new``; ``[]`` when they are equal."""
    ops: list[Operation] = []
    if old != new:
        _diff_unequal(old, new, "", ops)
    return ops


def _diff_unequal(old: Any, new: Any, path: str, ops: list[Operation]) -> None:
    # Children are compared before recursing, so equal subtrees (most of a Pod) cost one C-level
    # comparison each and no path string.
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
            elif old[key] != value:
                _diff_unequal(old[key], value, f"{path}/{escape(key)}", ops)
        return
    if isinstance(old, list) and isinstance(new, list) and len(new) >= len(old):
        appended = _aligned(old, new, 0, path)
        shift = len(new) - len(old)
        if shift and len(appended) > shift:
            # The old items moved back (variables placed before a container's own): inserting the
            # new ones in front says so in fewer operations than rewriting every item in place.
            inserted = [{"op": "add", "path": f"{path}/{i}", "value": new[i]} for i in range(shift)]
            inserted += _aligned(old, new, shift, path)
            if len(inserted) < len(appended):
                appended = inserted
        ops.extend(appended)
        return
    ops.append({"op": "replace", "path": path, "value": new})


def _aligned(old: list[Any], new: list[Any], offset: int, path: str) -> list[Operation]:
    """Operations that make ``old[i]`` into ``new[offset + i]`` where they differ (at its index in
    ``new``), then, with no offset, append what ``new`` has beyond ``old``."""
    ops: list[Operation] = []
    for i, item in enumerate(old):
        if item != new[offset + i]:
            _diff_unequal(item, new[offset + i], f"{path}/{offset + i}", ops)
    if not offset:
        ops.extend({"op": "add", "path": f"{path}/-", "value": item} for item in new[len(old):])
    return ops
