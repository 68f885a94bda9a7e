"""Jobs (Volcano Jobs, Indexed Jobs, JobSets) from files in a directory: the embedded default source, for a server with no cluster.

Files are read and parsed off the event loop: a 50 MB YAML file dropped into the directory once
froze the server, ``/healthz`` included, for minutes. One worker thread looks at the directory and
reads small files itself; a file over ``child_bytes`` is parsed by a child process
(:mod:`volcano_job_webhook.jobfiles`), because pure-Python YAML parsing in a thread holds the GIL
the event loop needs. The worker builds a new table and swaps it in whole, so a lookup sees the
old jobs or the new ones, never half of each; ``start`` returns at once and the server answers
``/healthz`` (and ``/readyz``: not ready) while the first load runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Any

from volcano_job_webhook.documents import DocumentError, parse_documents, read_text
from volcano_job_webhook.jobfiles import ParseDelayed, ParserProcess
from volcano_job_webhook.limits import MAX_INPUT_BYTES
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, WORKLOADS, Kind, kind_of

log = logging.getLogger(__name__)

# A workload's identity in the table: (its kind, namespace, name).
FileKey = tuple[Kind, str, str]

JOB_SUFFIXES = (".yaml", ".yml", ".json")
# Files up to this size are parsed in the worker thread (about 40 ms of GIL); larger ones by the child.
CHILD_BYTES = 16 * 1024
Signature = dict[Path, tuple[int, int]]


class DirectoryJobSource:
    """Jobs read from ``*.yaml``, ``*.yml`` and ``*.json`` files in one directory.

    A file may hold several documents; only Volcano Jobs, Indexed Jobs and JobSets are kept and a missing namespace
    means ``default``. A lookup lists the directory again when ``interval`` seconds have passed
    since the last look; files whose names, sizes or modification times changed are re-read in the
    worker, and a file that no longer parses keeps its last good Jobs (logged), so an
    editor's half-saved file never drops jobs. A file over ``max_file_bytes``, not a regular file,
    unreadable, nested too deep or holding an alias bomb is skipped with one warning naming it, as
    is a file that holds no job, and a job whose kind, namespace and name a file earlier in name
    order holds already (the warning names that file). A file the parser child got too little CPU
    to finish (a busy machine, not the file) keeps its last good jobs and is read again at the next
    look. Each load ends with one line: how many jobs from which directory, and how many files skipped.

    A lookup answers from the current table at once, except while a look it started re-reads only
    small files, or when the job is not in the table and a look is under way: then it waits for
    that look (at most ``miss_wait`` seconds), so a Job file written a moment before its Pods is
    found, as it was when files were read on the event loop.
    """

    def __init__(self, directory: Path, interval: float = 1.0, *, max_file_bytes: int = MAX_INPUT_BYTES,
                 miss_wait: float = 1.0, child_bytes: int = CHILD_BYTES, parse_cpu_seconds: int = 60,
                 parse_wall_seconds: float | None = None) -> None:
        self.directory = Path(directory)
        self.interval = interval
        self.max_file_bytes = max_file_bytes
        self.miss_wait = miss_wait
        self.child_bytes = child_bytes
        self.parser = ParserProcess(parse_cpu_seconds, parse_wall_seconds)
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-files")
        self._look: concurrent.futures.Future[bool] | None = None
        self._checked = float("-inf")
        # Owned by the worker thread; the event loop reads only ``_jobs``, replaced whole.
        self._signature: Signature = {}
        self._by_file: dict[Path, dict[FileKey, dict[str, Any]]] = {}
        self._skipped: dict[Path, tuple[int, int]] = {}
        # Why a file that parsed gives the table nothing (or less than it holds): said once each.
        self._empty: dict[Path, str] = {}
        self._said: dict[Path, str] = {}
        self._jobs: dict[FileKey, dict[str, Any]] = {}
        self._ready = False
        self._stopped = False

    def start(self) -> None:
        """Begin the first load in the worker and return."""
        self._schedule(force=True)

    def stop(self) -> None:
        self._stopped = True
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.parser.close()

    @property
    def ready(self) -> bool:
        return self._ready

    def __len__(self) -> int:
        return len(self._jobs)

    def status(self) -> dict[str, Any]:
        return {"source": "files", "directory": str(self.directory)}

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: Kind = VOLCANO_JOB) -> dict[str, Any] | None:
        # Files are matched by name alone: a file stands for the job of that name, whatever its uid.
        look, small = self._schedule()
        job = self._jobs.get((kind, namespace, name))
        # Wait for a look under way when the job is not there, or when it only re-reads small files
        # (a few milliseconds): a Job written a moment before its Pods is then seen. A large file
        # being parsed never holds up a lookup the current table answers.
        if look is not None and not look.done() and (job is None or small):
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(look)), self.miss_wait)
            except (TimeoutError, concurrent.futures.CancelledError):
                pass
            job = self._jobs.get((kind, namespace, name))
        return job

    async def loaded(self) -> None:
        """Wait for the look under way (or a new one) to finish."""
        look, _ = self._schedule(force=True)
        if look is not None:
            await asyncio.wrap_future(look)

    def _schedule(self, force: bool = False) -> tuple[concurrent.futures.Future[bool] | None, bool]:
        """The look at the directory under way, or a new one when ``interval`` has passed and the
        directory changed (names, sizes, modification times: a listing, as cheap as before the
        worker); and whether it only re-reads files small enough for the worker thread itself."""
        look = self._look
        if look is not None and not look.done():
            return look, False
        now = time.monotonic()
        if not force and now - self._checked < self.interval:
            return None, False
        self._checked = now
        try:
            signature = self._list()
        except OSError as exc:
            log.error("cannot list jobs directory %s: %s", self.directory, exc)
            return None, False
        if signature == self._signature and self._ready and not force:
            return None, False
        small = all(sig[1] <= self.child_bytes for path, sig in signature.items() if self._signature.get(path) != sig)
        try:
            self._look = self._worker.submit(self.refresh, signature)
        except RuntimeError:  # stopped
            return None, False
        return self._look, small

    def refresh(self, signature: Signature | None = None) -> bool:
        """Re-read the files whose ``signature`` changed (listed now when not given), in the worker
        thread; True when the set of Jobs may have changed."""
        if signature is None:
            try:
                signature = self._list()
            except OSError as exc:
                log.error("cannot list jobs directory %s: %s", self.directory, exc)
                return False
        if signature == self._signature and self._ready:
            return False
        by_file = {path: jobs for path, jobs in self._by_file.items() if path in signature}
        delayed: set[Path] = set()  # the parser had too little CPU for them: read again at the next look
        for path, sig in signature.items():
            if self._signature.get(path) != sig or path not in by_file:
                try:
                    loaded = self._load(path, sig)
                except ParseDelayed as exc:
                    delayed.add(path)
                    log.warning("jobs file %s: %s; trying again at the next look",
                                "keeping its last good jobs" if path in by_file else "not loaded yet", exc)
                    continue
                if loaded is not None:
                    by_file[path] = loaded
        if self._stopped:  # a look that outlived the server (one that could not listen, say): it says nothing more
            return False
        jobs: dict[FileKey, dict[str, Any]] = {}
        origin: dict[FileKey, Path] = {}
        notes: dict[Path, str] = {}
        # In name order, the first file holding a job keeps it: the same table whatever order files changed in.
        for path in sorted(by_file):
            duplicates: list[tuple[FileKey, Path]] = []
            for key, doc in by_file[path].items():
                if key in origin:
                    duplicates.append((key, origin[key]))
                else:
                    jobs[key], origin[key] = doc, path
            if duplicates:
                notes[path] = _duplicates(path, duplicates, whole=len(duplicates) == len(by_file[path]))
            elif path in self._empty and not by_file[path]:
                notes[path] = f"jobs file skipped: {path}: {self._empty[path]}"
        for path, note in notes.items():
            if self._said.get(path) != note:
                log.warning("%s", note)
        self._said = notes
        self._empty = {path: why for path, why in self._empty.items() if path in signature}
        # A delayed file left out of the signature makes the next look's listing differ, so it reads it again.
        self._signature = {path: sig for path, sig in signature.items() if path not in delayed}
        self._by_file = by_file
        self._jobs = jobs  # one assignment: readers see the old table or the new one
        self._ready = True
        skipped = len(signature.keys() - set(origin.values()))
        log.info("loaded %d job%s from %s (%d file%s skipped)", len(jobs), "" if len(jobs) == 1 else "s",
                 self.directory, skipped, "" if skipped == 1 else "s")
        return True

    def _list(self) -> Signature:
        signature: Signature = {}
        for path in sorted(self.directory.iterdir()):
            if path.suffix not in JOB_SUFFIXES:
                continue
            try:
                st = path.stat()
            except OSError:  # a dangling link, say: read (and refused, with a warning) as it is
                signature[path] = (-1, -1)
                continue
            signature[path] = (st.st_mtime_ns, st.st_size)
        return signature

    def _load(self, path: Path, sig: tuple[int, int]) -> dict[FileKey, dict[str, Any]] | None:
        try:
            if self.child_bytes < sig[1] <= self.max_file_bytes:  # larger ones are refused unread, here
                docs = self.parser.parse(str(path), self.max_file_bytes)
            else:
                docs = parse_documents(read_text(str(path), self.max_file_bytes), str(path))
        except ParseDelayed:
            raise  # not the file's fault: the caller reads it again later
        except DocumentError as exc:
            # Said once per version of the file, not on every look.
            if self._skipped.get(path) != sig:
                kept = "keeping its last good jobs" if path in self._by_file else "skipped"
                log.warning("jobs file %s: %s", kept, exc)
            self._skipped[path] = sig
            return None
        self._skipped.pop(path, None)
        jobs = {}
        others: list[str] = []
        for doc in docs:
            kind = kind_of(doc) if isinstance(doc, dict) else None
            if kind in WORKLOADS:
                meta = doc.get("metadata") or {}
                if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                    jobs[(kind, meta.get("namespace") or "default", meta["name"])] = doc
                else:
                    others.append(f"a {kind.title} without metadata.name")
            else:
                found = doc.get("kind") if isinstance(doc, dict) else None
                others.append(found[:60] if isinstance(found, str) and found
                              else "an object without kind" if isinstance(doc, dict) else f"a {type(doc).__name__}")
        if jobs:
            self._empty.pop(path, None)
        else:
            self._empty[path] = (f"holds no {_WORKLOAD_TITLES} (found: {', '.join(dict.fromkeys(others))})"
                                 if others else "holds no document")
        return jobs


_TITLES = [kind.title for kind in WORKLOADS]
_WORKLOAD_TITLES = f"{', '.join(_TITLES[:-1])} or {_TITLES[-1]}"


def _duplicates(path: Path, duplicates: list[tuple[FileKey, Path]], *, whole: bool) -> str:
    """The warning for a file's jobs that files earlier in name order hold already."""
    (kind, namespace, name), first = duplicates[0]
    what = f"{kind.title} {namespace}/{name}"
    more = f" and {len(duplicates) - 1} more" if len(duplicates) > 1 else ""
    if whole:
        return f"jobs file skipped: {path}: {what}{more} already in {first} (a duplicate)"
    return f"jobs file {path}: {what}{more} skipped: already in {first} (a duplicate)"
