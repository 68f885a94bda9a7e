"""Where the webhook finds Volcano Jobs: one small interface, two sources.

* :class:`DirectoryJobSource` (the embedded default): Job YAML/JSON files in a directory, re-read
  when the directory changes, so the server runs with no cluster at all;
* :class:`webhook.kubecache.KubeJobSource`: a watch-backed cache of the cluster's Jobs.

Admission never waits on a list: ``get`` answers from memory, and a kube cache miss costs one GET.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from volcano_job_webhook.plugins.keys import JobKey

from volcano_job_webhook.documents import DocumentError, parse_documents, read_text

log = logging.getLogger(__name__)

JOB_SUFFIXES = (".yaml", ".yml", ".json")


class DirectoryJobSource:
    """Volcano Jobs read from ``*.yaml``, ``*.yml`` and ``*.json`` files in one directory.

    A file may hold several documents; only ``kind: Job`` objects are kept and a missing namespace
    means ``default``. The directory is looked at again, at most every ``interval`` seconds, when a
    lookup happens; files whose names, sizes or modification times changed are re-read, and a file
    that no longer parses keeps its last good Jobs (logged), so an editor's half-saved file never
    drops jobs.
    """

    def __init__(self, directory: Path, interval: float = 1.0) -> None:
        self.directory = Path(directory)
        self.interval = interval
        self._lock = threading.Lock()
        self._signature: dict[Path, tuple[int, int]] = {}
        self._by_file: dict[Path, dict[JobKey, dict[str, Any]]] = {}
        self._jobs: dict[JobKey, dict[str, Any]] = {}
        self._checked = 0.0
        self._ready = False

    def start(self) -> None:
        self.refresh(force=True)

    def stop(self) -> None:
        pass

    @property
    def ready(self) -> bool:
        return self._ready

    def __len__(self) -> int:
        return len(self._jobs)

    def status(self) -> dict[str, Any]:
        return {"source": "files", "directory": str(self.directory)}

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.refresh()
        return self._jobs.get((namespace, name))

    def refresh(self, force: bool = False) -> bool:
        """Re-read changed files; True when the set of Jobs may have changed."""
        now = time.monotonic()
        if not force and now - self._checked < self.interval:
            return False
        with self._lock:
            self._checked = now
            try:
                paths = sorted(p for p in self.directory.iterdir() if p.suffix in JOB_SUFFIXES and p.is_file())
            except OSError as exc:
                log.error("cannot list jobs directory %s: %s", self.directory, exc)
                return False
            signature = {}
            for path in paths:
                try:
                    st = path.stat()
                except OSError:
                    continue
                signature[path] = (st.st_mtime_ns, st.st_size)
            if signature == self._signature and self._ready:
                return False
            for path in list(self._by_file):
                if path not in signature:
                    del self._by_file[path]
            for path, sig in signature.items():
                if self._signature.get(path) != sig or path not in self._by_file:
                    loaded = self._load(path)
                    if loaded is not None:
                        self._by_file[path] = loaded
            self._signature = signature
            jobs: dict[JobKey, dict[str, Any]] = {}
            for loaded in self._by_file.values():
                jobs.update(loaded)
            self._jobs = jobs
            self._ready = True
            return True

    @staticmethod
    def _load(path: Path) -> dict[JobKey, dict[str, Any]] | None:
        try:
            docs = parse_documents(read_text(str(path)), str(path))
        except DocumentError as exc:
            log.warning("keeping the last good jobs of %s: %s", path, exc)
            return None
        jobs = {}
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "Job":
                meta = doc.get("metadata") or {}
                if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                    jobs[(meta.get("namespace") or "default", meta["name"])] = doc
        return jobs
