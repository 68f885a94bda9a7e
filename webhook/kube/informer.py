"""Watch-backed in-memory caches of any namespaced kind, through the official ``kubernetes`` client.

An :class:`Informer` lists its kind (in pages), then watches from the list's ``resourceVersion`` with
bookmarks on, so a quiet watch still advances; a watch that ends is resumed from the last version
seen, and a ``410 Gone`` (history compacted) starts over with a fresh list whose difference from
the cache is reported as events, so no deletion is missed while disconnected. Errors back off
exponentially with jitter. The cache holds what ``transform`` makes of each object — a record
(:mod:`.records`) with a ``key`` (namespace, name) and a ``version`` (resourceVersion), as few
Python objects as it can be — optionally indexed (``index``: e.g. by owning job).

Lists go page by page (``limit``/``continue``) straight into the cache: a page is transformed and
applied before the next is asked for, so neither the first list nor a re-list after ``410 Gone``
holds the kind twice.

A resourceVersion is opaque (the API's contract): the cache compares it for equality only, and takes
the order of changes from the watch stream, as client-go's reflector does. Writers that got an
object back from the API server put it in the cache at once (:meth:`Informer.store`, given the
:meth:`Informer.position` read before the request): the stored version waits for its own event on
the stream, and the events before it, which are older, are passed over; the event, when it
arrives, is no change and reports nothing. An answer is refused when the stream changed or deleted
that object after the request went out — the cache is then as new as the answer, or newer — and
a list keeps what was stored after it began. A cache that is behind anyway meets a ``409
Conflict`` or a create's ``AlreadyExists`` and its writer starts over.

:class:`JobInformer` is the Volcano Job cache of the webhook and the reconciler.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, Kind, ObjectKey

from .backoff import Backoff
from .records import JobRecord, Version, resource_version
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
# The event of an object the first list of a namespace found.
LISTED = "LISTED"
EventHandler = Callable[[str, Any], None]
PAGE = 500
# How many of the latest changes (and deletions) the stream made are remembered by object, for
# :meth:`Informer.store` to refuse an answer older than the cache.
RECENT = 10_000
# How long a stored write waits for its own event before the stream is believed again: far longer
# than a watch takes to deliver one, so only an event that can never come (missed by a lost watch
# the list after it did not see) is given up on.
PENDING_FOR = 30.0
# How often a kind the API server does not serve (a CRD not installed yet) is looked for again.
NOT_SERVED_RETRY = 10.0


def object_key(obj: Obj) -> tuple[str, str]:
    """``(namespace, name)`` of an object from the stream: a plain tuple, which finds the entry its
    record's :class:`ObjectKey` made (one per watch event; the record makes the key it keeps)."""
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


def without_managed_fields(obj: Obj) -> Obj:
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


class _Gone(Exception):
    """The watch's resourceVersion is older than the history the API server keeps."""


class Informer(Generic[R]):
    """List-then-watch of one kind in all namespaces or the ones given, one thread each.

    Each handler (``on_event``, then those of :meth:`add_event_handler`) is called ``(type, record)``
    from the informer's threads with ``ADDED``, ``MODIFIED`` or
    ``DELETED`` for every change, including those found by a re-list; not for an object the cache
    already holds at that version. What the first list finds is reported as :data:`LISTED`: it is
    what was there, not a change. A deletion the watch saw is reported with the object as it was
    deleted (a plain dict, ``managedFields`` removed) when ``deleted_objects`` is set, for a handler
    that needs more than the record kept.
    """

    def __init__(
        self,
        api: client.ApiClient,
        resource: Kind,
        namespaces: Iterable[str] = (),
        *,
        transform: Callable[[Obj], R],
        label_selector: str | None = None,
        on_event: EventHandler | None = None,
        index: Callable[[R], Hashable | None] | None = None,
        deleted_objects: bool = False,
        on_synced: Callable[[], None] | None = None,
        watch_timeout: int = 300,
    ) -> None:
        self.rest = Rest(api)
        self.resource = resource
        self.namespaces = list(namespaces) or [""]
        self.label_selector = label_selector
        # Who hears of each change: client-go's SharedInformer handlers, one cache for every controller.
        self._handlers: list[EventHandler] = [on_event] if on_event is not None else []
        self.index_of = index
        self.transform = transform
        self.deleted_objects = deleted_objects
        self.on_synced = on_synced
        self.watch_timeout = watch_timeout
        # Keyed by ObjectKey; a plain (namespace, name) finds the same entry, without making one.
        self._items: dict[tuple[str, str], R] = {}
        # Index value → the key of the one object with it, or a set of keys when there are more
        # (an owner has one object of a kind, mostly: a dict each would cost more than the records).
        self._index: dict[Hashable, tuple[str, str] | set[tuple[str, str]]] = {}
        # The cache's place in the stream of changes it applied: a count, bumped by each change and
        # by each list's start (:meth:`position`).
        self._seq = 0
        # The position of the latest change (a deletion too) to each recently changed object.
        self._recent: OrderedDict[tuple[str, str], int] = OrderedDict()
        # Stored answers waiting for their own event: the version stored, the position then, and when.
        self._pending: dict[tuple[str, str], tuple[Version, int, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._streams: set[Stream] = set()
        self.relists = 0
        # False from a failed list or watch until the next one succeeds: the API server is away.
        self.connected = False
        # False while a list answers 404: the kind is not served (None: not listed yet).
        self.served: bool | None = None

    # Cache reads ---------------------------------------------------------------------------------

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

    def index_keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._index)

    def __len__(self) -> int:
        return len(self._items)

    # Cache writes --------------------------------------------------------------------------------

    def position(self) -> int:
        """Where the cache stands in the stream of changes: read it before a request whose answer
        goes to :meth:`store`."""
        return self._seq

    def store(self, obj: Obj, since: int | None = None) -> bool:
        """Put an object the API server answered outside the watch in the cache — unless the stream
        changed or deleted it after ``since`` (the :meth:`position` before the request; without it,
        unless it was deleted lately). True when it changed the cache."""
        key = object_key(obj)
        with self._lock:
            if self._stale(key, resource_version(obj), since):
                return False
        # Outside the lock, as the watch transforms; the checks again after it.
        record = self.transform(obj)
        with self._lock:
            if self._stale(key, record.version, since):
                return False
            if not self._put(record):
                return False
            self._pending[key] = (record.version, self._seq, time.monotonic())
            return True

    def _stale(self, key: tuple[str, str], version: Version, since: int | None) -> bool:
        """Whether an answer at ``version`` would tell the cache nothing (called under the lock): the
        stream changed or deleted ``key`` after ``since``, or already brought that very version —
        the watch and a write's answer race, and the loser is not transformed a second time."""
        changed_at = self._recent.get(key)
        if changed_at is not None and (key not in self._items if since is None else changed_at > since):
            return True
        current = self._items.get(key)
        return current is not None and current.version == version

    def forget(self, namespace: str, name: str) -> bool:
        """Drop an object this process just deleted, without waiting for the watch to say so: a
        reconcile meanwhile must not find it and delete it again. True when the cache held it."""
        with self._lock:
            return self._drop((namespace, name)) is not None

    def _changed(self, key: tuple[str, str]) -> None:
        """Note a change the stream (or a list, or a delete of our own) made to ``key``."""
        self._seq += 1
        self._recent[key] = self._seq
        self._recent.move_to_end(key)
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)

    def _put(self, record: R) -> bool:
        key = record.key
        current = self._items.get(key)
        if current is not None and current.version == record.version:
            return False
        if current is not None:
            self._unindex(key, current)
        self._items[key] = record
        if self.index_of is not None:
            index = self.index_of(record)
            if index is not None:
                held = self._index.get(index)
                if held is None:
                    self._index[index] = key
                elif isinstance(held, set):
                    held.add(key)
                elif held != key:
                    self._index[index] = {held, key}
        return True

    def _drop(self, key: tuple[str, str]) -> R | None:
        self._pending.pop(key, None)
        self._changed(key)
        current = self._items.pop(key, None)
        if current is not None:
            self._unindex(key, current)
        return current

    def _unindex(self, key: tuple[str, str], record: R) -> None:
        if self.index_of is None:
            return
        index = self.index_of(record)
        held = self._index.get(index) if index is not None else None
        if held is None:
            return
        if isinstance(held, set):
            held.discard(key)
            if len(held) == 1:
                self._index[index] = next(iter(held))
            elif not held:
                del self._index[index]
        elif held == key:
            del self._index[index]

    def _relist(self, namespace: str, first: bool = False) -> str:
        """List one namespace (or all) page by page into the cache, reporting what changed; then
        drop what the list no longer has. What a write stored after the list began stays (the list
        may predate it; the watch from the list's version reports it). Returns the list's
        resourceVersion."""
        with self._lock:
            self._seq += 1
            began = self._seq
        seen: set[tuple[str, str]] = set()
        listed_rv = ""
        for page, rv in self._pages(namespace):
            listed_rv = listed_rv or rv
            events: list[tuple[str, R]] = []
            with self._lock:
                for record in page:
                    key: tuple[str, str] = record.key
                    seen.add(key)
                    if self._stored_since(key, began, record.version):
                        continue
                    existed = key in self._items
                    if self._put(record):
                        if not first:
                            self._changed(key)
                        events.append((LISTED if first else "MODIFIED" if existed else "ADDED", record))
            for kind, record in events:
                self._emit(kind, record)
        gone: list[R] = []
        with self._lock:
            for key in [k for k in self._items if (not namespace or k[0] == namespace) and k not in seen]:
                if not self._stored_since(key, began, None):
                    dropped = self._drop(key)
                    if dropped is not None:
                        gone.append(dropped)
        for record in gone:
            self._emit("DELETED", record)
        return listed_rv

    def _stored_since(self, key: tuple[str, str], began: int, listed: Version | None) -> bool:
        """Whether a write's answer stored at or after position ``began`` is waiting for its event
        and the list (which has ``listed`` of it) may predate it. One stored before the list began,
        or the very version listed, is in the list — whose watch will not repeat its event — and
        waits no more."""
        pending = self._pending.get(key)
        if pending is None:
            return False
        if pending[1] >= began and pending[0] != listed:
            return True
        del self._pending[key]
        return False

    def _passed_over(self, key: tuple[str, str], version: Version) -> bool:
        """Whether a watch event at ``version`` is older than a write stored for ``key`` (called
        under the lock): the write's own event clears the wait, and so does waiting too long."""
        pending = self._pending.get(key)
        if pending is None:
            return False
        if pending[0] != version and time.monotonic() - pending[2] < PENDING_FOR:
            return True
        del self._pending[key]
        return False

    def add_event_handler(self, handler: EventHandler) -> None:
        """Have ``handler`` called with every event from now on, after the handlers added before it."""
        self._handlers.append(handler)

    def _emit(self, kind: str, record: Any) -> None:
        for handler in self._handlers:
            try:
                handler(kind, record)
            except Exception:
                key = record.key if hasattr(record, "key") else object_key(record)
                log.exception("%s event handler failed for %s/%s", self.resource.kind, *key)

    # Lifecycle -----------------------------------------------------------------------------------

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

    # The loop ------------------------------------------------------------------------------------

    def _query(self) -> list[tuple[str, str]]:
        return [("labelSelector", self.label_selector)] if self.label_selector else []

    def _pages(self, namespace: str) -> Iterator[tuple[list[R], str]]:
        """The list, a page of records at a time, with the list's resourceVersion."""
        token = ""
        while True:
            query = [*self._query(), ("limit", str(PAGE))] + ([("continue", token)] if token else [])
            page = self.rest.call("GET", self.resource.path(namespace or None), query=query, timeout=60)
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or ""
            items = page.get("items") or []
            del page  # the page's dicts go as soon as they are records
            records = []
            while items:
                records.append(self.transform(items.pop()))
            yield records, rv
            token = meta.get("continue") or ""
            if not token:
                return

    def _run(self, namespace: str) -> None:
        backoff = Backoff()
        rv = ""
        what = f"{self.resource.plural} in {namespace or 'all namespaces'}"
        while not self._stop.is_set():
            try:
                if not rv:
                    listed_before = namespace in self._synced
                    rv = self._relist(namespace, first=not listed_before)
                    self.relists += 1
                    log.info("listed %s (%d cached)", what, len(self._items))
                    self._listed(namespace, served=True)
                rv = self._watch(namespace, rv)
                backoff.reset()
            except _Gone:
                log.info("watch of %s expired (410 Gone); listing again", what)
                rv = ""
            except Exception as exc:  # API errors and connection errors: urllib3, socket, protocol
                if self._stop.is_set():
                    return
                if not rv and isinstance(exc, ApiException) and exc.status == 404:
                    # The list's kind is not served (its CRD not installed yet, or removed): none of
                    # it exists, which is an answer — synced, not failing — until it is served.
                    self._not_served(namespace, what)
                    self._stop.wait(NOT_SERVED_RETRY)
                    continue
                self.connected = False
                delay = backoff.next_delay()
                status = exc.status if isinstance(exc, ApiException) else type(exc).__name__
                log.warning("list/watch of %s failed (%s); listing again in %.1fs", what, status, delay)
                # A fresh list, rather than resuming the watch, proves the server is back and
                # reports anything deleted meanwhile.
                rv = ""
                self._stop.wait(delay)

    def _not_served(self, namespace: str, what: str) -> None:
        if self.served is not False:
            log.warning("%s: the API server does not serve %s (is its CRD installed?); none can exist, "
                        "looking again every %.0fs", what, self.resource.plural, NOT_SERVED_RETRY)
        with self._lock:
            # Dropped as deletions are: a write's answer waiting for its event waits no more.
            gone = [r for k in [k for k in self._items if not namespace or k[0] == namespace] if (r := self._drop(k)) is not None]
        for record in gone:
            self._emit("DELETED", record)
        self._listed(namespace, served=False)

    def _listed(self, namespace: str, served: bool) -> None:
        """A list of ``namespace`` answered (``served``: the kind's items, else a 404 for the kind): it is
        synced, the server is there, and ``on_synced`` runs once every namespace is."""
        first = not self.synced
        self._synced.add(namespace)
        self.connected = True
        self.served = served
        if first and self.synced and self.on_synced is not None:
            self.on_synced()

    def _watch(self, namespace: str, rv: str) -> str:
        """Stream events until the watch ends; return the last resourceVersion seen."""
        # Spread the watches' ends, as client-go does, so that informers do not re-watch in step.
        timeout = int(self.watch_timeout * (1 + random.random()))
        query = [*self._query(), ("resourceVersion", rv), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout))]
        stream = self.rest.watch(self.resource.path(namespace or None), query, timeout + 30)
        with self._lock:
            self._streams.add(stream)
        if self._stop.is_set():
            stream.cancel()
        try:
            for event in stream:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise ApiException(status=obj.get("code"), reason=obj.get("reason"))
                self.connected = True
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = new_rv
                if kind in ("ADDED", "MODIFIED"):
                    key, version = object_key(obj), resource_version(obj)
                    with self._lock:
                        # Older than a write stored, whose own event is still to come; or that
                        # event, the cache at its version already: skipped before any work on it.
                        if self._passed_over(key, version):
                            continue
                        current = self._items.get(key)
                        if current is not None and current.version == version:
                            continue
                    record = self.transform(obj)
                    with self._lock:
                        changed = not self._passed_over(key, version) and self._put(record)
                        if changed:
                            self._changed(key)
                    if changed:
                        self._emit(kind, record)
                elif kind == "DELETED":
                    with self._lock:
                        gone = self._drop(object_key(obj))
                    if gone is not None:
                        self._emit(kind, without_managed_fields(obj) if self.deleted_objects else gone)
        finally:
            with self._lock:
                self._streams.discard(stream)
        return rv


class JobInformer(Informer[JobRecord]):
    """The cache of Volcano Jobs, in all namespaces or the ones given, as :class:`JobRecord`."""

    def __init__(self, api: client.ApiClient, namespaces: Iterable[str] = (), on_event: EventHandler | None = None,
                 on_synced: Callable[[], None] | None = None, watch_timeout: int = 300) -> None:
        super().__init__(api, VOLCANO_JOB, namespaces, transform=JobRecord, on_event=on_event, on_synced=on_synced,
                         watch_timeout=watch_timeout)
