"""Jobs (Volcano Jobs, Indexed Jobs, JobSets) from files in a directory: the development source
(the chart runs ``--job-source=kube``). One worker thread reads and parses the files, each within
``max_file_bytes``, and swaps the new table in whole, so the event loop never parses."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from volcano_job_webhook.documents import DocumentError, parse_documents, read_text
from volcano_job_webhook.limits import MAX_INPUT_BYTES
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, WORKLOADS, Kind, kind_of

log = logging.getLogger(__name__)

# A workload's identity, in the files' table and in the cluster's lookups: (its kind, namespace, name).
WorkloadKey = tuple[Kind, str, str]

JOB_SUFFIXES = (".yaml", ".yml", ".json")
# A look that re-reads only files this small (a few milliseconds of parsing) is waited for by a lookup.
SMALL_BYTES = 16 * 1024
Signature = dict[Path, tuple[int, int]]
# A file's jobs, and why it holds none ("" when it holds some).
Loaded = tuple[dict[WorkloadKey, dict[str, Any]], str]


class DirectoryJobSource:
    """Jobs read from ``*.yaml``, ``*.yml`` and ``*.json`` files in one directory (no namespace:
    ``default``), listed again at a lookup ``interval`` seconds after the last look, changed files
    re-read. A file that cannot be read or parsed gets one warning and keeps its last good jobs; so
    does a job a file earlier in name order holds already. A lookup waits for a look under way (at
    most ``miss_wait`` seconds) when its job is missing or only small files are re-read, so a Job
    file written a moment before its Pods is found."""

    def __init__(self, directory: Path, interval: float = 1.0, *, max_file_bytes: int = MAX_INPUT_BYTES,
                 miss_wait: float = 1.0) -> None:
        self.directory = Path(directory)
        self.interval = interval
        self.max_file_bytes = max_file_bytes
        self.miss_wait = miss_wait
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-files")
        self._look: concurrent.futures.Future[bool] | None = None
        self._checked = float("-inf")
        # Owned by the worker thread; the event loop reads only ``_jobs``, replaced whole.
        self._signature: Signature = {}
        self._by_file: dict[Path, Loaded] = {}  # each file's last good load
        self._skipped: dict[Path, tuple[int, int]] = {}
        # Why a file that parsed gives the table nothing (or less than it holds): said once each.
        self._said: dict[Path, str] = {}
        self._jobs: dict[WorkloadKey, dict[str, Any]] = {}
        self.ready = False  # JobSource.ready: the first load is done
        self._stopped = False

    def start(self) -> None:
        """Begin the first load in the worker and return."""
        self._schedule(force=True)

    def stop(self) -> None:
        self._stopped = True
        self._worker.shutdown(wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self._jobs)

    def status(self) -> dict[str, Any]:
        return {"source": "files", "directory": str(self.directory)}

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: Kind = VOLCANO_JOB) -> dict[str, Any] | None:
        # Files are matched by name alone: a file stands for the job of that name, whatever its uid.
        look, small = self._schedule()
        job = self._jobs.get((kind, namespace, name))
        if look is not None and not look.done() and (job is None or small):
            with contextlib.suppress(TimeoutError, concurrent.futures.CancelledError):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(look)), self.miss_wait)
            job = self._jobs.get((kind, namespace, name))
        return job

    def _schedule(self, force: bool = False) -> tuple[concurrent.futures.Future[bool] | None, bool]:
        """The look under way, or a new one when ``interval`` has passed and the listing (names,
        sizes, modification times) changed; and whether it re-reads only small files."""
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
        if signature == self._signature and self.ready and not force:
            return None, False
        small = all(sig[1] <= SMALL_BYTES for path, sig in signature.items() if self._signature.get(path) != sig)
        try:
            self._look = self._worker.submit(self.refresh, signature)
        except RuntimeError:  # stopped
            return None, False
        return self._look, small

    def refresh(self, signature: Signature) -> bool:
        """Re-read the files whose ``signature`` changed, in the worker; True when the Jobs may have changed."""
        if signature == self._signature and self.ready:
            return False
        by_file = {path: loaded for path, loaded in self._by_file.items() if path in signature}
        for path, sig in signature.items():
            if self._signature.get(path) != sig or path not in by_file:
                loaded = self._load(path, sig)
                if loaded is not None:
                    by_file[path] = loaded
        if self._stopped:  # a look that outlived the server (one that could not listen, say): it says nothing more
            return False
        jobs: dict[WorkloadKey, dict[str, Any]] = {}
        origin: dict[WorkloadKey, Path] = {}
        notes: dict[Path, str] = {}
        # In name order, the first file holding a job keeps it: the same table whatever order files changed in.
        for path in sorted(by_file):
            held, why = by_file[path]
            duplicates: list[tuple[WorkloadKey, Path]] = []
            for key, doc in held.items():
                if key in origin:
                    duplicates.append((key, origin[key]))
                else:
                    jobs[key], origin[key] = doc, path
            if duplicates:
                notes[path] = _duplicates(path, duplicates, whole=len(duplicates) == len(held))
            elif why:
                notes[path] = f"jobs file skipped: {path}: {why}"
        for path, note in notes.items():
            if self._said.get(path) != note:
                log.warning("%s", note)
        self._said = notes
        self._signature, self._by_file = signature, by_file
        self._jobs = jobs  # one assignment: readers see the old table or the new one
        self.ready = True
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

    def _load(self, path: Path, sig: tuple[int, int]) -> Loaded | None:
        try:
            docs = parse_documents(read_text(str(path), self.max_file_bytes), str(path))
        except DocumentError as exc:
            if self._skipped.get(path) != sig:  # said once per version of the file, not on every look
                kept = "keeping its last good jobs" if path in self._by_file else "skipped"
                log.warning("jobs file %s: %s", kept, exc)
            self._skipped[path] = sig
            return None
        self._skipped.pop(path, None)
        jobs = {}
        others: list[str] = []
        for doc in docs:
            kind = kind_of(doc) if isinstance(doc, dict) else None
            if kind is not None and kind in WORKLOADS:
                meta = doc.get("metadata") or {}
                if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                    jobs[(kind, meta.get("namespace") or "default", meta["name"])] = doc
                else:
                    others.append(f"a {kind.title} without metadata.name")
            else:
                found = doc.get("kind") if isinstance(doc, dict) else None
                others.append(found[:60] if isinstance(found, str) and found
                              else "an object without kind" if isinstance(doc, dict) else f"a {type(doc).__name__}")
        if jobs or not others:
            return jobs, "" if jobs else "holds no document"
        return jobs, f"holds no {_WORKLOAD_TITLES} (found: {', '.join(dict.fromkeys(others))})"


_WORKLOAD_TITLES = f"{', '.join(kind.title for kind in WORKLOADS[:-1])} or {WORKLOADS[-1].title}"


def _duplicates(path: Path, duplicates: list[tuple[WorkloadKey, Path]], *, whole: bool) -> str:
    """The warning for a file's jobs that files earlier in name order hold already."""
    (kind, namespace, name), first = duplicates[0]
    what = f"{kind.title} {namespace}/{name}"
    more = f" and {len(duplicates) - 1} more" if len(duplicates) > 1 else ""
    if whole:
        return f"jobs file skipped: {path}: {what}{more} already in {first} (a duplicate)"
    return f"jobs file {path}: {what}{more} skipped: already in {first} (a duplicate)"
