"""Watch-backed caches of one kind, as client-go's reflector and indexer: list in pages, watch with
bookmarks, resume a watch at its last version after an error, list again only when the API server no
longer holds that version (``410 Gone``) or after a failed list, and report each change to the handlers. Only
its own threads write a cache; readers share it. resourceVersions are compared for equality only.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any, Generic, Protocol, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.plugins.kinds import Kind, ObjectKey

from .backoff import delay
from .records import Version, resource_version
from .rest import Rest, Stream

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class Record(Protocol):
    """What a cache holds of an object: its key and its resourceVersion."""

    @property
    def key(self) -> ObjectKey: ...
    @property
    def version(self) -> Version: ...


R = TypeVar("R", bound=Record)
# The event of an object the first list of a namespace found: what was there, not a change.
LISTED = "LISTED"
EventHandler = Callable[[str, Any], None]
PAGE = 500
# How often a kind the API server does not serve (a CRD not installed yet) is looked for again.
NOT_SERVED_RETRY = 10.0
# A watch asks to end after this long and a random part of it again, as client-go's reflector.
WATCH_TIMEOUT = 300


def object_key(obj: Obj) -> tuple[str, str]:
    """``(namespace, name)`` of an object from the stream: a plain tuple (faster to make than an
    :class:`ObjectKey`) that finds the entry its record's key made."""
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


class _Gone(Exception):
    """The watch's resourceVersion is not in the history the API server keeps: older (410 Gone), or newer
    than a restarted API server's watch cache ("Too large resource version")."""


def _history_lost(status: Any, message: Any) -> bool:
    """A watch no resume can serve (client-go's ``isExpiredError`` and ``isTooLargeResourceVersionError``)."""
    return status == 410 or (status == 504 and "Too large resource version" in str(message or ""))


class Informer(Generic[R]):
    """List-then-watch of one kind in all namespaces or the ones given, a thread each. Handlers are called
    ``(type, record)`` from those threads: ``ADDED``, ``MODIFIED`` or ``DELETED`` for every change (a relist's
    too), :data:`LISTED` for what the first list found, never for a version the cache holds; with
    ``deleted_objects``, a deletion the watch saw comes as the object it was (a dict)."""

    def __init__(self, api: client.ApiClient, resource: Kind, namespaces: Iterable[str] = (), *, transform: Callable[[Obj], R],
                 label_selector: str | None = None, field_selector: str | None = None, index: Callable[[R], Hashable | None] | None = None,
                 deleted_objects: bool = False, on_synced: Callable[[], None] | None = None) -> None:
        self.rest = Rest(api)
        self.resource = resource
        self.namespaces = list(namespaces) or [""]
        self.selectors = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        self._handlers: list[EventHandler] = []
        self.index_of = index
        self.transform = transform
        self.deleted_objects = deleted_objects
        self.on_synced = on_synced
        self._items: dict[tuple[str, str], R] = {}
        # Index value → its one key, or the set of them when several share it (a set each costs memory).
        self._index: dict[Hashable, tuple[str, str] | set[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._streams: set[Stream] = set()
        # By namespace, the version a watch resumes at: the last its events or list brought ("" or
        # none: list first).
        self._versions: dict[str, str] = {}
        # False from a failed list or watch until the next one succeeds: the API server is away.
        self.connected = False
        # False while a list answers 404: the kind is not served (None: not listed yet).
        self.served: bool | None = None

    @property
    def synced(self) -> bool:
        return len(self._synced) == len(self.namespaces)

    def get(self, namespace: str, name: str) -> R | None:
        return self._items.get((namespace, name))

    def items(self) -> list[R]:
        with self._lock:
            return list(self._items.values())

    def by_index(self, key: Hashable) -> list[R]:
        with self._lock:
            found = self._index.get(key)
            if found is None:
                return []
            return [self._items[k] for k in found] if isinstance(found, set) else [self._items[found]]

    def __len__(self) -> int:
        return len(self._items)

    def add_event_handler(self, handler: EventHandler) -> None:
        """Have ``handler`` called with every event from now on, after the handlers added before it."""
        self._handlers.append(handler)

    def _put(self, record: R) -> None:
        key = record.key
        current = self._items.get(key)
        if current is not None:
            self._unindex(key, current)
        self._items[key] = record
        index = self.index_of(record) if self.index_of is not None else None
        if index is not None:
            held = self._index.get(index)
            if held is None:
                self._index[index] = key
            elif isinstance(held, set):
                held.add(key)
            elif held != key:
                self._index[index] = {held, key}

    def _drop(self, key: tuple[str, str]) -> R | None:
        current = self._items.pop(key, None)
        if current is not None:
            self._unindex(key, current)
        return current

    def _unindex(self, key: tuple[str, str], record: R) -> None:
        index = self.index_of(record) if self.index_of is not None else None
        held = self._index.get(index) if index is not None else None
        if isinstance(held, set):
            held.discard(key)
            if len(held) == 1:
                self._index[index] = next(iter(held))
        elif held == key:
            del self._index[index]

    def _emit(self, kind: str, record: Any) -> None:
        for handler in self._handlers:
            try:
                handler(kind, record)
            except Exception:
                key = record.key if hasattr(record, "key") else object_key(record)
                log.exception("%s event handler failed for %s/%s", self.resource.kind, *key)

    def _drop_all(self, namespace: str, keep: AbstractSet[tuple[str, str]] = frozenset()) -> None:
        """Drop what ``namespace`` (all, for ``""``) holds but ``keep``, reporting each as deleted."""
        with self._lock:
            gone = [r for k in [k for k in self._items if (not namespace or k[0] == namespace) and k not in keep]
                    if (r := self._drop(k)) is not None]
        for record in gone:
            self._emit("DELETED", record)

    def start(self) -> None:
        for namespace in self.namespaces:
            thread = threading.Thread(target=self._run, args=(namespace,), daemon=True,
                                      name=f"{self.resource.plural}-informer-{namespace or 'all'}")
            thread.start()
            self._threads.append(thread)

    def cancel(self) -> None:
        """Stop now, without waiting: open watches are cancelled, not waited out."""
        self._stop.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.cancel()

    def join(self, deadline: float) -> None:
        """Wait for the threads to end, until ``deadline`` (``time.monotonic()``)."""
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 2.0) -> None:
        self.cancel()
        self.join(time.monotonic() + timeout)

    def _run(self, namespace: str) -> None:
        failures = 0
        what = self.resource.plural + (f" in {namespace}" if namespace else "")
        while not self._stop.is_set():
            rv = self._versions.get(namespace, "")
            try:
                if not rv:
                    self._versions[namespace] = self._list(namespace, first=namespace not in self._synced)
                    log.info("listed %s (%d cached)", what, len(self._items))
                    self._listed(namespace, served=True)
                self._watch(namespace)
                failures = 0
            except _Gone:
                log.info("watch of %s from version %s is out of the API server's history; listing again", what,
                         self._versions.pop(namespace, ""))
            except Exception as exc:  # API errors and connection errors: urllib3, socket, protocol
                if self._stop.is_set():
                    return
                if not rv and isinstance(exc, ApiException) and exc.status == 404:
                    # Not served (no CRD yet): an answer, so synced and empty, not failing.
                    if self.served is not False:
                        log.warning("the API server does not serve %s (is its CRD installed?); looking again every %.0fs",
                                    what, NOT_SERVED_RETRY)
                    self._drop_all(namespace)
                    self._listed(namespace, served=False)
                    self._stop.wait(NOT_SERVED_RETRY)
                    continue
                self.connected = False
                wait = delay(failures, 0.5, 30.0)
                failures += 1
                status = exc.status if isinstance(exc, ApiException) else type(exc).__name__
                # As client-go's reflector: a watch resumes at the last version it saw (the API server
                # replays every change since, deletions included); only a list starts over.
                rv = self._versions.get(namespace, "")
                again = f"watching again from version {rv}" if rv else "listing again"
                log.warning("list/watch of %s failed (%s); %s in %.1fs", what, status, again, wait)
                self._stop.wait(wait)

    def _list(self, namespace: str, first: bool) -> str:
        """List one namespace (or all) page by page into the cache, reporting what changed, then drop
        what the list no longer has; returns the list's resourceVersion."""
        seen: set[tuple[str, str]] = set()
        listed_rv = ""
        for page, rv in self._pages(namespace):
            listed_rv = listed_rv or rv
            events: list[tuple[str, R]] = []
            with self._lock:
                for record in page:
                    seen.add(record.key)
                    current = self._items.get(record.key)
                    if current is None or current.version != record.version:
                        self._put(record)
                        events.append((LISTED if first else "ADDED" if current is None else "MODIFIED", record))
            for kind, record in events:
                self._emit(kind, record)
        self._drop_all(namespace, seen)
        return listed_rv

    def _pages(self, namespace: str) -> Iterator[tuple[list[R], str]]:
        """The list, a page of records at a time, with the list's resourceVersion."""
        token = ""
        while True:
            query = [*self.selectors, ("limit", str(PAGE))] + ([("continue", token)] if token else [])
            page = self.rest.call("GET", self.resource.path(namespace or None), query=query, timeout=60)
            meta = page.get("metadata") or {}
            items = page.get("items") or []
            del page  # the page's dicts go as soon as they are records
            records = []
            while items:
                item = items.pop()
                # As the watch's objects and client-go's unstructured lists: each says its kind.
                item.setdefault("apiVersion", self.resource.api_version)
                item.setdefault("kind", self.resource.kind)
                records.append(self.transform(item))
            yield records, meta.get("resourceVersion") or ""
            token = meta.get("continue") or ""
            if not token:
                return

    def _listed(self, namespace: str, served: bool) -> None:
        """A list of ``namespace`` answered: it is synced, and ``on_synced`` runs once all are."""
        first = not self.synced
        self._synced.add(namespace)
        self.connected = True
        self.served = served
        if first and self.synced and self.on_synced is not None:
            self.on_synced()

    def _watch(self, namespace: str) -> None:
        """Stream events from the namespace's last version until the watch ends, keeping the last seen."""
        rv = self._versions[namespace]
        timeout = int(WATCH_TIMEOUT * (1 + random.random()))
        query = [*self.selectors, ("resourceVersion", rv), ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout))]
        try:
            stream = self.rest.watch(self.resource.path(namespace or None), query, timeout + 30)
        except ApiException as exc:
            if _history_lost(exc.status, exc.body):
                raise _Gone() from None
            raise
        self.connected = True  # the watch answered: the API server is back, whether or not anything changes
        with self._lock:
            self._streams.add(stream)
        if self._stop.is_set():
            stream.cancel()
        try:
            for event in stream:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if _history_lost(obj.get("code"), obj.get("message")):
                        raise _Gone()
                    raise ApiException(status=obj.get("code"), reason=obj.get("reason"))
                self.connected = True
                self._versions[namespace] = (obj.get("metadata") or {}).get("resourceVersion") or self._versions[namespace]
                if kind in ("ADDED", "MODIFIED"):
                    current = self._items.get(object_key(obj))
                    if current is not None and current.version == resource_version(obj):
                        continue  # a version the cache holds: no change, and no transform
                    record = self.transform(obj)
                    with self._lock:
                        self._put(record)
                    self._emit(kind, record)
                elif kind == "DELETED":
                    with self._lock:
                        gone = self._drop(object_key(obj))
                    if gone is not None:
                        (obj.get("metadata") or {}).pop("managedFields", None)
                        self._emit(kind, obj if self.deleted_objects else gone)
        finally:
            with self._lock:
                self._streams.discard(stream)
