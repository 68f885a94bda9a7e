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
    q.add_after("later", 3600)
    q.add_after("soon", 0.05)
    assert q.get(10) == "soon", "a waiter is woken when the first delay is up"
    assert q.get(0.05) is None, "and not for a key whose delay is not"
    assert len(q) == 1 and q.depth == 0, "a key held back is no work ready (the queue-depth metric)"
    q.add("now")
    assert q.depth == 1
    assert q.get(0.1) == "now"
    got = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(1.0)
    assert got == [None]


def test_a_failed_key_comes_back_by_itself():
    q = WorkQueue(base_delay=0.01, max_delay=0.05)
    q.add("k")
    assert q.get(0.1) == "k"
    q.add_rate_limited("k")  # the reconcile failed
    q.done("k")
    assert q.get(1.0) == "k", "re-added after its delay, with nobody adding it again"


def test_event_keys_go_before_resync_keys_and_a_waiting_resync_key_moves_up():
    q = WorkQueue()
    for key in ("r1", "r2", "r3"):
        q.add(key, low=True)
    q.add("e1")
    q.add("r3")  # an event for a job the resync queued too
    q.add("r1", low=True)  # queued again by a resync: stays where it is
    assert [q.get(0.1) for _ in range(4)] == ["e1", "r3", "r1", "r2"]
    assert q.get(0.05) is None


def test_no_key_is_ever_in_two_workers_at_once():
    q = WorkQueue(base_delay=0.001, max_delay=0.002)
    busy: set[str] = set()
    lock = threading.Lock()
    overlaps: list[str] = []
    handled = [0]

    def worker() -> None:
        while (key := q.get(0.5)) is not None:
            with lock:
                if key in busy:
                    overlaps.append(key)
                busy.add(key)
                handled[0] += 1
            time.sleep(0.0005)
            if handled[0] % 7 == 0:
                q.add_rate_limited(key)
            with lock:
                busy.discard(key)
            q.done(key)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for round_ in range(200):
        for key in ("a", "b", "c"):
            q.add(key, low=round_ % 2 == 0)
        time.sleep(0.0005)
    for t in threads:
        t.join(5)
    assert handled[0] > 20 and overlaps == []


def test_a_key_asked_for_later_is_held_once_at_the_earliest_time_and_forget_spends_it():
    """client-go's delaying queue: a reconcile waiting for its writes asks for a later look on every
    event; the key is held once. A reconcile run to its end forgets the key: the look it asked for is spent."""
    q = WorkQueue()
    q.add_after("k", 3600)
    q.add_after("k", 0.05)
    q.add_after("k", 1800)
    assert len(q) == 1
    assert q.get(5) == "k", "at the earliest time asked"
    q.done("k")
    assert q.get(0.1) is None and len(q) == 0, "once"
    q.add_after("k", 0.05)
    q.forget("k")
    assert len(q) == 0 and not q._processing and q.get(0.2) is None
