"""A job's expectations (webhook/reconciler/expectations.py): its next reconcile waits until the cache
shows each write — by its watch event, whenever it comes: before the answer, after it, or overtaken
by a newer change — or the timeout passes; and is skipped when the cache shows the writes and nothing
else of the job changed. Versions are words with no order, as the API's contract allows."""

from __future__ import annotations

from typing import Any

from tests.clock import FakeClock
from volcano_job_webhook.reconciler.expectations import GONE, Expectations

JOB = ("ns", "job")
CM, SVC = ("ConfigMap", "job-svc"), ("Service", "job")


def reconciled(*idents: tuple[str, str]) -> tuple[Expectations, dict[tuple[str, str], Any], FakeClock]:
    """A job at version "v1" whose reconcile is sending writes of ``idents``; the cache, by object."""
    clock = FakeClock()
    expectations = Expectations(timeout=30, clock=clock)
    cache: dict[tuple[str, str], Any] = {SVC: "fig"}
    assert expectations.begin(JOB, "v1", cache.get) is True, "nothing pending: reconciled"
    expectations.sending(JOB, list(idents))
    return expectations, cache, clock


def test_waits_for_the_events_of_the_answers_then_has_nothing_to_do():
    expectations, cache, _ = reconciled(CM, SVC)
    expectations.sent(JOB, {CM: "kiwi", SVC: GONE})
    assert expectations.begin(JOB, "v1", cache.get) is False
    expectations.observe(JOB, CM, "kiwi")
    cache[CM] = "kiwi"
    assert expectations.begin(JOB, "v1", cache.get) is False, "the Service's deletion not seen yet"
    expectations.observe(JOB, SVC, GONE)
    del cache[SVC]
    assert expectations.begin(JOB, "v1", cache.get) is None, "the cache is as the reconcile left it"
    assert expectations.begin(JOB, "v1", cache.get) is True, "then a reconcile as any other"


def test_an_event_before_the_answer_counts():
    """The watch is often faster than the answer."""
    expectations, cache, _ = reconciled(CM)
    expectations.observe(JOB, CM, "kiwi")
    cache[CM] = "kiwi"
    expectations.sent(JOB, {CM: "kiwi"})
    assert expectations.begin(JOB, "v1", cache.get) is None


def test_another_change_means_a_reconcile_once_the_writes_are_in():
    expectations, cache, _ = reconciled(CM)
    expectations.observe(JOB, CM, "kiwi")
    expectations.observe(JOB, CM, "plum")  # another writer, at once: the cache never holds ours
    cache[CM] = "plum"
    expectations.sent(JOB, {CM: "kiwi"})
    assert expectations.begin(JOB, "v1", cache.get) is True
    expectations.sent(JOB, {})
    assert expectations.begin(JOB, "v1", cache.get) is True
    expectations.sending(JOB, [CM])
    expectations.sent(JOB, {CM: "pear"})
    expectations.observe(JOB, SVC, "date")  # another object of the job changed
    expectations.observe(JOB, CM, "pear")
    assert expectations.begin(JOB, "v1", cache.get) is True
    expectations.sending(JOB, [CM])
    expectations.sent(JOB, {CM: "lime"})
    expectations.observe(JOB, CM, "lime")
    assert expectations.begin(JOB, "v2", cache.get) is True, "the job itself changed"


def test_waits_while_a_request_is_out_and_a_failed_one_is_expected_no_more():
    expectations, cache, _ = reconciled(CM, SVC)
    assert expectations.begin(JOB, "v1", cache.get) is False, "requests out: the cache may be older than them"
    expectations.sent(JOB, {CM: "kiwi"})  # the Service's write failed
    cache[CM] = "kiwi"
    assert expectations.begin(JOB, "v1", cache.get) is True, "the cache at the version written; the failure is worked out again"


def test_a_lost_event_is_waited_out():
    expectations, cache, clock = reconciled(CM)
    expectations.sent(JOB, {CM: "kiwi"})
    clock.advance(29)
    assert expectations.begin(JOB, "v1", cache.get) is False
    clock.advance(2)
    assert expectations.begin(JOB, "v1", cache.get) is True
    expectations.sending(("ns", "other"), [CM])
    clock.advance(61)
    expectations.begin(JOB, "v1", cache.get)
    assert ("ns", "other") not in expectations._jobs, "one nothing asked for again is dropped with time"
