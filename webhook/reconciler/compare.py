"""Would a server-side apply of ``desired`` change the live object? Answered from the cache alone,
so that a reconcile of a job whose objects are as they should be sends nothing.

The live object is what the API server stored: our fields after its defaulting, plus fields it
defaulted (a Service's ``type``, ``sessionAffinity``, ``ipFamilies``...) and fields other writers
set. An apply changes something when

* a field we set is missing or different — where "missing" does not count for Go zero values
  (``false``, ``0``, ``""``, empty lists and maps), which the server drops from ``omitempty``
  fields (a Service's ``publishNotReadyAddresses: false`` is stored as nothing); or
* our field manager owns a field the desired object no longer has (an apply removes it), or owns
  a map whole (``+mapType=atomic``, e.g. a Service's ``selector``) that holds other keys (an apply
  replaces it).

Lists are atomic (compared whole) except the associative lists we set, merged by key:
``metadata.ownerReferences`` by ``uid`` — another owner's reference is not ours to remove.
"""

from __future__ import annotations

from typing import Any

# Cached objects keep the paths our manager owns under this key (see kinds.cached_form).
OWNED_FIELDS = "__ownedFields"
ASSOCIATIVE_LISTS = {("metadata", "ownerReferences"): "uid"}
# Identity, not state: never in managedFields.
IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}

Path = tuple[str, ...]
_interned: dict[frozenset[Path], frozenset[Path]] = {}


def is_zero(value: Any) -> bool:
    return value is None or value is False or value == "" or value == [] or value == {} or (
        type(value) in (int, float) and value == 0)


def covered(live: Any, desired: Any, path: Path = ()) -> bool:
    """Everything ``desired`` says holds in ``live`` (see the module's rules)."""
    if isinstance(desired, dict):
        if live is None:
            return all(covered(None, v, (*path, k)) for k, v in desired.items())
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
        return len(live) == len(desired) and all(covered(x, d, path) for x, d in zip(live, desired))
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


def _fields_paths(fields: dict[str, Any], path: Path) -> set[Path]:
    children = {k[2:]: v for k, v in fields.items() if k.startswith("f:")}
    if not children:
        return {path}
    out: set[Path] = set()
    for key, value in children.items():
        out |= _fields_paths(value or {}, (*path, key))
    return out


def owned_paths(managed_fields: list[dict[str, Any]], manager: str) -> frozenset[Path]:
    """The paths ``manager`` owns by apply, cut at lists as :func:`desired_paths` does (a list's
    entries are ``k:``/``v:``/``i:`` keys in ``fieldsV1``). Interned: objects of one shape share it."""
    paths: set[Path] = set()
    for entry in managed_fields:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            paths |= _fields_paths(entry.get("fieldsV1") or {}, ()) - {()}
    owned = frozenset(paths)
    return _interned.setdefault(owned, owned)


def _at(obj: Any, path: Path) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _leftover(live: dict[str, Any], desired: dict[str, Any], owned: frozenset[Path]) -> bool:
    """Whether an apply would remove or replace something of what our manager owns: a field the
    desired object no longer has, or an atomic map (owned whole, e.g. a Service's ``selector``)
    with keys the desired one does not have."""
    paths = desired_paths(desired)
    if owned <= paths:
        return False
    prefixes = {d[:i] for d in paths for i in range(1, len(d))}
    for path in owned - paths:
        if path not in prefixes or _at(live, path) != _at(desired, path):
            return True
    return False


def needs_apply(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    if not covered(live, body):
        return True
    owned = live.get(OWNED_FIELDS)
    return owned is None or _leftover(live, desired, owned)
