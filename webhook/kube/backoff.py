"""Backoff and retries as controller-runtime users expect: 429 honours ``Retry-After``, 5xx and
connection errors back off exponentially with jitter; 404/409 and other 4xx are the caller's."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)
T = TypeVar("T")


class Backoff:
    """Exponential backoff with full jitter: 0.5 s doubling to ``cap``, reset after a success."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * (2**self.attempt))
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status == 429 or exc.status is None or exc.status == 0 or exc.status >= 500
    return isinstance(exc, (OSError, ConnectionError)) or type(exc).__module__.startswith("urllib3")


def retry_after(exc: BaseException) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return min(float(value), 60.0) if value is not None else None
    except ValueError:
        return None


def with_retries(fn: Callable[[], T], *, attempts: int = 5, on_error: Callable[[BaseException], None] | None = None,
                 sleep: Callable[[float], Any] = time.sleep) -> T:
    """Call ``fn``; retry transient failures up to ``attempts`` times, then re-raise."""
    backoff = Backoff(base=0.2, cap=10.0)
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if on_error is not None:
                on_error(exc)
            if not is_transient(exc) or attempt == attempts - 1:
                raise
            delay = retry_after(exc)
            delay = delay if delay is not None else backoff.next_delay()
            log.info("transient API error (%s); retrying in %.2fs", getattr(exc, "status", type(exc).__name__), delay)
            sleep(delay)
    raise AssertionError("unreachable")
