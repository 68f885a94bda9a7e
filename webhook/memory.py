"""The process's memory settings, owned here: each process calls :func:`configure` once, first
thing, and :func:`settle` once what it loaded is there to stay.

glibc's malloc keeps two arenas and hands free heap back after a burst of clients (:func:`trim`).
The garbage collector stays off while the caches first load (its sweeps of the new records cost a
large share of the time to Ready), then what they made is frozen out of its way. In ``serve``,
:class:`CollectorPacer` runs it on a clock: under a flood of connections old objects die as fast as
new ones are made, so CPython's allocation count barely moves while young objects pile up into long
pauses of the event loop (docs/benchmarks.md, Hardening).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
# The longest the caches' first load keeps the collector off.
LOAD_LIMIT = 120.0


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - present only in glibc
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()


def trim() -> bool:
    """Return free heap memory to the OS now; True when glibc released some."""
    return bool(_LIBC is not None and _LIBC.malloc_trim(0))


_state: dict[str, object] = {"paced": False, "timer": None}


def configure(*, malloc_arenas: int | None = None, paced: bool = False, load_limit: float = LOAD_LIMIT) -> None:
    """Once per process, before any thread starts: cap malloc's arenas (when given), and turn
    collection off until :func:`settle` (at most ``load_limit`` seconds); ``paced``: then a
    :class:`CollectorPacer` runs it (``serve``), not CPython's counts (``reconcile``)."""
    if malloc_arenas is not None and _LIBC is not None:
        _LIBC.mallopt(M_ARENA_MAX, malloc_arenas)
    gc.disable()
    timer = threading.Timer(load_limit, settle, args=("the load limit",))
    timer.daemon = True
    _state.update(paced=paced, timer=timer)
    timer.start()


def settle(what: str = "the caches' first load") -> None:
    """What the process holds now lives as long as it does: collected once and frozen out of the
    collector's way; automatic collection back on unless a pacer runs it. Safe to call again."""
    timer = _state["timer"]
    if isinstance(timer, threading.Timer):
        timer.cancel()
    gc.collect()
    gc.freeze()
    if not _state["paced"]:
        gc.enable()
    log.info("after %s: %d objects frozen out of the garbage collector", what, gc.get_freeze_count())


class CollectorPacer:
    """Runs the garbage collector every ``young`` seconds (generation 0), ``middle`` seconds
    (generations 0-1) and ``full`` seconds (all), with automatic collection off meanwhile; turns
    automatic collection back on when cancelled."""

    def __init__(self, young: float = 0.02, middle: float = 0.2, full: float = 30.0,
                 loaded: Callable[[], bool] = lambda: True, load_limit: float = LOAD_LIMIT) -> None:
        self.young = young
        self.every_middle = max(1, round(middle / young))
        self.every_full = max(1, round(full / young))
        self.collections = [0, 0, 0]
        # Nothing is collected until ``loaded()`` (at most ``load_limit`` seconds): see :func:`configure`.
        self.loaded = loaded
        self.load_limit = load_limit

    async def run(self) -> None:
        gc.disable()
        try:
            waited = 0.0
            while not self.loaded() and waited < self.load_limit:
                await asyncio.sleep(self.young)
                waited += self.young
            tick = 0
            while True:
                await asyncio.sleep(self.young)
                tick += 1
                generation = 2 if tick % self.every_full == 0 else 1 if tick % self.every_middle == 0 else 0
                try:
                    gc.collect(generation)
                    self.collections[generation] += 1
                except Exception:  # a finaliser that raises must not stop the collections
                    log.exception("garbage collection failed")
        finally:
            gc.enable()
