"""The one backoff: how long to wait after failures in a row, for the reconciler's work queue and the
informers' reconnects; and what a ``429``'s ``Retry-After`` asks for."""

from __future__ import annotations

import random


def delay(failures: int, base: float, cap: float) -> float:
    """``base * 2**failures`` capped at ``cap``, half of it fixed and half drawn at random (equal
    jitter): never less than half the step, and retries of many keys do not march in step."""
    step = min(cap, base * 2**failures)
    return random.uniform(step / 2, step)


def retry_after(exc: BaseException) -> float | None:
    """The seconds an answer's ``Retry-After`` header asks to wait (at most a minute), if it has one."""
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return min(float(value), 60.0) if value is not None else None
    except ValueError:
        return None
