"""Idempotent edits of a Pod (a plain dict, as decoded from JSON): each change is made only when it is
not there already, compared by name and value, since the API server defaults fields (``protocol: TCP``,
``defaultMode: 420``) between Volcano's controller and us (docs/volcano-behaviour.md#idempotency)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .keys import DEFAULT_TASK, TASK_INDEX_KEY, TASK_SPEC_KEY

Obj = dict[str, Any]


def metadata(obj: Mapping[str, Any]) -> Obj:
    """``obj``'s metadata, or an empty map where it has none or a malformed one."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def spec(pod: Obj) -> Obj:
    """The Pod's spec, created when absent (plugins add to it)."""
    found: Obj = pod.setdefault("spec", {})
    return found


def annotation_or_label(pod: Obj, key: str, *, label_first: bool = False) -> str | None:
    """``key``'s value on the Pod: its annotation, else its label (the label first with ``label_first``);
    None when neither is set or both are empty."""
    meta = metadata(pod)
    for source in ("labels", "annotations") if label_first else ("annotations", "labels"):
        values = meta.get(source)
        if isinstance(values, dict) and values.get(key) not in (None, ""):
            return str(values[key])
    return None


def task_name(pod: Obj) -> str:
    """docs/volcano-behaviour.md#task-and-index: annotation ``volcano.sh/task-spec``, then the label, then ``default``."""
    return annotation_or_label(pod, TASK_SPEC_KEY) or DEFAULT_TASK


def task_index(pod: Obj) -> str | None:
    """docs/volcano-behaviour.md#task-and-index: label ``volcano.sh/task-index``, then the annotation, then the last
    ``-``-separated part of a name with at least three parts (Volcano's ``GetPodIndexUnderTask``).
    None when no source has it."""
    parts = str(metadata(pod).get("name") or "").split("-")
    return annotation_or_label(pod, TASK_INDEX_KEY, label_first=True) or (parts[-1] if len(parts) >= 3 and parts[-1] else None)


def containers(pod: Obj, *, init: bool = False) -> list[Obj]:
    """The Pod's regular (or init) containers, in order; an absent list is an empty one."""
    found = spec(pod).get("initContainers" if init else "containers")
    return found if isinstance(found, list) else []


# An init container's requests count only as their largest, so the first container's are never more
# than the Pod asks for already; without any, the Pod would lose Guaranteed QoS, fail a namespace's
# quota ("must specify limits.cpu") or LimitRange minimum, and be scored by the scheduler at its
# non-zero default (100m, 200 MB). Extended resources (GPUs) stay the application's.
SIZING_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def sized_as_first_container(pod: Obj) -> Obj:
    """``{"resources": ...}`` for an init container we add: the Pod's first container's requests and
    limits of cpu, memory and ephemeral-storage; empty where it has none."""
    found = containers(pod)
    resources = found[0].get("resources") if found and isinstance(found[0], dict) else None
    sized: Obj = {}
    for kind in ("requests", "limits"):
        values = resources.get(kind) if isinstance(resources, dict) else None
        kept = {k: v for k, v in values.items() if k in SIZING_RESOURCES} if isinstance(values, dict) else {}
        if kept:
            sized[kind] = kept
    return {"resources": sized} if sized else {}


def ensure_env(container: Obj, name: str, value: str | None = None, value_from: Obj | None = None) -> None:
    """Give ``container`` the variable ``name`` (see :func:`ensure_envs`)."""
    ensure_envs(container, [(name, value, value_from)])


def ensure_envs(container: Obj, entries: Sequence[tuple[str, str | None, Obj | None]]) -> None:
    """Give ``container`` each ``(name, value, value_from)``: append it, or replace the effective
    (last) entry of that name in place when its value differs. Volcano appends, and for duplicate
    names the last entry wins, so the effect matches without leaving a duplicate. One pass over the
    existing list, whatever the number of entries."""
    env = container.get("env")
    if not isinstance(env, list):
        env = container["env"] = []
    last = {entry.get("name"): i for i, entry in enumerate(env) if type(entry) is dict}
    for name, value, value_from in entries:
        entry: Obj = {"name": name, "valueFrom": value_from} if value_from is not None else {"name": name, "value": value}
        i = last.get(name)
        if i is None:
            last[name] = len(env)
            env.append(entry)
            continue
        current = env[i]
        same = (
            current.get("valueFrom") == value_from
            if value_from is not None
            else not current.get("valueFrom") and (current.get("value") or "") == (value or "")
        )
        if not same:
            env[i] = entry


# A container's identity within its Pod for env_names: which list it is in and its name (its
# position when it has no name).
ContainerKey = tuple[bool, Any]


def _keyed_containers(pod: Obj) -> list[tuple[ContainerKey, Obj]]:
    """Every container of the Pod (init containers too) with its :data:`ContainerKey`."""
    return [((init, c.get("name") if isinstance(c.get("name"), str) else i), c)
            for init in (False, True) for i, c in enumerate(containers(pod, init=init)) if isinstance(c, dict)]


def env_names(pod: Obj) -> dict[ContainerKey, set[str]]:
    """The names of every container's env entries (init containers too), by container."""
    found: dict[ContainerKey, set[str]] = {}
    for key, container in _keyed_containers(pod):
        env = container.get("env")
        entries = env if isinstance(env, list) else []
        found[key] = {e["name"] for e in entries if type(e) is dict and isinstance(e.get("name"), str)}
    return found


def move_env_first(pod: Obj, kept: dict[ContainerKey, set[str]]) -> None:
    """In each container ``kept`` knows, move the env entries whose names it does not list to the
    front, keeping the order of those moved and of those left. Kubernetes expands ``$(NAME)`` in a
    variable only from the entries before it, so entries moved first can be referred to by the
    others. A container ``kept`` does not know was added whole, and stays as it is."""
    for key, container in _keyed_containers(pod):
        names = kept.get(key)
        env = container.get("env")
        if names is None or not isinstance(env, list):
            continue
        new = [type(e) is dict and isinstance(e.get("name"), str) and e["name"] not in names for e in env]
        if any(new) and not all(new):
            container["env"] = [e for e, n in zip(env, new, strict=True) if n] + [e for e, n in zip(env, new, strict=True) if not n]


def _covers(existing: Any, desired: Any) -> bool:
    """True when ``existing`` holds everything ``desired`` says; extra (defaulted) fields are fine."""
    if isinstance(desired, dict):
        return isinstance(existing, dict) and all(_covers(existing.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(_covers(e, d) for e, d in zip(existing, desired, strict=True))
        )
    return bool(existing == desired)


def ensure_volume(pod: Obj, volume: Obj) -> str | None:
    """Add ``volume`` unless an equal one of the same name exists; else why the Pod already has a
    different volume of that name, which would make it invalid."""
    volumes = spec(pod).setdefault("volumes", [])
    for current in volumes:
        if isinstance(current, dict) and current.get("name") == volume["name"]:
            if _covers(current, volume):
                return None
            return f"the Pod already has a different volume named {volume['name']!r}"
    volumes.append(volume)
    return None


def _label(container: Obj) -> str:
    return repr(container.get("name") or "")


def mount_conflict(container: Obj, name: str, path: str) -> str | None:
    """Why ``container`` cannot also mount volume ``name`` at ``path``: another volume is mounted
    there, and the API server rejects a container whose mount paths repeat ("must be unique")."""
    for current in container.get("volumeMounts") or []:
        if isinstance(current, dict) and current.get("mountPath") == path and current.get("name") != name:
            return (
                f"container {_label(container)} already mounts volume {current.get('name')!r} at {path!r}; "
                f"volume {name!r} cannot be mounted there too (the API server requires a container's mount paths to be unique)"
            )
    return None


def ensure_mount(container: Obj, mount: Obj) -> str | None:
    """Add ``mount`` unless the container mounts that volume at that path already. Returns None on
    success, or why the path is taken by another volume (see :func:`mount_conflict`)."""
    problem = mount_conflict(container, mount["name"], mount["mountPath"])
    mounts = container.get("volumeMounts") or []
    if not problem and not any(isinstance(m, dict) and m.get("name") == mount["name"] and m.get("mountPath") == mount["mountPath"] for m in mounts):
        container.setdefault("volumeMounts", []).append(mount)
    return problem


def port_conflict(container: Obj, name: str, number: int) -> str | None:
    """Why the port ``name``/``number`` cannot be added to ``container``: no port has that number
    (else nothing is added, as in Volcano) but one has that name, and the API server rejects a
    container whose port names repeat ("Duplicate value")."""
    ports = [p for p in container.get("ports") or [] if isinstance(p, dict)]
    if any(p.get("containerPort") == number for p in ports):
        return None
    for current in ports:
        if current.get("name") == name:
            return (
                f"container {_label(container)} already has a port named {name!r} (containerPort "
                f"{current.get('containerPort')}); adding {name!r} for port {number} would repeat the name, "
                "which the API server rejects"
            )
    return None


def ensure_port(container: Obj, name: str, number: int) -> str | None:
    """Add a named port unless any port already uses that ``containerPort`` (Volcano's check).
    Returns None on success, or why the name is taken (see :func:`port_conflict`)."""
    problem = port_conflict(container, name, number)
    if not problem and not any(isinstance(p, dict) and p.get("containerPort") == number for p in container.get("ports") or []):
        container.setdefault("ports", []).append({"name": name, "containerPort": number})
    return problem
