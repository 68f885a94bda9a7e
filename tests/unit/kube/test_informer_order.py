"""The informer's cache takes the order of changes from the watch stream, never from comparing
resourceVersions: the API's contract is that one is opaque, equal or not. Every version here is a
word with no order ("kiwi" before "apple"), so a cache that compared them would go wrong. The stream
is scripted (a real API server cannot be made to send these on cue); tests/double/test_caches.py runs the
same cache against a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubernetes import client

from volcano_job_webhook.kube.informer import LISTED, Informer
from volcano_job_webhook.kube.records import resource_version
from volcano_job_webhook.reconciler.owned import OWNED
from volcano_job_webhook.reconciler.transforms import OwnedRecord


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
        self.lists = 0

    def call(self, method: str, path: str, query: Any = None, timeout: float | None = None) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": self.listed}, "items": list(self.items)}

    def watch(self, path: str, query: Any, timeout: float) -> Stream:
        events, self.events = self.events, []
        return Stream(events)


def informer(items: list[dict[str, Any]] = ()) -> tuple[Informer[OwnedRecord], ScriptedRest, list[tuple[str, str]]]:  # type: ignore[assignment]
    seen: list[tuple[str, str]] = []
    cache: Informer[OwnedRecord] = Informer(client.ApiClient(), OWNED["ConfigMap"], transform=OwnedRecord)
    cache.add_event_handler(lambda kind, record: seen.append((kind, str(record.version))))
    rest = ScriptedRest()
    rest.items = list(items)
    cache.rest = rest  # type: ignore[assignment]
    cache._list("", first=True)
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


def test_the_stream_orders_the_changes_whatever_the_versions_look_like():
    cache, rest, seen = informer()
    rest.events = [event("ADDED", config_map("cm", "kiwi")), event("MODIFIED", config_map("cm", "apple")),
                   event("DELETED", config_map("cm", "apple")), event("ADDED", config_map("cm", "banana"))]
    cache._versions[""] = "list"
    cache._watch("")
    assert cached(cache) == "banana"
    assert seen == [("ADDED", "kiwi"), ("MODIFIED", "apple"), ("DELETED", "apple"), ("ADDED", "banana")]


def test_an_event_at_the_version_held_reports_nothing_and_is_not_transformed():
    """A relist's event repeated by the watch from an older version, or a bookmark-less resume: the
    cache has that version already; a transform is most of the cost of an event."""
    cache, rest, seen = informer()
    made: list[str] = []

    def counting(obj: dict[str, Any]) -> OwnedRecord:
        made.append(obj["metadata"]["resourceVersion"])
        return OwnedRecord(obj)

    cache.transform = counting
    rest.events = [event("ADDED", config_map("cm", "fig")), event("MODIFIED", config_map("cm", "fig"))]
    cache._versions[""] = "list"
    cache._watch("")
    assert made == ["fig"] and seen == [("ADDED", "fig")]


def test_the_first_list_is_listed_and_a_relist_reports_what_changed_and_what_went():
    cache, rest, seen = informer(items=[config_map("a", "a1"), config_map("b", "b1")])
    assert sorted(seen) == [(LISTED, "a1"), (LISTED, "b1")]
    seen.clear()
    rest.items = [config_map("a", "a2"), config_map("b", "b1"), config_map("c", "c1")]
    cache._list("", first=False)
    rest.items = [config_map("a", "a2"), config_map("c", "c1")]
    cache._list("", first=False)
    assert sorted(seen) == [("ADDED", "c1"), ("DELETED", "b1"), ("MODIFIED", "a2")]
    assert (cached(cache, "a"), cached(cache, "b"), cached(cache, "c")) == ("a2", None, "c1") and rest.lists == 3
