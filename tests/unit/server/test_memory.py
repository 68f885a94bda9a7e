"""The processes' memory settings (webhook/memory.py: the collector off while the caches load, then
what they made frozen; the collector on a clock in serve) and the heap handed back to the OS after
clients leave (server/connections.py). Their effect under attack is measured by bench/fuzz.py."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tests.helpers.envtest import eventually, wait_until
from volcano_job_webhook import memory
from volcano_job_webhook.memory import CollectorPacer
from volcano_job_webhook.server.connections import ConnectionGuard, ConnectionLimits, MemoryTrimmer

pytestmark = pytest.mark.anyio


async def test_the_pacer_collects_every_generation_on_its_clock_and_hands_collection_back():
    pacer = CollectorPacer(young=0.01, middle=0.05, full=0.2)
    task = asyncio.create_task(pacer.run())
    try:
        await asyncio.sleep(0.5)
        assert not gc.isenabled(), "allocation-driven collection is off while the pacer runs"
        young, middle, full = pacer.collections
        assert young > middle > 0 and full >= 1
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert gc.isenabled()


async def test_the_pacer_frees_reference_cycles():
    pacer = CollectorPacer(young=0.01, middle=0.02, full=0.04)

    class Node:
        pass

    import weakref

    task = asyncio.create_task(pacer.run())
    try:
        await asyncio.sleep(0.02)
        node = Node()
        node.self = node  # type: ignore[attr-defined]
        ref = weakref.ref(node)
        del node
        await eventually(lambda: ref() is None, 2, "the node collected", interval=0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_trimmer_trims_after_connections_go_and_not_on_a_quiet_server(monkeypatch):
    import volcano_job_webhook.server.connections as server_memory

    calls = []
    monkeypatch.setattr(server_memory, "trim", lambda: calls.append(1) or True)
    guard = ConnectionGuard(ConnectionLimits())
    trimmer = MemoryTrimmer(guard, after_bytes=1000, after_connections=10)
    await trimmer.step()
    assert calls == [], "nothing happened: nothing to give back"
    guard.gone += 10
    await trimmer.step()
    assert calls == [1]
    await trimmer.step()
    assert calls == [1], "counted from the last trim"
    guard.released += 1000
    await trimmer.step()
    assert calls == [1, 1] and guard.released == 0


async def test_the_pacer_collects_nothing_while_the_cache_first_loads():
    loaded = False
    pacer = CollectorPacer(young=0.01, middle=0.02, full=0.04, loaded=lambda: loaded, load_limit=60.0)
    task = asyncio.create_task(pacer.run())
    try:
        await asyncio.sleep(0.1)
        assert pacer.collections == [0, 0, 0] and not gc.isenabled(), "no collection of any kind during the load"
        loaded = True
        await eventually(lambda: pacer.collections[0] > 0, 2, "a young collection", interval=0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert gc.isenabled()


async def test_the_pacer_does_not_wait_for_a_load_for_ever():
    pacer = CollectorPacer(young=0.01, middle=0.02, full=0.04, loaded=lambda: False, load_limit=0.05)
    task = asyncio.create_task(pacer.run())
    try:
        await eventually(lambda: pacer.collections[0] > 0, 2, "a young collection", interval=0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("paced", [False, True], ids=["reconcile", "serve"])
def test_the_collector_is_off_until_the_load_settles_then_what_it_made_is_frozen(paced):
    try:
        memory.configure(paced=paced, load_limit=60.0)
        assert not gc.isenabled(), "no collection while the caches first load"
        frozen = gc.get_freeze_count()
        loaded = [object() for _ in range(1000)]
        memory.settle()
        assert gc.get_freeze_count() >= frozen + len(loaded)
        assert gc.isenabled() is not paced, "back on, unless the pacer runs collection"
    finally:
        gc.unfreeze()
        gc.enable()


def test_the_load_limit_settles_a_load_that_never_ends():
    try:
        memory.configure(load_limit=0.05)
        wait_until(gc.isenabled, 2, "the collector enabled again", interval=0.01)
    finally:
        gc.unfreeze()
        gc.enable()
