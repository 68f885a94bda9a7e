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
from volcano_job_webhook.jobfiles import ParserProcess
from volcano_job_webhook.limits import MAX_INPUT_BYTES
from volcano_job_webhook.plugins.keys import VOLCANO_JOBS
from volcano_job_webhook.plugins.workloads import workload_kind

log = logging.getLogger(__name__)

# A workload's identity in the table: (kind as resource.group, namespace, name).
FileKey = tuple[str, str, str]

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
    nested too deep or holding an alias bomb is skipped with one warning naming it.

    A lookup answers from the current table at once, except while a look it started re-reads only
    small files, or when the job is not in the table and a look is under way: then it waits for
    that look (at most ``miss_wait`` seconds), so a Job file written a moment before its Pods is
    found, as it was when files were read on the event loop.
    """

    def __init__(self, directory: Path, interval: float = 1.0, *, max_file_bytes: int = MAX_INPUT_BYTES,
                 miss_wait: float = 1.0, child_bytes: int = CHILD_BYTES, parse_timeout: float = 60.0) -> None:
        self.directory = Path(directory)
        self.interval = interval
        self.max_file_bytes = max_file_bytes
        self.miss_wait = miss_wait
        self.child_bytes = child_bytes
        self.parser = ParserProcess(parse_timeout)
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-files")
        self._look: concurrent.futures.Future[bool] | None = None
        self._checked = float("-inf")
        # Owned by the worker thread; the event loop reads only ``_jobs``, replaced whole.
        self._signature: Signature = {}
        self._by_file: dict[Path, dict[FileKey, dict[str, Any]]] = {}
        self._skipped: dict[Path, tuple[int, int]] = {}
        self._jobs: dict[FileKey, dict[str, Any]] = {}
        self._ready = False

    def start(self) -> None:
        """Begin the first load in the worker and return."""
        self._schedule(force=True)

    def stop(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.parser.close()

    @property
    def ready(self) -> bool:
        return self._ready

    def __len__(self) -> int:
        return len(self._jobs)

    def status(self) -> dict[str, Any]:
        return {"source": "files", "directory": str(self.directory)}

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: str = VOLCANO_JOBS) -> dict[str, Any] | None:
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
        for path, sig in signature.items():
            if self._signature.get(path) != sig or path not in by_file:
                loaded = self._load(path, sig)
                if loaded is not None:
                    by_file[path] = loaded
        jobs: dict[FileKey, dict[str, Any]] = {}
        for loaded in by_file.values():
            jobs.update(loaded)
        self._signature, self._by_file = signature, by_file
        self._jobs = jobs  # one assignment: readers see the old table or the new one
        self._ready = True
        return True

    def _list(self) -> Signature:
        signature: Signature = {}
        for path in sorted(self.directory.iterdir()):
            if path.suffix not in JOB_SUFFIXES:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            signature[path] = (st.st_mtime_ns, st.st_size)
        return signature

    def _load(self, path: Path, sig: tuple[int, int]) -> dict[FileKey, dict[str, Any]] | None:
        try:
            if self.child_bytes < sig[1] <= self.max_file_bytes:  # larger ones are refused unread, here
                docs = self.parser.parse(str(path), self.max_file_bytes)
            else:
                docs = parse_documents(read_text(str(path), self.max_file_bytes), str(path))
        except DocumentError as exc:
            # Said once per version of the file, not on every look.
            if self._skipped.get(path) != sig:
                kept = "keeping its last good jobs" if path in self._by_file else "skipped"
                log.warning("jobs file %s: %s", kept, exc)
            self._skipped[path] = sig
            return None
        self._skipped.pop(path, None)
        jobs = {}
        for doc in docs:
            kind = workload_kind(doc) if isinstance(doc, dict) else None
            if kind is not None:
                meta = doc.get("metadata") or {}
                if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                    jobs[(kind, meta.get("namespace") or "default", meta["name"])] = doc
        return jobs
