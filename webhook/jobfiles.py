"""Job files parsed in a child process, for the webhook's directory job source
(:class:`~volcano_job_webhook.server.jobs.files.DirectoryJobSource`); a module outside
:mod:`.server` so that the child imports no more than the YAML reader.

PyYAML's parser is pure Python. Run in a thread of the server it holds the GIL for as long as it
parses — measured: while a 4 MiB file of jobs was read, ``/healthz`` took 850 ms at p99 and ``/mutate``
560 ms, on a server that answers both in about a millisecond. In a child process it runs on another
core — or, on a core or CPU quota it shares with the server, only when the server leaves it idle
(``SCHED_IDLE``) — and what a hostile file could still do there (memory, time, a crash) stays there:
the child's address space is capped, a file that costs more than ``cpu_seconds`` of CPU gets the
child killed by the kernel (``RLIMIT_CPU``), and a child that died is started again for the next file.
The budget is CPU time, not time on the clock: a child that waits for a busy CPU is not its file's
fault. Only a child that gets almost none for ``wall_seconds`` is given up, and its file is tried
again later (:class:`ParseDelayed`).

The protocol on the child's standard input and output is length-prefixed pickles: ``(path, limit,
cpu_seconds)`` in, ``("ok", [pickled document, ...])`` or ``("error", message)`` out. Documents come back pickled one
by one so that the server unpickles them one at a time (each a short hold of the GIL), not as one
4 MiB object graph.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from typing import IO, Any

from volcano_job_webhook.documents import DocumentError

_HEADER = struct.Struct("!Q")
# The child's address space: a file is at most a few MiB, and parsing one takes a few times that.
CHILD_MEMORY = 1024 * 1024 * 1024


def _write(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while size:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class ParseDelayed(DocumentError):
    """The parser got too little CPU to finish the file: the file may be good, try it again later."""


class ParserProcess:
    """One child process that parses job files on request (started on first use)."""

    def __init__(self, cpu_seconds: int = 60, wall_seconds: float | None = None) -> None:
        self.cpu_seconds = cpu_seconds
        self.wall_seconds = 10.0 * cpu_seconds if wall_seconds is None else wall_seconds
        self._child: subprocess.Popen[bytes] | None = None
        self.started = 0

    def parse(self, path: str, limit: int) -> list[Any]:
        """The documents of ``path`` (:func:`~volcano_job_webhook.documents.parse_documents`'s bounds,
        ``limit`` bytes at most); raises :class:`DocumentError` for a bad file, one that cost more
        than ``cpu_seconds`` of CPU, or a child that died on it, and :class:`ParseDelayed` for one
        not parsed within ``wall_seconds``."""
        child = self._ensure()
        assert child.stdin is not None and child.stdout is not None
        try:
            _write(child.stdin, (path, limit, self.cpu_seconds))
            deadline = time.monotonic() + self.wall_seconds
            fd = child.stdout.fileno()
            (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
            status, value = pickle.loads(_read_exactly(fd, size, deadline))
        except TimeoutError:
            self.close()
            raise ParseDelayed(f"{path}: not parsed within {self.wall_seconds:g} s: the parser got too little CPU") from None
        except (EOFError, OSError, pickle.UnpicklingError):
            code = self.close()
            if code == -signal.SIGXCPU:
                raise DocumentError(f"{path}: not parsed within {self.cpu_seconds} s of CPU time") from None
            raise DocumentError(f"{path}: the parser process ended while reading it (exit status {code})") from None
        if status != "ok":
            raise DocumentError(value)
        return [pickle.loads(doc) for doc in value]

    def close(self) -> int | None:
        child, self._child = self._child, None
        if child is None:
            return None
        child.kill()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
        return child.wait()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            self.close()
            self._child = subprocess.Popen(
                [sys.executable, "-m", "volcano_job_webhook.jobfiles"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            )
            self.started += 1
        return self._child


def main() -> None:
    """The child: parse each requested file until standard input closes."""
    import resource

    from volcano_job_webhook.documents import parse_documents, read_text

    try:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    except (ValueError, OSError):  # a lower hard limit already: keep it
        pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the kernel's SIGXCPU would otherwise dump core
    # The server shares the CPU (the Pod's quota, or a pinned core) with this child: parsing
    # runs only when the server has nothing to do (SCHED_IDLE), or at least at the lowest priority.
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(_HEADER.size):
        (size,) = _HEADER.unpack(header)
        path, limit, cpu_seconds = pickle.loads(stdin.read(size))
        # RLIMIT_CPU counts the process's whole life: this file's budget starts from what is spent.
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_seconds)  # whole seconds: the budget is up to 1 s more
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        try:
            docs = parse_documents(read_text(path, limit), path)
            reply: tuple[str, Any] = ("ok", [pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL) for doc in docs])
        except DocumentError as exc:
            reply = ("error", str(exc))
        except (MemoryError, RecursionError) as exc:
            reply = ("error", f"{path}: too large to parse ({type(exc).__name__})")
        _write(stdout, reply)


if __name__ == "__main__":
    main()
