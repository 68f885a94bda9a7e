"""RFC 6902 JSON patches that address only what changed.

The chain returns a whole mutated Pod; the API server wants operations. Diffing structurally keeps
each operation on the field it changes — lists are appended to with ``/-``, missing lists and maps
are added whole, changed values are replaced in place — so changes other mutating webhooks made to
the same Pod survive (docs/volcano-behaviour.md#admission-answer).
"""

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
    _diff(old, new, "", ops)
    return ops


def _diff(old: Any, new: Any, path: str, ops: list[Operation]) -> None:
    if old == new:
        return
    _diff_unequal(old, new, path, ops)


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
        for i, item in enumerate(old):
            if item != new[i]:
                _diff_unequal(item, new[i], f"{path}/{i}", ops)
        for item in new[len(old):]:
            ops.append({"op": "add", "path": f"{path}/-", "value": item})
        return
    ops.append({"op": "replace", "path": path, "value": new})
