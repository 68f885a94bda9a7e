"""Giving memory back to the OS after a burst of clients: :class:`MemoryTrimmer` calls
:func:`volcano_job_webhook.memory.trim` in a worker thread (pymalloc serves the event loop's small
objects meanwhile) after connections or body bytes were let go, never on a quiet server. The
process's memory settings themselves are :mod:`volcano_job_webhook.memory`'s."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from volcano_job_webhook.memory import trim

from .connections import ConnectionGuard, log_closed

log = logging.getLogger(__name__)


class MemoryTrimmer:
    """Every ``interval`` seconds: log the connections the guard closed, and trim the heap when at
    least ``after_bytes`` of bodies were released or ``after_connections`` connections ended
    (handshakes that never finished included) since the last trim."""

    def __init__(self, guard: ConnectionGuard, interval: float = 5.0, after_bytes: int = 4 * 1024 * 1024,
                 after_connections: int = 128) -> None:
        self.guard = guard
        self.interval = interval
        self.after_bytes = after_bytes
        self.after_connections = after_connections
        self.trims = 0
        self._logged: Counter[str] = Counter()
        self._gone = 0

    def due(self) -> bool:
        return self.guard.released >= self.after_bytes or self.guard.gone - self._gone >= self.after_connections

    async def step(self) -> None:
        log_closed(self.guard, self._logged)
        if self.due():
            self.guard.released, self._gone = 0, self.guard.gone
            await asyncio.to_thread(trim)
            self.trims += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.step()
            except Exception:  # a failed trim must not stop the server
                log.exception("memory trim failed")
