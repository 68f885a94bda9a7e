"""Kubernetes naming rules, as the API server's validation applies them.

Volcano validates almost none of the names its plugins generate (docs/volcano-behaviour.md#name-limits); we check each one
where it is made, so a bad job fails with the rule it broke instead of Pods the API server rejects.
"""

from __future__ import annotations

import re

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

LABEL_MAX = 63
SUBDOMAIN_MAX = 253


def dns1123_label(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (hostnames, subdomains, volume names), or None."""
    if len(value) > LABEL_MAX:
        return f"{value!r} is {len(value)} characters, over the DNS-1123 label limit of {LABEL_MAX}"
    if not _DNS1123_LABEL.match(value):
        return f"{value!r} is not a DNS-1123 label (lower-case alphanumerics and '-', alphanumeric at both ends)"
    return None


def dns1035_label(value: str) -> str | None:
    """Why ``value`` is not a DNS-1035 label (Service names), or None."""
    if len(value) > LABEL_MAX:
        return f"{value!r} is {len(value)} characters, over the DNS-1035 label limit of {LABEL_MAX}"
    if not _DNS1035_LABEL.match(value):
        return f"{value!r} is not a DNS-1035 label (must start with a letter; lower-case alphanumerics and '-')"
    return None


def dns1123_subdomain(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (ConfigMap, Secret, NetworkPolicy names), or None."""
    if len(value) > SUBDOMAIN_MAX:
        return f"{value!r} is {len(value)} characters, over the DNS-1123 subdomain limit of {SUBDOMAIN_MAX}"
    if not _DNS1123_SUBDOMAIN.match(value):
        return f"{value!r} is not a DNS-1123 subdomain"
    return None
