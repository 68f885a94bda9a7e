"""A job's expectations (webhook/reconciler/expectations.py): a reconcile waits until the cache shows each
write of the last one — by its watch event, whenever it comes (before the answer or after it), or by the
cache holding its version — or the deadline passes; the wait is the time left. Versions are words with
no order, as the API's contract allows. What the reconciler does with them: test_reconciler_bookkeeping.py."""

from __future__ import annotations

from typing import Any

from tests.helpers.clock import FakeClock
from volcano_job_webhook.reconciler.expectations import GONE, Expectations

JOB = ("ns", "job")
CM, SVC = ("ConfigMap", "job-svc"), ("Service", "job")


def sending(*idents: tuple[str, str]) -> tuple[Expectations, dict[tuple[str, str], Any], FakeClock]:
    """A job's reconcile sending writes of ``idents``; the cache, by object."""
    clock = FakeClock()
    expectations = Expectations(timeout=30, clock=clock)
    cache: dict[tuple[str, str], Any] = {SVC: "fig"}
    assert expectations.pending(JOB, cache.get) == 0, "nothing written: nothing to wait for"
    expectations.sending(JOB, list(idents))
    return expectations, cache, clock


def test_waits_for_the_events_of_the_answers_then_for_nothing():
    expectations, cache, _ = sending(CM, SVC)
    expectations.sent(JOB, {CM: "kiwi", SVC: GONE})
    assert expectations.pending(JOB, cache.get) == 30
    expectations.observe(JOB, CM, "kiwi")
    assert expectations.pending(JOB, cache.get) == 30, "the Service's deletion not seen yet"
    expectations.observe(JOB, SVC, GONE)
    assert len(expectations) == 0, "met: the job's entry goes with its last expectation"
    assert expectations.pending(JOB, cache.get) == 0


def test_an_event_before_the_answer_counts():
    """The watch is often faster than the answer."""
    expectations, _, _ = sending(CM)
    expectations.observe(JOB, CM, "kiwi")
    expectations.sent(JOB, {CM: "kiwi"})
    assert len(expectations) == 0


def test_another_version_does_not_meet_a_write_but_the_cache_at_its_version_does():
    """An event of another version may be older than the write (versions have no order): it meets
    nothing; the cache holding the version written does, event or not (a relist brought it)."""
    expectations, cache, _ = sending(CM)
    expectations.sent(JOB, {CM: "kiwi"})
    expectations.observe(JOB, CM, "plum")
    cache[CM] = "plum"
    assert expectations.pending(JOB, cache.get) == 30
    cache[CM] = "kiwi"
    assert expectations.pending(JOB, cache.get) == 0
    assert len(expectations) == 0


def test_waits_while_a_request_is_out_and_a_failed_one_is_expected_no_more():
    expectations, cache, _ = sending(CM, SVC)
    assert expectations.pending(JOB, cache.get) == 30, "requests out: the cache may be older than them"
    expectations.sent(JOB, {CM: "kiwi"})  # the Service's write failed
    cache[CM] = "kiwi"
    assert expectations.pending(JOB, cache.get) == 0


def test_a_lost_event_is_waited_out_with_the_time_left():
    expectations, cache, clock = sending(CM)
    expectations.sent(JOB, {CM: "kiwi"})
    clock.advance(29)
    assert expectations.pending(JOB, cache.get) == 1
    clock.advance(2)
    assert expectations.pending(JOB, cache.get) == 0
    assert len(expectations) == 0, "expired: dropped"


def test_a_new_round_of_writes_renews_the_deadline():
    expectations, cache, clock = sending(CM)
    expectations.sent(JOB, {CM: "kiwi"})
    clock.advance(20)
    expectations.sending(JOB, [SVC])
    expectations.sent(JOB, {SVC: GONE})
    assert expectations.pending(JOB, cache.get) == 30
