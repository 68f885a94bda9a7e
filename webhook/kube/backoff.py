"""The one backoff: how long to wait after failures in a row, for the reconciler's work queue and the
informers' reconnects; what a ``429``'s ``Retry-After`` asks for; and how a failure is named in a
message (:func:`describe`)."""

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


def describe(exc: BaseException) -> str:
    """A failure in a few words for a log line or a denial: an API answer by its HTTP status, anything
    else by its type and the start of its message."""
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status}"
    text = str(exc)
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
