"""What the benchmarks that start a server share: pinning a process to a core, waiting until it serves,
reading the CPU time it spent."""

from __future__ import annotations

import os
import shutil
import ssl
import time
import urllib.request
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned(cmd: list[str], core: str | None) -> list[str]:
    """``cmd`` run on ``core`` by taskset, or as it is without a core or without taskset."""
    return ["taskset", "-c", core, *cmd] if core is not None and shutil.which("taskset") else cmd


def wait_ready(port: int, ca: Path, timeout: float = 60.0) -> None:
    """Return once the server on 127.0.0.1:``port`` answers ``/readyz`` with 200 over TLS trusting ``ca``."""
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become ready")
