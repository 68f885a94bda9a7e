"""The process's memory settings, owned here: a process that loads caches (``reconcile``, ``serve``
with the kube source) calls :func:`configure` once, first thing, and :func:`settle` once what it
loaded is there to stay.

glibc's malloc hands free heap back after a burst of clients (:func:`trim`).
The garbage collector stays off while the caches first load (its sweeps of the new records cost a
large share of the time to Ready), then what they made is frozen out of its way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading

log = logging.getLogger(__name__)

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


_state: dict[str, object] = {"timer": None}


def configure(*, load_limit: float = LOAD_LIMIT) -> None:
    """Once per process, before any thread starts: collection off until :func:`settle` (at most
    ``load_limit`` seconds)."""
    gc.disable()
    timer = threading.Timer(load_limit, settle, args=("the load limit",))
    timer.daemon = True
    _state.update(timer=timer)
    timer.start()


def settle(what: str = "the caches' first load") -> None:
    """What the process holds now lives as long as it does: collected once and frozen out of the
    collector's way; automatic collection back on. Safe to call again."""
    timer = _state["timer"]
    if isinstance(timer, threading.Timer):
        timer.cancel()
    gc.collect()
    gc.freeze()
    gc.enable()
    log.info("after %s: %d objects frozen out of the garbage collector", what, gc.get_freeze_count())

