"""The informer's cache orders changes by the watch stream, never by comparing resourceVersions.

The API's contract is that a resourceVersion is opaque: equal or not, nothing more. Every version
here is a word with no order ("kiwi" before "apple"), so a cache that compared them would go wrong.
The stream is scripted (a real API server cannot be made to deliver an old event after a write's
answer on demand); tests/test_caches.py runs the same cache against a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubernetes import client

from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import resource_version
from volcano_job_webhook.reconciler.kinds import OWNED, OwnedRecord


def config_map(name: str, version: str, value: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": value or version},
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version,
                         "labels": {"app.kubernetes.io/managed-by": "volcano-job-webhook"}}}


class Stream:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.events)

    def cancel(self) -> None:
        pass


class ScriptedRest:
    """A list answers ``items`` at version ``listed``; a watch streams ``events``."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.listed = "list"
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, path: str, query: Any = None, timeout: float | None = None) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": self.listed}, "items": list(self.items)}

    def watch(self, path: str, query: Any, timeout: float) -> Stream:
        events, self.events = self.events, []
        return Stream(events)


def informer() -> tuple[Informer[OwnedRecord], ScriptedRest, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    cache: Informer[OwnedRecord] = Informer(client.ApiClient(), OWNED["ConfigMap"], transform=OwnedRecord,
                                            on_event=lambda kind, record: seen.append((kind, str(record.version))))
    rest = ScriptedRest()
    cache.rest = rest  # type: ignore[assignment]
    cache._relist("", first=True)
    return cache, rest, seen


def cached(cache: Informer[OwnedRecord], name: str = "cm") -> str | None:
    record = cache.get("ns", name)
    return None if record is None else str(record.version)


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def test_a_version_is_kept_as_given_and_only_compared_for_equality():
    assert [resource_version({"metadata": {"resourceVersion": v}}) for v in ("123", "0", "0123", "kiwi", "٣")] == \
        [123, 0, "0123", "kiwi", "٣"]
    assert resource_version({"metadata": {}}) == "" and str(resource_version({"metadata": {"resourceVersion": "123"}})) == "123"


def test_events_older_than_a_stored_write_are_passed_over_until_its_own_arrives():
    cache, rest, seen = informer()
    since = cache.position()
    assert cache.store(config_map("cm", "kiwi"), since) is True
    # The stream still has a change from before our write ("apple"), then our own ("kiwi"), then a newer one.
    rest.events = [event("MODIFIED", config_map("cm", "apple")), event("MODIFIED", config_map("cm", "kiwi"))]
    cache._watch("", "list")
    assert cached(cache) == "kiwi" and seen == []
    rest.events = [event("MODIFIED", config_map("cm", "banana"))]
    cache._watch("", "list")
    assert cached(cache) == "banana" and seen == [("MODIFIED", "banana")]


def test_an_answer_is_refused_when_the_stream_changed_the_object_while_the_request_was_out():
    cache, rest, seen = informer()
    since = cache.position()
    rest.events = [event("ADDED", config_map("cm", "plum"))]
    cache._watch("", "list")
    # Our request's answer ("fig") may be older or newer than "plum": the stream decides; its event will come.
    assert cache.store(config_map("cm", "fig"), since) is False and cached(cache) == "plum"
    rest.events = [event("MODIFIED", config_map("cm", "fig"))]
    cache._watch("", "list")
    assert cached(cache) == "fig" and seen == [("ADDED", "plum"), ("MODIFIED", "fig")]


def test_a_deleted_object_is_not_brought_back_by_an_answer_that_comes_later():
    cache, rest, _ = informer()
    since = cache.position()
    rest.events = [event("ADDED", config_map("cm", "a")), event("DELETED", config_map("cm", "z"))]
    cache._watch("", "list")
    assert cache.store(config_map("cm", "m"), since) is False and cached(cache) is None
    assert cache.store(config_map("cm", "m")) is False  # without a position: refused while the deletion is recent
    assert cache.store(config_map("cm", "n"), cache.position()) is True  # made again after the deletion: kept


def test_a_relist_keeps_what_was_stored_after_it_began_and_replaces_what_was_stored_before():
    cache, rest, _ = informer()
    cache.store(config_map("early", "e1"), cache.position())
    rest.items = [config_map("early", "e2"), config_map("late", "l0")]
    pages = cache._pages("")

    def store_during_the_list(namespace: str) -> Any:
        # A write answered while the list was under way: newer than the list, or not — kept until its event.
        cache.store(config_map("late", "l1"), cache.position())
        cache.store(config_map("gone", "g1"), cache.position())
        return pages

    cache._pages = store_during_the_list  # type: ignore[method-assign]
    cache._relist("")
    assert (cached(cache, "early"), cached(cache, "late"), cached(cache, "gone")) == ("e2", "l1", "g1")
    rest.events = [event("MODIFIED", config_map("late", "l0")), event("ADDED", config_map("late", "l1"))]
    cache._watch("", "list")
    assert cached(cache, "late") == "l1"


def test_a_write_the_list_already_holds_waits_no_more():
    """Stored while a list was under way and listed at that very version: the watch from the list's
    version will not repeat its event, so the stream is believed again at once."""
    cache, rest, seen = informer()
    rest.items = [config_map("cm", "w1")]
    pages = cache._pages("")

    def store_during_the_list(namespace: str) -> Any:
        cache.store(config_map("cm", "w1"), cache.position())
        return pages

    cache._pages = store_during_the_list  # type: ignore[method-assign]
    cache._relist("")
    rest.events = [event("MODIFIED", config_map("cm", "w2"))]
    cache._watch("", "list")
    assert cached(cache) == "w2" and seen == [("MODIFIED", "w2")]


def test_a_write_whose_event_never_comes_is_given_up_on(monkeypatch):
    from volcano_job_webhook.kube import informer as informers

    cache, rest, seen = informer()
    cache.store(config_map("cm", "lost"), cache.position())
    rest.events = [event("MODIFIED", config_map("cm", "next"))]
    cache._watch("", "list")
    assert cached(cache) == "lost"
    monkeypatch.setattr(informers, "PENDING_FOR", 0.0)
    rest.events = [event("MODIFIED", config_map("cm", "after"))]
    cache._watch("", "list")
    assert cached(cache) == "after" and seen == [("MODIFIED", "after")]


def test_a_write_and_its_own_event_are_transformed_once_whichever_comes_first():
    """A write's answer and its watch event race; the loser finds the cache at that version already
    and is not transformed again (a transform is most of the cost of an event)."""
    cache, rest, _ = informer()
    made: list[str] = []

    def counting(obj: dict[str, Any]) -> OwnedRecord:
        made.append(obj["metadata"]["resourceVersion"])
        return OwnedRecord(obj)

    cache.transform = counting
    since = cache.position()
    rest.events = [event("ADDED", config_map("first", "event-wins"))]
    cache._watch("", "list")
    assert cache.store(config_map("first", "event-wins"), since) is False
    assert cache.store(config_map("second", "answer-wins"), cache.position()) is True
    rest.events = [event("ADDED", config_map("second", "answer-wins"))]
    cache._watch("", "list")
    assert made == ["event-wins", "answer-wins"]
    assert (cached(cache, "first"), cached(cache, "second")) == ("event-wins", "answer-wins")
