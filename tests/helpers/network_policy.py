"""What a set of NetworkPolicies admits by the rules of networking.k8s.io/v1 (ingress only: policies
OR'ed, peers and ports as documented, every namespace labelled ``kubernetes.io/metadata.name``), for
the tests of svc's NetworkPolicy flags: an exact evaluator small enough to read."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.manifests_util import selector_matches as selects

NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Pod:
    """A Pod: its namespace, labels and container ports ``(name, number, protocol)``."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[tuple[str, int, str], ...] = ()


@dataclass(frozen=True)
class Source:
    """Where a connection comes from: a Pod, or an address outside the cluster (``pod`` None)."""

    name: str
    pod: Pod | None = None
    ip: str = "203.0.113.7"


def policy_types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


class Cluster:
    """Namespaces (name to labels) and the NetworkPolicies in them."""

    def __init__(self, namespaces: Mapping[str, Mapping[str, str]], policies: Iterable[Mapping[str, Any]]) -> None:
        self.namespaces = {name: {**labels, NAME_LABEL: name} for name, labels in namespaces.items()}
        self.policies = list(policies)

    def admits(self, source: Source, target: Pod, port: int, protocol: str = "TCP") -> bool:
        """Whether a connection from ``source`` to ``target``'s ``port``/``protocol`` is let in."""
        applying = [
            p for p in self.policies
            if p["metadata"]["namespace"] == target.namespace
            and selects(p["spec"]["podSelector"], target.labels)
            and "Ingress" in policy_types(p)
        ]
        if not applying:
            return True
        return any(
            self._rule_admits(rule, policy["metadata"]["namespace"], source, target, port, protocol)
            for policy in applying
            for rule in policy["spec"].get("ingress") or []
        )

    def _rule_admits(self, rule: Mapping[str, Any], namespace: str, source: Source, target: Pod, port: int, protocol: str) -> bool:
        peers = rule.get("from") or []
        ports = rule.get("ports") or []
        from_ok = not peers or any(self._peer_admits(peer, namespace, source) for peer in peers)
        port_ok = not ports or any(_port_matches(p, target, port, protocol) for p in ports)
        return from_ok and port_ok

    def _peer_admits(self, peer: Mapping[str, Any], namespace: str, source: Source) -> bool:
        if "ipBlock" in peer:
            address = ipaddress.ip_address(source.ip)
            block = peer["ipBlock"]
            return address in ipaddress.ip_network(block["cidr"]) and not any(
                address in ipaddress.ip_network(cidr) for cidr in block.get("except") or [])
        if "podSelector" not in peer and "namespaceSelector" not in peer:
            raise ValueError(f"a peer of nothing: {peer}")
        pod = source.pod
        if pod is None:
            return False
        if "namespaceSelector" in peer:
            in_namespace = selects(peer["namespaceSelector"], self.namespaces[pod.namespace])
        else:
            in_namespace = pod.namespace == namespace
        return in_namespace and ("podSelector" not in peer or selects(peer["podSelector"], pod.labels))


def _port_matches(rule_port: Mapping[str, Any], target: Pod, port: int, protocol: str) -> bool:
    wanted = rule_port.get("protocol") or "TCP"
    if wanted != protocol:
        return False
    number = rule_port.get("port")
    if number is None:
        return True
    if isinstance(number, int):
        return number <= port <= (rule_port.get("endPort") or number)
    return any(name == number and value == port and kind == protocol for name, value, kind in target.ports)
