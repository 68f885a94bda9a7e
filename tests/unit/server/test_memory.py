"""The processes' memory settings (webhook/memory.py: the collector off while the caches load, then
what they made frozen) and the heap handed back to the OS after clients leave
(server/connections.py). Their effect under attack is measured by bench/fuzz.py."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tests.helpers.envtest import wait_until
from volcano_job_webhook import memory
from volcano_job_webhook.server.connections import ConnectionGuard, ConnectionLimits, trim_memory

pytestmark = pytest.mark.anyio


async def test_the_trimmer_trims_after_connections_go_and_not_on_a_quiet_server(monkeypatch):
    import volcano_job_webhook.server.connections as server_memory

    calls = []
    monkeypatch.setattr(server_memory, "trim", lambda: calls.append(1) or True)
    guard = ConnectionGuard(ConnectionLimits())

    async def until(done, what):
        for _ in range(500):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    trimmer = asyncio.get_running_loop().create_task(trim_memory(guard, interval=0.01, after_connections=10))
    try:
        await asyncio.sleep(0.1)
        assert calls == [], "nothing happened: nothing to give back"
        guard.gone += 10
        await until(lambda: calls == [1], "a trim")
        await asyncio.sleep(0.1)
        assert calls == [1], "counted from the last trim"
        guard.gone += 10
        await until(lambda: calls == [1, 1], "a second trim")
    finally:
        trimmer.cancel()


def test_the_collector_is_off_until_the_load_settles_then_what_it_made_is_frozen():
    try:
        memory.configure(load_limit=60.0)
        assert not gc.isenabled(), "no collection while the caches first load"
        frozen = gc.get_freeze_count()
        loaded = [object() for _ in range(1000)]
        memory.settle()
        assert gc.get_freeze_count() >= frozen + len(loaded)
        assert gc.isenabled(), "back on"
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
