"""A monotonic clock the test moves: what code measured on it does at each instant no longer depends
on how fast this machine runs, so a test asserts behaviour at chosen instants instead of timing it."""

from __future__ import annotations

import threading


class FakeClock:
    """Callable as ``time.monotonic`` is; stands still until :meth:`advance`."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
