"""What would bring a live object to the desired one, from the cache alone (a job in order costs no request).
An apply is due when a field we set is missing or different (Go zero values aside, which the server drops
from ``omitempty`` fields) or an atomic map holds other keys; what our field manager set and the desired
object no longer has is removed (of our POST's *update* entry, only :data:`UPDATE_MAPS`). Lists are atomic
but ``ownerReferences``, merged by ``uid``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Cached objects keep the paths our field manager set under this key (see transforms.OwnedRecord).
OUR_FIELDS = "__ourFields"
ASSOCIATIVE_LISTS: dict[tuple[str, ...], str] = {("metadata", "ownerReferences"): "uid"}
# Maps and structs the API treats as one value (``+mapType=atomic``, ``+structType=atomic``): a key
# someone else added is drift, since an apply would replace the whole.
ATOMIC_MAPS = {("spec", "selector"), ("spec", "podSelector")}
# Identity, not state: never in managedFields.
IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}

Path = tuple[str, ...]
_interned: dict[frozenset[Path], frozenset[Path]] = {}


def is_zero(value: Any) -> bool:
    return value is None or value is False or value == "" or value == [] or value == {} or (
        type(value) in (int, float) and value == 0)


def covered(live: Any, desired: Any, path: Path = ()) -> bool:
    """Everything ``desired`` says holds in ``live`` (see the module's rules)."""
    if path in ATOMIC_MAPS:
        return bool(live == desired) or (live is None and is_zero(desired))
    if isinstance(desired, dict):
        live = {} if live is None else live
        return isinstance(live, dict) and all(covered(live.get(k), v, (*path, k)) for k, v in desired.items())
    if isinstance(desired, list):
        if live is None:
            return not desired
        if not isinstance(live, list):
            return False
        key = ASSOCIATIVE_LISTS.get(path)
        if key is not None:
            by_key = {item.get(key): item for item in live if isinstance(item, dict)}
            return all(isinstance(d, dict) and covered(by_key.get(d.get(key)), d, path) for d in desired)
        return len(live) == len(desired) and all(covered(x, d, path) for x, d in zip(live, desired, strict=True))
    if live is None:
        return is_zero(desired)
    return bool(live == desired)


def desired_paths(obj: Any, path: Path = ()) -> set[Path]:
    """The field paths an apply of ``obj`` sets, through maps only: a list or a scalar ends a path."""
    if isinstance(obj, dict) and obj:
        out: set[Path] = set()
        for key, value in obj.items():
            out |= desired_paths(value, (*path, key))
        return out
    return {path} - IDENTITY


def _fields_tree(fields: dict[str, Any]) -> dict[str, Any]:
    """A ``fieldsV1`` tree as the object whose fields it lists (its ``f:`` keys), for :func:`desired_paths`."""
    return {k[2:]: _fields_tree(v or {}) for k, v in fields.items() if k.startswith("f:")}


# Our update entry (the POST that made the object) also holds fields the server defaulted (a Service's
# type, a Secret's type): not ours to remove. Only these maps, never defaulted, are read from it.
UPDATE_MAPS = {("data",), ("binaryData",), ("metadata", "labels"), ("metadata", "annotations")}


def our_fields(managed_fields: list[dict[str, Any]], manager: str) -> frozenset[Path]:
    """The paths ``manager`` set: all of its apply entry, and the keys of :data:`UPDATE_MAPS` in its
    update entry; cut at lists as :func:`desired_paths` does (a list's entries are ``k:``/``v:``/
    ``i:`` keys in ``fieldsV1``). Interned: objects of one shape share it."""
    paths: set[Path] = set()
    for entry in managed_fields:
        if entry.get("manager") != manager:
            continue
        fields = entry.get("fieldsV1") or {}
        if entry.get("operation") == "Apply":
            paths |= desired_paths(_fields_tree(fields)) - {()}
            continue
        for path in UPDATE_MAPS:
            node = _at(fields, tuple(f"f:{key}" for key in path))
            if node:
                paths |= desired_paths(_fields_tree(node), path) - {path}
    ours = frozenset(paths)
    return _interned.setdefault(ours, ours)


def _at(obj: Any, path: Path) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


@dataclass(frozen=True)
class Changes:
    """What it takes to bring a live object to the desired one: fields to remove first (ours, no
    longer wanted: a merge patch nulls them, since an apply cannot remove what our POST made), then
    whether an apply is needed."""

    remove: tuple[Path, ...] = ()
    apply: bool = False

    def __bool__(self) -> bool:
        return self.apply or bool(self.remove)

    def removal_patch(self) -> dict[str, Any]:
        patch: dict[str, Any] = {}
        for path in self.remove:
            node = patch
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = None
        return patch


def changes(live: dict[str, Any], desired: dict[str, Any]) -> Changes:
    """Fields of ours ``desired`` no longer has are removed; an atomic map of ours that differs, or
    anything ``desired`` says that does not hold (:func:`covered`), needs an apply."""
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    apply = not covered(live, body)
    ours = live.get(OUR_FIELDS)
    if ours is None:
        return Changes(apply=True)
    paths = desired_paths(desired)
    if ours <= paths:
        return Changes(apply=apply)
    prefixes = {d[:i] for d in paths for i in range(1, len(d))}
    remove = []
    for path in sorted(ours - paths):
        if path not in prefixes:
            remove.append(path)
        elif _at(live, path) != _at(desired, path):
            apply = True
    return Changes(tuple(remove), apply)
