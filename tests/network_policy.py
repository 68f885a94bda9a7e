"""What a set of NetworkPolicies admits, by the rules of the NetworkPolicy API (networking.k8s.io/v1),
for the tests of svc's NetworkPolicy flags: an exact evaluator of ingress, small enough to read.

The rules it keeps, each from the API's documentation:

* a Pod no policy of its namespace selects (``podSelector``, the empty selector selecting every Pod)
  for ``Ingress`` admits everything; once one does, it admits only what some rule of such a policy
  allows (policies are additive: OR);
* ``policyTypes`` missing is ``Ingress``, plus ``Egress`` when the policy has egress rules; a policy
  whose types lack ``Ingress`` never restricts ingress;
* a rule allows a connection when its source matches one of the ``from`` peers (OR; none or an
  empty list: every source, in the cluster or not) and its port one of the ``ports`` (none: every
  port);
* a peer is an ``ipBlock`` (the source address in ``cidr``, not in ``except``), or selectors: a
  ``podSelector`` alone picks Pods of the policy's own namespace, a ``namespaceSelector`` alone every
  Pod of the namespaces it picks, both together Pods that match both (AND); selectors never match a
  source outside the cluster;
* a port has a ``protocol`` (TCP when missing) and a ``port``: none is every port of the protocol, a
  number that port (to ``endPort`` when given), a name the target Pod's container port of that name
  and protocol;
* a label selector: every ``matchLabels`` pair and every ``matchExpressions`` requirement (``In``,
  ``NotIn`` — true when the key is missing —, ``Exists``, ``DoesNotExist``) must hold; the empty
  selector selects everything;
* every namespace carries the label ``kubernetes.io/metadata.name: <name>`` (the API server sets it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector selects a set of labels."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        held = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not held:
            return False
    return True


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
