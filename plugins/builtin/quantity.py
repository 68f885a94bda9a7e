"""Kubernetes resource quantities, as far as the plugins need them: how many GPUs or CPUs a
container asks for."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

# Kubernetes resource.Quantity: a signed decimal number, then a binary-SI, decimal-SI or exponent suffix.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (``4``, ``"3500m"``, ``"2.5"``, ``"1k"``, ``"1e3"``) as a Decimal; raises
    ``ValueError`` for anything else, negative amounts included."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a quantity")
    text = str(value).strip() if isinstance(value, str) else repr(value)
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number) * (Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix])
    except (InvalidOperation, ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from None
    if amount < 0:
        raise ValueError(f"{text!r} is negative")
    return amount


def whole(amount: Decimal) -> int:
    """Rounded down, at least 1."""
    return max(1, math.floor(amount))


def requested(container: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The container's ``resources.limits`` or ``resources.requests`` (``kind``); empty when absent or malformed."""
    found = (container.get("resources") or {}).get(kind) if isinstance(container.get("resources"), Mapping) else None
    return found if isinstance(found, Mapping) else {}


def gpu_limit(container: Mapping[str, Any], where: str) -> int | None:
    """The container's GPU limit: the first resource, in name order, whose name ends in ``/gpu``
    (``nvidia.com/gpu``, ``amd.com/gpu``) with a positive limit, rounded down; None when none.
    ``where`` names the container in the ``ValueError`` a malformed quantity raises."""
    limits = requested(container, "limits")
    for name in sorted(k for k in limits if isinstance(k, str) and k.endswith("/gpu")):
        try:
            amount = parse_quantity(limits[name])
        except ValueError as exc:
            raise ValueError(f"{where}.resources.limits[{name}]: {exc}") from None
        if amount >= 1:
            return math.floor(amount)
    return None
