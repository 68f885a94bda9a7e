"""Kubernetes naming rules as the API server applies them, checked where each name is made: Volcano
checks almost none (docs/volcano-behaviour.md#name-limits)."""

from __future__ import annotations

import re

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

LABEL_MAX = 63
SUBDOMAIN_MAX = 253


def _dns_name(value: str, pattern: re.Pattern[str], limit: int, what: str, rule: str = "") -> str | None:
    if len(value) > limit:
        return f"{value!r} is {len(value)} characters, over the {what} limit of {limit}"
    return None if pattern.match(value) else f"{value!r} is not a {what}{rule}"


def dns1123_label(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (hostnames, subdomains, volume names), or None."""
    return _dns_name(value, _DNS1123_LABEL, LABEL_MAX, "DNS-1123 label", " (lower-case alphanumerics and '-', alphanumeric at both ends)")


def dns1035_label(value: str) -> str | None:
    """Why ``value`` is not a DNS-1035 label (Service names), or None."""
    return _dns_name(value, _DNS1035_LABEL, LABEL_MAX, "DNS-1035 label", " (must start with a letter; lower-case alphanumerics and '-')")


def dns1123_subdomain(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (ConfigMap, Secret, NetworkPolicy names), or None."""
    return _dns_name(value, _DNS1123_SUBDOMAIN, SUBDOMAIN_MAX, "DNS-1123 subdomain")


_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
PORT_NAME_MAX = 15


def label_key(value: str) -> str | None:
    """Why ``value`` is not a label key (``[prefix/]name``: the prefix a DNS-1123 subdomain, the name
    at most 63 alphanumerics, ``-``, ``_`` or ``.``, alphanumeric at both ends), or None."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or dns1123_subdomain(prefix)):
        return f"label key {value!r}: its prefix {prefix!r} is not a DNS-1123 subdomain"
    if len(name) > LABEL_MAX or not _LABEL_NAME.match(name):
        return (f"label key {value!r}: its name {name!r} must be 1 to {LABEL_MAX} alphanumerics, '-', '_' or '.', "
                "alphanumeric at both ends")
    return None


def label_value(value: str) -> str | None:
    """Why ``value`` is not a label value (empty, or as a label key's name), or None."""
    if value and (len(value) > LABEL_MAX or not _LABEL_NAME.match(value)):
        return f"label value {value!r} must be empty or 1 to {LABEL_MAX} alphanumerics, '-', '_' or '.', alphanumeric at both ends"
    return None


def port_name(value: str) -> str | None:
    """Why ``value`` is not a port name (IANA_SVC_NAME: at most 15 lower-case alphanumerics and
    ``-``, a letter among them, no ``--``, alphanumeric at both ends), or None."""
    if len(value) > PORT_NAME_MAX or not _IANA_SVC_NAME.match(value) or "--" in value or not any(c.isalpha() for c in value):
        return (f"port name {value!r} must be 1 to {PORT_NAME_MAX} lower-case alphanumerics and '-', with a letter, "
                "no '--', alphanumeric at both ends")
    return None
