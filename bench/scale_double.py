"""The API-server double of bench/scale.py, in a process of its own so that its CPU and its GIL are
not the measured processes': ``python bench/scale_double.py PORT``.

Serves tests/helpers/apiserver.py's FakeApiServer on 127.0.0.1:PORT and takes one JSON command a line on
stdin, answering each with one JSON line on stdout:

* ``{"op": "grow", "jobs": N, "finished": F}``: store jobs 0..N-1 of bench/scalejobs.py not stored
  yet (``F`` of them finished), each running one with the three objects the reconciler makes for
  it, through ``FakeApiServer.load`` (no requests); answers the seconds it took;
* ``{"op": "put", "object": {...}}``: store one object as another client would (a watch event);
* ``{"op": "exists", "objects": [[resource, namespace, name], ...]}``: whether each is stored;
* ``{"op": "mark"}``: the position in the request log now;
* ``{"op": "requests", "since": M}``: the requests since ``M``, watches aside, counted by
  ``"verb resource"``;
* ``{"op": "quit"}``.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scalejobs import make_job, owned_objects, product_chain  # noqa: E402

from tests.helpers.apiserver import FakeApiServer  # noqa: E402


class Store:
    def __init__(self, port: int) -> None:
        self.api = FakeApiServer(port=port).start()
        self.chain = product_chain()
        self.jobs = 0

    def grow(self, jobs: int, finished: float) -> dict[str, Any]:
        started = time.monotonic()

        def objects() -> Any:
            for index in range(self.jobs, jobs):
                job = make_job(index, finished)
                # Made from the job before the store takes it (load does not copy).
                side = owned_objects(job, self.chain)
                yield job
                yield from side

        stored = self.api.load(objects())
        self.jobs = max(self.jobs, jobs)
        # Hundreds of thousands of dicts that live as long as the process: out of the collector's
        # reach, or every full collection walks them while a list is being served.
        gc.collect()
        gc.freeze()
        return {"stored": stored, "seconds": time.monotonic() - started}

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op == "grow":
            return self.grow(int(command["jobs"]), float(command.get("finished") or 0.0))
        if op == "put":
            self.api.put_object(command["object"])
            return {}
        if op == "exists":
            return {"exists": [self.api.get_object(r, n, ns) is not None for r, ns, n in command["objects"]]}
        if op == "mark":
            return {"mark": len(self.api.requests)}
        if op == "requests":
            requests = self.api.requests[int(command["since"]):]
            counts = Counter(f"{r.verb} {r.resource}" for r in requests if r.verb != "watch")
            return {"requests": dict(counts)}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    store = Store(int(sys.argv[1]))
    print(orjson.dumps({"port": store.api.port}).decode(), flush=True)
    for line in sys.stdin:
        command = orjson.loads(line)
        if command.get("op") == "quit":
            break
        try:
            answer = store.handle(command)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(orjson.dumps(answer).decode(), flush=True)
    store.api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
