"""Attackers and probes for ``bench/fuzz.py``.

Run as a separate process (``python bench/attacks.py slow PORT CONNECTIONS SECONDS`` or
``python bench/attacks.py flood PORT CA BODIES_FILE SECONDS``) so that the attacker's own work does
not slow the probes that measure the server; each prints one JSON line of what it did.

* ``slow``: keeps CONNECTIONS TLS connections open, each holding the server's resources as long
  as it lets it: half send 60 KB of a declared 3 MB body and stop, a quarter send half their
  headers, a quarter send 60 KB of a chunked body that never ends. One the server closes is
  opened again at once.
* ``flood``: sends the given request bodies (JSON lines ``[path, base64 body]``) as fast as eight
  keep-alive connections allow.

:func:`probe` (in the measuring process) sends ``/healthz`` and a normal ``/mutate`` in turn and
records each latency, as the API server's health checks and Pod creations would see them.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import ssl
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SLOW_BODY = 60_000


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


async def _slow_one(port: int, kind: int, context: ssl.SSLContext, deadline: float, stats: Counter[str]) -> None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=context), 30)
    except (TimeoutError, OSError) as exc:
        stats[f"connect-failed {type(exc).__name__}"] += 1
        await asyncio.sleep(0.1)
        return
    stats["opened"] += 1
    head = b"POST /mutate HTTP/1.1\r\nhost: webhook\r\ncontent-type: application/json\r\n"
    if kind == 0:
        writer.write(head + b"content-length: 3000000\r\n\r\n" + b" " * SLOW_BODY)
    elif kind == 1:
        writer.write(head[:30])
    else:
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % SLOW_BODY + b" " * SLOW_BODY + b"\r\n")
    try:
        await writer.drain()
        await asyncio.wait_for(reader.read(), max(0.0, deadline - time.monotonic()))
        stats["closed-by-server"] += 1
    except TimeoutError:
        pass
    except (OSError, ssl.SSLError):
        stats["closed-by-server"] += 1
    finally:
        writer.close()


async def slow(port: int, connections: int, seconds: float) -> dict[str, int]:
    context = _insecure()
    stats: Counter[str] = Counter()
    deadline = time.monotonic() + seconds

    async def keep(slot: int) -> None:
        await asyncio.sleep(slot * 0.002)  # ramp up over a few seconds, as a real flood would
        while time.monotonic() < deadline:
            await _slow_one(port, slot % 4 if slot % 4 < 3 else 0, context, deadline, stats)

    await asyncio.gather(*(keep(i) for i in range(connections)), return_exceptions=True)
    return dict(stats)


async def flood(port: int, ca: str, bodies: list[tuple[str, bytes]], seconds: float) -> dict[str, int]:
    stats = {"sent": 0, "5xx": 0, "errors": 0}
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca), base_url=f"https://localhost:{port}",
                                 limits=limits, timeout=30) as client:
        async def worker(offset: int) -> None:
            i = offset
            while time.monotonic() < deadline:
                path, body = bodies[i % len(bodies)]
                i += 8
                try:
                    reply = await client.post(path, content=body, headers={"content-type": "application/json"})
                    stats["5xx"] += reply.status_code >= 500
                except httpx.TransportError:
                    stats["errors"] += 1
                stats["sent"] += 1

        await asyncio.gather(*(worker(i) for i in range(8)))
    return stats


@dataclass
class Probes:
    healthz: list[float] = field(default_factory=list)
    mutate: list[float] = field(default_factory=list)
    errors: int = 0
    server_errors: int = 0
    wrong: int = 0
    error_kinds: list[str] = field(default_factory=list)


async def probe(port: int, ca: Path, review: bytes, seconds: float, interval: float = 0.02) -> Probes:
    """``/healthz`` and a normal ``/mutate`` in turn every ``interval`` seconds, each on its own
    keep-alive connection; a ``/mutate`` that is not a 200 with a patch counts as ``wrong``."""
    result = Probes()
    context = ssl.create_default_context(cafile=str(ca))
    async with httpx.AsyncClient(verify=context, base_url=f"https://localhost:{port}", timeout=30) as health, \
            httpx.AsyncClient(verify=context, base_url=f"https://localhost:{port}", timeout=30) as admission:
        # Connected and warm before the clock starts (the API server keeps its connections open),
        # and no pause of this process's garbage collector counted as the server's latency.
        for _ in range(3):
            await health.get("/healthz")
            await admission.post("/mutate", content=review, headers={"content-type": "application/json"})
        gc.collect()
        gc.disable()
        deadline = time.monotonic() + seconds
        try:
            await _probe_loop(health, admission, review, deadline, interval, result)
        finally:
            gc.enable()
    return result


async def _probe_loop(health: httpx.AsyncClient, admission: httpx.AsyncClient, review: bytes, deadline: float,
                      interval: float, result: Probes) -> None:
    while time.monotonic() < deadline:
        for client, path, times in ((health, "/healthz", result.healthz), (admission, "/mutate", result.mutate)):
            started = time.perf_counter()
            try:
                if path == "/healthz":
                    reply = await client.get(path)
                else:
                    reply = await client.post(path, content=review, headers={"content-type": "application/json"})
            except httpx.TransportError as exc:
                result.errors += 1
                result.error_kinds.append(f"{path}: {type(exc).__name__}: {exc}"[:200])
                continue
            times.append(time.perf_counter() - started)
            result.server_errors += reply.status_code >= 500
            if path == "/mutate" and (reply.status_code != 200 or b'"patchType"' not in reply.content):
                result.wrong += 1
        await asyncio.sleep(interval)


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "slow":
        port, connections, seconds = int(argv[1]), int(argv[2]), float(argv[3])
        print(json.dumps(asyncio.run(slow(port, connections, seconds))), flush=True)
    elif mode == "flood":
        port, ca, path, seconds = int(argv[1]), argv[2], Path(argv[3]), float(argv[4])
        bodies = [(p, base64.b64decode(b)) for p, b in (json.loads(line) for line in path.read_text().splitlines())]
        print(json.dumps(asyncio.run(flood(port, ca, bodies, seconds))), flush=True)
    else:
        raise SystemExit(f"unknown attack {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
