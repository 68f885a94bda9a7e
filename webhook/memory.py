"""The process's memory settings, owned here and nowhere else: each process calls :func:`configure`
once, first thing, and :func:`settle` when what it made is there to stay.

* glibc's malloc arenas (:func:`tune_malloc`, ``MALLOC_ARENA_MAX``): the job source's worker thread
  and the kube client's threads would otherwise each get an arena of their own to fragment; and
  :func:`trim` (``malloc_trim(0)``), which hands the free pages of the heap back to the OS after a
  burst of clients (measured on ``serve``: 2,000 TLS connections each sending 60 KB of a body grew it
  by ~470 MB, and after they closed glibc kept ~400 MB; a trim brought it back within ~20 MB of the
  start). Both are no-ops where the C library is not glibc.
* Python's collector. No collection while the caches first load (at most :data:`LOAD_LIMIT`):
  measured at 100,000 Jobs, collections walking the pages as they became records took 1.8 s of the
  8 s to Ready in ``serve`` and 14 s of the 30 s in ``reconcile``, and what the load makes is
  long-lived — so :func:`settle` then freezes it out of the collector's way (``gc.freeze``), and full
  collections scan only what came after. In ``serve``, :class:`CollectorPacer` then runs the
  collector on a clock instead of on allocation counts: CPython starts a young collection when
  allocations outnumber deallocations by 700; under a flood of connections old objects die as fast as
  new ones are made, so the count barely moves while tens of thousands of young objects pile up —
  measured, collections of 15,000 to 45,000 objects stopped the event loop for 10 to 40 ms. Collected
  every 20 ms (the young), 200 ms (the middle generation) and 30 s (everything), each pause stays at
  a few milliseconds: the slow-connection attack's worst pause went from 39 ms to 10 ms, and
  ``/healthz`` p99 from 31 ms to 10 ms.
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


def tune_malloc(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (before threads start); True when done."""
    return bool(_LIBC is not None and _LIBC.mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """Return free heap memory to the OS now; True when glibc released some."""
    return bool(_LIBC is not None and _LIBC.malloc_trim(0))


_state: dict[str, object] = {"paced": False, "timer": None}


def configure(*, malloc_arenas: int | None = None, paced: bool = False, load_limit: float = LOAD_LIMIT) -> None:
    """Once per process, before any thread starts: cap malloc's arenas (when given), and turn
    automatic collection off until :func:`settle` (at most ``load_limit`` seconds). ``paced``: a
    :class:`CollectorPacer` will run collection from then on (``serve``), rather than CPython's
    counts (``reconcile``)."""
    if malloc_arenas is not None:
        tune_malloc(malloc_arenas)
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
                 loaded: Callable[[], bool] = lambda: True, load_limit: float = 120.0) -> None:
        self.young = young
        self.every_middle = max(1, round(middle / young))
        self.every_full = max(1, round(full / young))
        self.collections = [0, 0, 0]
        # Nothing is collected while the job cache first loads (``loaded`` false, for at most
        # ``load_limit`` seconds): measured at 100,000 Jobs, collections walking each page as it
        # became records cost 1.8 s of the 8 s to Ready, and what the load makes is long-lived.
        self.loaded = loaded
        self.load_limit = load_limit

    def step(self, tick: int) -> None:
        generation = 2 if tick % self.every_full == 0 else 1 if tick % self.every_middle == 0 else 0
        gc.collect(generation)
        self.collections[generation] += 1

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
                try:
                    self.step(tick)
                except Exception:  # a finaliser that raises must not stop the collections
                    log.exception("garbage collection failed")
        finally:
            gc.enable()
