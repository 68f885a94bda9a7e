"""The work queue: one waiting entry per key, one worker per key, failed keys come back later."""

import threading
import time

from volcano_job_webhook.reconciler.workqueue import WorkQueue


def test_a_key_waits_once():
    q = WorkQueue()
    for _ in range(3):
        q.add("a")
    q.add("b")
    assert [q.get(0.1), q.get(0.1), q.get(0.05)] == ["a", "b", None]


def test_a_key_added_while_processing_comes_back_after_done():
    q = WorkQueue()
    q.add("a")
    assert q.get(0.1) == "a"
    q.add("a")
    assert q.get(0.05) is None, "not handed to a second worker while the first holds it"
    q.done("a")
    assert q.get(0.1) == "a"


def test_rate_limited_delays_grow_and_forget_resets():
    q = WorkQueue(base_delay=0.01, max_delay=1.0)
    delays = [q.add_rate_limited("k") for _ in range(5)]
    assert delays[-1] > delays[0]
    assert all(d <= 1.0 for d in delays)
    q.forget("k")
    assert q.add_rate_limited("k") <= 0.01


def test_add_after_and_shutdown_wake_waiters():
    q = WorkQueue()
    q.add_after("late", 0.05)
    started = time.monotonic()
    assert q.get(1.0) == "late"
    assert time.monotonic() - started >= 0.04
    got = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(1.0)
    assert got == [None]
