"""svc's NetworkPolicies where this project runs it: Volcano's ``<job>``, opened by three flags of ours
(docs/plugins.md#network-policy); an opened task gets a policy ``<job>-<task>-open`` of its own, as a
policy's rules apply to every Pod it selects. Volcano's svc has none of these flags: where its
controller runs svc they are its flag error (plugins/chain.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base import Plugin
from ..flags import Flag
from ..helpers import plugin_error, require_task
from ..job import Task
from ..kinds import NETWORK_POLICY
from ..names import dns1123_label, dns1123_subdomain, port_name
from ..pod import Obj
from ..selectors import parse_selector

ALLOW_NAMESPACES = "allow-namespaces"
ALLOW_PODS = "allow-pods"
OPEN_TASK_PORTS = "open-task-ports"
FLAGS = (
    Flag(ALLOW_NAMESPACES, "list", (), "namespaces whose Pods may connect: NS[,NS...], * for every namespace", ours=True),
    Flag(ALLOW_PODS, "list", (), "Pods that may connect: [NS[,NS...]:]SELECTOR, in the job's namespace or those named", ours=True),
    Flag(OPEN_TASK_PORTS, "list", (), "a task's ports any client may reach: TASK[:PORT[/PROTOCOL],...], every port without", ours=True),
)
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
PROTOCOLS = ("TCP", "UDP", "SCTP")
EVERY_NAMESPACE = "*"


def open_policy_name(job_name: str, task: str) -> str:
    """The NetworkPolicy that opens ``task``'s ports to any client."""
    return f"{job_name}-{task}-open"


@dataclass(frozen=True)
class Opening:
    """A task whose Pods any client may reach, on these ports (``NetworkPolicyPort`` objects), or on
    every port when there are none."""

    task: Task
    ports: tuple[Obj, ...]


@dataclass(frozen=True)
class Ingress:
    """What the flags allow besides the job's own Pods."""

    peers: tuple[Obj, ...]
    openings: tuple[Opening, ...]

    @property
    def given(self) -> bool:
        return bool(self.peers or self.openings)


def _namespace_selectors(plugin: Plugin, flag: str, text: str) -> list[Obj]:
    """``NS[,NS...]`` as namespace selectors by name; ``*`` as the one that selects every namespace."""
    selectors: list[Obj] = []
    for name in (part.strip() for part in text.split(",")):
        if name == EVERY_NAMESPACE:
            selectors.append({})
            continue
        problem = dns1123_label(name) if name else f"an empty namespace name in {text!r}"
        if problem:
            raise plugin_error(plugin, f"--{flag}", f"{problem}, or * for every namespace")
        selectors.append({"matchLabels": {NAMESPACE_NAME_LABEL: name}})
    return selectors


def _pods(plugin: Plugin, value: str) -> list[Obj]:
    namespaces, colon, text = value.partition(":")
    if not colon:
        namespaces, text = "", value
    try:
        selector = parse_selector(text)
    except ValueError as exc:
        raise plugin_error(plugin, f"--{ALLOW_PODS}", f"{value!r}: {exc}") from None
    if not selector:
        raise plugin_error(plugin, f"--{ALLOW_PODS}", f"{value!r} selects no labels, so every Pod: name the Pods "
                           f"(app=prometheus), or allow whole namespaces with --{ALLOW_NAMESPACES}")
    if not colon:
        return [{"podSelector": selector}]
    return [{"namespaceSelector": ns, "podSelector": selector} for ns in _namespace_selectors(plugin, ALLOW_PODS, namespaces)]


def _port(plugin: Plugin, text: str, where: str) -> Obj:
    number, slash, protocol = text.partition("/")
    if slash and protocol not in PROTOCOLS:
        raise plugin_error(plugin, f"--{OPEN_TASK_PORTS}", f"{where}: protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    port: int | str
    if number.isascii() and number.isdigit():
        port = int(number)
        if not 1 <= port <= 65535:
            raise plugin_error(plugin, f"--{OPEN_TASK_PORTS}", f"{where}: port {number} is outside 1..65535")
    else:
        problem = port_name(number)
        if problem:
            raise plugin_error(plugin, f"--{OPEN_TASK_PORTS}", f"{where}: {problem} (or a number)")
        port = number
    return {"protocol": protocol or "TCP", "port": port}


def _opening(plugin: Plugin, value: str) -> Opening:
    name, colon, ports = value.partition(":")
    task = require_task(plugin, f"--{OPEN_TASK_PORTS}", name, f"{value!r}: ")
    found: list[Obj] = []
    for text in ports.split(",") if colon else []:
        port = _port(plugin, text.strip(), repr(value))
        if port not in found:
            found.append(port)
    if colon and not found:
        raise plugin_error(plugin, f"--{OPEN_TASK_PORTS}", f"{value!r}: no port after ':' (leave ':' out to open every port)")
    problem = dns1123_subdomain(open_policy_name(plugin.job.name, task.name))
    if problem:
        raise plugin_error(plugin, f"--{OPEN_TASK_PORTS}", f"NetworkPolicy name: {problem}")
    return Opening(task, tuple(found))


def read_ingress(plugin: Plugin) -> Ingress:
    """What the flags allow, checked: each problem an error naming its flag."""
    options: dict[str, Any] = plugin.options
    peers: list[Obj] = []
    for text in options[ALLOW_NAMESPACES]:
        peers.extend({"namespaceSelector": ns} for ns in _namespace_selectors(plugin, ALLOW_NAMESPACES, text))
    for text in options[ALLOW_PODS]:
        peers.extend(_pods(plugin, text))
    openings: list[Opening] = []
    for text in options[OPEN_TASK_PORTS]:
        opening = _opening(plugin, text)
        if any(o.task is opening.task for o in openings):
            raise plugin_error(plugin, f"--{OPEN_TASK_PORTS}", f"names task {opening.task.name!r} twice: give its ports in one")
        openings.append(opening)
    unique = [peer for i, peer in enumerate(peers) if peer not in peers[:i]]
    return Ingress(tuple(unique), tuple(openings))


def network_policy(plugin: Plugin, name: str, selector: dict[str, str], rule: Obj) -> Obj:
    """A NetworkPolicy of the job: ingress to the Pods ``selector`` picks by ``rule`` only."""
    spec = {"podSelector": {"matchLabels": selector}, "ingress": [rule], "policyTypes": ["Ingress"]}
    return plugin.job.side_object(NETWORK_POLICY, name, spec=spec)


def opened_policies(plugin: Plugin, ingress: Ingress) -> list[Obj]:
    """One NetworkPolicy per opened task: its ports, or every port, from anywhere."""
    return [
        network_policy(plugin, open_policy_name(plugin.job.name, o.task.name), plugin.job.task_selector(o.task),
                       {"ports": [dict(p) for p in o.ports]} if o.ports else {})
        for o in ingress.openings
    ]
