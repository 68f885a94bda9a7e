"""Scale: ``serve`` and ``reconcile`` with up to 100,000 Volcano Jobs cached — ``python bench/scale.py``.

Both processes cache every Volcano Job, and the reconciler every object it owns. This run checks,
on this machine, that they stay inside the manifests' limits (512Mi a container) and keep their
latency and timing with 100,000 Jobs (``--jobs``: the counts, smallest to largest; ``--quick``: a
smoke run of 1,000 and 5,000 with short latency runs). For each count:

1. the API server is grown to that many Jobs (bench/scalejobs.py: 3.4 KB each, plugins env + svc +
   pytorch in the job annotation; ``--finished-fraction`` of them Completed), each running one with
   the three objects the reconciler makes for it (ConfigMap, Service, NetworkPolicy), already in
   order;
2. ``volcano-webhook serve --job-source kube`` is started pinned to core 0: seconds from start to
   ``/readyz`` 200, resident memory once it is steady, at least 31 s later;
   at the smallest and the largest count, ``/mutate`` of a Pod of one cached job (as Volcano's
   controller makes it, owner reference and all) under ``wrk`` pinned to core 1 at -c1 and -c16
   (``--latency-seconds`` each, 60 by default), with nothing else running;
3. ``serve`` stopped, ``volcano-webhook reconcile`` is started (pinned to core 0): seconds to
   ``/readyz``, then its first resync of every job — a cold one, nothing remembered yet — with its
   duration, writes and API requests (its ``/metrics`` and the API server's own record), and its
   resident memory after it; at the largest count, a job created while that resync runs (seconds
   until its three objects exist), and the next periodic resync (``--resync-seconds``, the
   product's 300 by default), which finds every job unchanged.

The slope of resident memory from the smallest to the largest count is the cost of one more cached
Job. The API server is a real kube-apiserver and etcd where ``KUBEBUILDER_ASSETS`` names them
(tests/helpers/envtest.py; the product then runs as the manifests' ServiceAccount), else the API-server double
(tests/helpers/apiserver.py) in a process of its own on core 1 (bench/scale_double.py); the table says which.
Figures go to ``bench/results/scale.json`` and ``scale.md`` (``scale-quick.*`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from processes import cpu_seconds, pinned  # noqa: E402
from run import run_wrk  # noqa: E402
from scalejobs import NAMESPACES, PLUGINS, make_job, name_of, namespace_of, owned_objects, product_chain  # noqa: E402

from tests.helpers.envtest import (  # noqa: E402
    WEBHOOK_USER,
    EnvTest,
    Process,
    _die_with_parent,
    find_assets,
    free_port,
    https_get,
    product_env,
    wait_until,
)
from volcano_job_webhook.certs import ensure_certs  # noqa: E402
from volcano_job_webhook.kube.rest import Rest, widen_pool  # noqa: E402
from volcano_job_webhook.plugins import Job  # noqa: E402
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB as JOB  # noqa: E402
from volcano_job_webhook.plugins.kinds import Kind  # noqa: E402
from volcano_job_webhook.plugins.podgen import make_pod  # noqa: E402
from volcano_job_webhook.reconciler.owned import FIELD_MANAGER, OWNED  # noqa: E402
from volcano_job_webhook.server.admission import admission_review  # noqa: E402

Obj = dict[str, Any]
RESULTS = ROOT / "bench" / "results"
TWO_CORES = (os.cpu_count() or 1) >= 2
SERVE_CORE = RECONCILE_CORE = "0" if TWO_CORES else None
CLIENT_CORE = API_CORE = "1" if TWO_CORES else None
PLURALS = {r.kind: r.plural for r in OWNED.values()}
NAMESPACE = Kind("", "v1", "Namespace", "namespaces", "Namespace")
# KB = 1,000 bytes, MB = 1,000,000 bytes (the stricter reading of the targets).
TARGETS = {
    "serve_bytes_per_job": 2_500,
    "reconcile_bytes_per_job": 4_000,
    "serve_rss_mb": 300,
    "reconcile_rss_mb": 450,
    "p999_ratio": 1.5,
    "p99_ms_c1": 2.0,
    "serve_ready_s": 15.0,
    "latecomer_s": 2.0,
}
SETTLE_SECONDS = 31  # resident memory read no sooner after Ready (as the figures in benchmarks.md were)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# Memory of a process ----------------------------------------------------------------------------

def status_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def core_busy(core: str | None) -> float:
    """CPU seconds a core (all of them without one) has spent busy since boot."""
    name = f"cpu{core}" if core is not None else "cpu"
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == name:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
            return (user + nice + system + irq + softirq + steal) / CLOCK_TICK
    return float("nan")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def loaded(url: str, review: Path, connections: int, seconds: int, serve_pid: int, others: list[int]) -> Obj:
    """A wrk run, with the share of each core that went to processes other than serve (core 0), wrk
    and the API server (core 1): what the machine's other users took from the measured ones."""
    before = (core_busy(SERVE_CORE), core_busy(CLIENT_CORE), cpu_seconds(serve_pid), children_cpu(),
              sum(cpu_seconds(pid) for pid in others), time.monotonic())
    row = run_wrk(url, review, connections, seconds, CLIENT_CORE, serve_pid)
    elapsed = time.monotonic() - before[5]
    row["serve_cpu"] = (cpu_seconds(serve_pid) - before[2]) / elapsed
    if TWO_CORES:
        row["others_core0"] = max(0.0, core_busy(SERVE_CORE) - before[0] - (cpu_seconds(serve_pid) - before[2])) / elapsed
        row["others_core1"] = max(0.0, core_busy(CLIENT_CORE) - before[1] - (children_cpu() - before[3])
                                  - (sum(cpu_seconds(pid) for pid in others) - before[4])) / elapsed
    row["load_average"] = os.getloadavg()[0]
    return row


def settled_rss(pid: int, at_least: float = 0.0, timeout: float = 60.0) -> float:
    """Resident memory once it has moved by under 1 MB for 5 s (and ``at_least`` seconds have passed)."""
    started = time.monotonic()
    samples: list[tuple[float, float]] = []
    while True:
        now = time.monotonic()
        samples.append((now, status_mb(pid)))
        recent = [mb for t, mb in samples if t >= now - 5]
        if now - started >= max(at_least, 5) and max(recent) - min(recent) < 1.0:
            return samples[-1][1]
        if now - started > max(timeout, at_least + 5):
            return samples[-1][1]
        time.sleep(0.5)


# The API servers ----------------------------------------------------------------------------------

class Backend(Protocol):
    name: str
    kubeconfig: Path
    pids: list[int]  # the API server's processes, for the CPU they take during a measurement

    def grow(self, jobs: int, finished: float) -> float: ...
    def job(self, index: int, finished: float) -> Obj: ...
    def create(self, job: Obj) -> None: ...
    def exists(self, refs: list[tuple[str, str, str]]) -> list[bool]: ...
    def mark(self) -> Any: ...
    def requests(self, since: Any) -> dict[str, int]: ...
    def close(self) -> None: ...


class Double:
    """bench/scale_double.py on ``API_CORE``, driven over its stdin and stdout."""

    def __init__(self, workdir: Path) -> None:
        self.name = "API-server double (tests/helpers/apiserver.py) in its own process" + (f" on core {API_CORE}" if API_CORE else "")
        port = free_port()
        self.stderr = (workdir / "double.log").open("wb")
        self.popen = subprocess.Popen(
            pinned([sys.executable, str(ROOT / "bench" / "scale_double.py"), str(port)], API_CORE),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=product_env(), preexec_fn=_die_with_parent,
        )
        assert self.popen.stdout is not None
        json.loads(self.popen.stdout.readline())  # serving
        self.pids = [self.popen.pid]
        self.kubeconfig = workdir / "kubeconfig.yaml"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "double", "user": {}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double"}}],
        }))

    def call(self, op: str, **args: Any) -> Obj:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the double exited ({self.popen.wait()})")
        answer: Obj = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the double: {answer['error']}")
        return answer

    def grow(self, jobs: int, finished: float) -> float:
        return float(self.call("grow", jobs=jobs, finished=finished)["seconds"])

    def job(self, index: int, finished: float) -> Obj:
        return make_job(index, finished)  # as the double stored it: the uid is a function of the name

    def create(self, job: Obj) -> None:
        self.call("put", object=job)

    def exists(self, refs: list[tuple[str, str, str]]) -> list[bool]:
        return list(self.call("exists", objects=refs)["exists"])

    def mark(self) -> Any:
        return self.call("mark")["mark"]

    def requests(self, since: Any) -> dict[str, int]:
        return dict(self.call("requests", since=since)["requests"])

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self.call("quit")
            except (RuntimeError, OSError):
                pass
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        self.stderr.close()


class RealApiServer:
    """kube-apiserver and etcd from ``KUBEBUILDER_ASSETS`` (tests/helpers/envtest.py); the product runs as the
    manifests' ServiceAccount; requests are read from the audit log. Jobs are created through the API
    (8 clients), their status through the status subresource, and their objects as the reconciler
    creates them (a POST under its field manager), from the stored Job (its uid is the server's)."""

    def __init__(self, assets: Path, workdir: Path) -> None:
        self.server = EnvTest(assets, workdir / "envtest").start()
        self.name = "kube-apiserver + etcd (envtest)"
        try:
            self.server.install_prerequisites()
            self.admin = Rest(self.server.api_client())
            widen_pool(self.admin.api, 16)
            self.kubeconfig = self.server.kubeconfig(WEBHOOK_USER)
            self.pids = [p.popen.pid for p in (self.server._apiserver, self.server._etcd) if p is not None]
            self.chain = product_chain()
            self.jobs = 0
            for namespace in sorted({namespace_of(i) for i in range(NAMESPACES)}):
                self.admin.create(NAMESPACE, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        except BaseException:
            self.server.stop()
            raise

    def _make(self, job: Obj, objects: bool = True) -> None:
        meta = job["metadata"]
        status = job.pop("status", None)
        for field in ("uid", "creationTimestamp", "generation"):
            meta.pop(field, None)
        stored = self.admin.create(JOB, meta["namespace"], job)
        if status is not None:
            stored = self.admin.call("PATCH", JOB.path(meta["namespace"], meta["name"]) + "/status", body={"status": status},
                                     content_type="application/merge-patch+json")
        for obj in owned_objects(stored, self.chain) if objects else []:
            self.admin.create(OWNED[obj["kind"]], meta["namespace"], obj, FIELD_MANAGER)

    def grow(self, jobs: int, finished: float) -> float:
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            for _ in pool.map(lambda i: self._make(make_job(i, finished)), range(self.jobs, jobs)):
                pass
        self.jobs = max(self.jobs, jobs)
        return time.monotonic() - started

    def job(self, index: int, finished: float) -> Obj:
        found = self.admin.get(JOB, namespace_of(index), name_of(index))
        assert found is not None, f"job {index} is not stored"
        return found

    def create(self, job: Obj) -> None:
        self._make(job, objects=False)  # the reconciler's to make

    def _resource(self, plural: str) -> Any:
        return next(r for r in [JOB, *OWNED.values()] if r.plural == plural)

    def exists(self, refs: list[tuple[str, str, str]]) -> list[bool]:
        return [self.admin.get(self._resource(r), ns, n) is not None for r, ns, n in refs]

    def mark(self) -> Any:
        return datetime.now(UTC)

    def requests(self, since: Any) -> dict[str, int]:
        time.sleep(1.0)  # the audit log is written as requests complete
        events = self.server.audit_events(WEBHOOK_USER, since)
        return dict(Counter(f"{e.verb} {e.resource}" for e in events if e.verb != "watch"))

    def close(self) -> None:
        self.server.stop()


# The product --------------------------------------------------------------------------------------

def start(command: str, args: list[str], core: str | None, log_path: Path) -> Process:
    argv = pinned([sys.executable, "-m", "volcano_job_webhook", command, *args], core)
    return Process.start(command, argv, log_path, env=product_env())


def stop(process: Process) -> float:
    sent = time.monotonic()
    process.popen.send_signal(signal.SIGTERM)
    try:
        process.popen.wait(30)
    except subprocess.TimeoutExpired:
        process.popen.kill()
        process.popen.wait()
    return time.monotonic() - sent


def wait(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    try:
        return wait_until(predicate, timeout, what, interval)
    except AssertionError as timed_out:
        raise SystemExit(str(timed_out)) from None


def review_of(job: Obj) -> Obj:
    """The AdmissionReview of worker 1's Pod as Volcano's controller makes it (owner reference
    with the job's uid): what the API server sends ``/mutate`` for it."""
    return admission_review(make_pod(Job.from_object(job), "worker", 1), uid="scale-review")


def mutate_once(port: int, ca: Path, body: bytes) -> Obj:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://127.0.0.1:{port}/mutate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        answer: Obj = json.loads(reply.read())["response"]
    return answer


def measure_serve(backend: Backend, workdir: Path, jobs: int, review: Path | None, seconds: int) -> Obj:
    certs = workdir / "certs"
    ca = ensure_certs(certs).ca_cert  # before the server starts, so the client has the CA to trust
    port = free_port()
    mark = backend.mark()
    started = time.monotonic()
    process = start("serve", ["--job-source=kube", f"--kubeconfig={backend.kubeconfig}", f"--certs-dir={certs}",
                              "--host=127.0.0.1", f"--port={port}"], SERVE_CORE, workdir / f"serve-{jobs}.log")
    pid = process.popen.pid

    def ready() -> Obj | None:
        if not process.alive:
            raise SystemExit(f"serve exited:\n{process.log(tail=20)}")
        answer = https_get(f"https://127.0.0.1:{port}/readyz", ca)
        return json.loads(answer[1]) if answer is not None and answer[0] == 200 else None

    # Polled every 0.1 s: each poll is a TLS handshake, which serve pays for while it lists.
    body = wait(ready, 900, "serve's /readyz", interval=0.1)
    out: Obj = {"ready_s": time.monotonic() - started, "cached": body.get("jobs"), "rss_ready_mb": status_mb(pid)}
    log(f"serve ready in {out['ready_s']:.2f} s with {out['cached']} jobs cached")
    out["rss_mb"] = settled_rss(pid, at_least=SETTLE_SECONDS)
    out["hwm_mb"] = status_mb(pid, "VmHWM")
    out["startup_requests"] = backend.requests(mark)
    if review is not None:
        answer = mutate_once(port, ca, review.read_bytes())
        if not (answer.get("allowed") and answer.get("patch")) or answer.get("warnings"):
            raise SystemExit(f"/mutate did not wire the Pod from the cache: {answer}")
        url = f"https://127.0.0.1:{port}/mutate"
        run_wrk(url, review, 1, 5, CLIENT_CORE, pid)  # warm-up: connections, the prepared job
        mark = backend.mark()
        out["latency"] = {f"c{c}": loaded(url, review, c, seconds, pid, backend.pids) for c in (1, 16)}
        out["latency_requests"] = backend.requests(mark)
        out["rss_after_load_mb"] = status_mb(pid)
        log(f"serve latency at {jobs}: {out['latency']}")
    out["hwm_mb"] = status_mb(pid, "VmHWM")
    out["stop_s"] = stop(process)
    log(f"serve at {jobs}: RSS {out['rss_mb']:.1f} MB (HWM {out['hwm_mb']:.1f})")
    return out


class Reconciler:
    def __init__(self, backend: Backend, workdir: Path, jobs: int, resync_seconds: float, workers: int) -> None:
        self.port = free_port()
        self.log_path = workdir / f"reconcile-{jobs}.log"
        self.started = time.monotonic()
        self.process = start("reconcile", [f"--kubeconfig={backend.kubeconfig}", f"--health-port={self.port}",
                                           f"--resync-seconds={resync_seconds}", f"--workers={workers}"],
                             RECONCILE_CORE, self.log_path)

    def get(self, path: str) -> bytes | None:
        if not self.process.alive:
            raise SystemExit(f"reconcile exited:\n{self.process.log(tail=20)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return bytes(response.read())
        except urllib.error.HTTPError:
            return None
        except OSError:
            return None

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics`` summed by name (labels aside)."""
        out: dict[str, float] = {}
        for line in (self.get("/metrics") or b"").decode().splitlines():
            if line and not line.startswith("#"):
                head, _, value = line.rpartition(" ")
                name = head.split("{")[0]
                out[name] = out.get(name, 0.0) + float(value)
        return out

    def labelled(self, name: str) -> dict[str, float]:
        """The samples of one metric, by their labels."""
        out: dict[str, float] = {}
        for line in (self.get("/metrics") or b"").decode().splitlines():
            if line.startswith(name + "{"):
                head, _, value = line.rpartition(" ")
                out[head[len(name):]] = float(value)
        return out

    def resyncs(self) -> list[tuple[float, int]]:
        """Each "resync: N jobs.batch.volcano.sh keys queued" line so far (the Volcano Jobs' controller):
        when it was logged (epoch seconds) and N."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if '"resync: ' not in line or " jobs.batch.volcano.sh " not in line:
                continue
            entry = json.loads(line)
            when = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
            match = re.match(r"resync: (\d+) jobs", entry["msg"])
            out.append((when, int(match.group(1)) if match else 0))
        return out

    @property
    def pid(self) -> int:
        return self.process.popen.pid


def finish(reconciler: Reconciler, before: dict[str, float], queued: int, timeout: float) -> dict[str, float]:
    """Wait until ``queued`` more reconciles than ``before`` are done and the queue is empty."""
    def done() -> dict[str, float] | None:
        now = reconciler.metrics()
        finished = now.get("volcano_reconciler_reconciles_total", 0) - before.get("volcano_reconciler_reconciles_total", 0)
        return now if finished >= queued and now.get("volcano_reconciler_queue_depth", 1) == 0 else None
    result: dict[str, float] = wait(done, timeout, "the resync to finish", interval=0.05)
    return result


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def late_job(reconciler: Reconciler, backend: Backend, job: Obj) -> Obj:
    """Create ``job`` now; seconds until its three objects exist, and how far the reconciler was."""
    meta = job["metadata"]
    refs = [(PLURALS[o["kind"]], meta["namespace"], o["metadata"]["name"]) for o in owned_objects(job, product_chain())]
    now = reconciler.metrics()
    created = time.monotonic()
    backend.create(json.loads(json.dumps(job)))
    wait(lambda: all(backend.exists(refs)), 120, "the new job's objects", interval=0.01)
    seconds = time.monotonic() - created
    log(f"new job {meta['name']}'s objects in {seconds:.2f} s")
    return {"latecomer_s": seconds, "latecomer_after_reconciles": now.get("volcano_reconciler_reconciles_total", 0),
            "latecomer_queue_depth": now.get("volcano_reconciler_queue_depth", 0)}


def measure_reconcile(backend: Backend, workdir: Path, jobs: int, *, resync_seconds: float, workers: int,
                      latecomer: Obj | None, steady: bool) -> Obj:
    mark = backend.mark()
    reconciler = Reconciler(backend, workdir, jobs, resync_seconds, workers)
    wait(lambda: reconciler.get("/readyz") is not None, 900, "the reconciler's /readyz", interval=0.02)
    out: Obj = {"ready_s": time.monotonic() - reconciler.started, "rss_ready_mb": status_mb(reconciler.pid)}
    log(f"reconcile ready in {out['ready_s']:.2f} s")
    first = wait(lambda: reconciler.resyncs(), 60, "the first resync")[0]
    out["startup_requests"] = backend.requests(mark)
    mark = backend.mark()
    before: dict[str, float] = {}  # the process's first resync: everything it did so far is in it
    queued = first[1]
    if latecomer is not None:
        # Well into the resync, so that the new job's key finds a long queue ahead of it.
        wait(lambda: reconciler.metrics().get("volcano_reconciler_reconciles_total", 0) >= min(queued, max(1, queued // 10)),
             600, "a tenth of the resync", interval=0.01)
        out.update(late_job(reconciler, backend, latecomer))
        queued += 1
    after = finish(reconciler, before, queued, 3600)
    out["resync_s"] = time.time() - first[0]
    out["resync_queued"] = first[1]
    out["resync_writes"] = delta(after, before, "volcano_reconciler_writes_total")
    out["resync_writes_by_kind"] = reconciler.labelled("volcano_reconciler_writes_total")
    out["resync_api_requests"] = delta(after, before, "volcano_reconciler_api_requests_total")
    out["reconciles_by_result"] = reconciler.labelled("volcano_reconciler_reconciles_total")
    out["resync_requests"] = backend.requests(mark)
    log(f"cold resync of {first[1]} jobs in {out['resync_s']:.1f} s, {out['resync_writes']:.0f} writes")
    out["rss_mb"] = settled_rss(reconciler.pid)
    out["hwm_mb"] = status_mb(reconciler.pid, "VmHWM")
    log(f"reconcile at {jobs}: RSS {out['rss_mb']:.1f} MB (HWM {out['hwm_mb']:.1f})")
    if steady:
        before = reconciler.metrics()
        mark = backend.mark()
        second = wait(lambda: len(r := reconciler.resyncs()) > 1 and r[1], resync_seconds + 600, "the periodic resync", interval=0.01)
        out["steady"] = {"queued": second[1]}
        queued = second[1]
        if latecomer is not None:
            # At once: a periodic resync finds every job unchanged and is over in a second or so.
            second_job = make_job(0, 0.0, name=f"{latecomer['metadata']['name']}-2")
            out["steady"].update(late_job(reconciler, backend, second_job))
            queued += 1
        after = finish(reconciler, before, queued, 3600)
        out["steady"].update({
            "seconds": time.time() - second[0],
            "writes": delta(after, before, "volcano_reconciler_writes_total") - (3 if latecomer is not None else 0),
            "api_requests": delta(after, before, "volcano_reconciler_api_requests_total"),
            "requests": backend.requests(mark),
        })
        out["rss_steady_mb"] = status_mb(reconciler.pid)
        out["hwm_mb"] = status_mb(reconciler.pid, "VmHWM")
        log(f"steady resync: {out['steady']}")
    out["stop_s"] = stop(reconciler.process)
    return out


# The run ------------------------------------------------------------------------------------------

def running_index(jobs: int, finished: float) -> int:
    """A job of the set that runs (finished jobs make no Pods), from its middle."""
    index = jobs // 2
    while make_job(index, finished)["status"]["state"]["phase"] != "Running":
        index += 1
    return index


def measure(backend: Backend, workdir: Path, args: argparse.Namespace) -> list[Obj]:
    steps: list[Obj] = []
    counts = sorted(args.jobs)
    latency_at = {counts[0], counts[-1]}
    for jobs in counts:
        log(f"growing the API server to {jobs:,} jobs")
        step: Obj = {"jobs": jobs, "load_s": backend.grow(jobs, args.finished_fraction)}
        review = None
        if jobs in latency_at:
            job = backend.job(running_index(jobs, args.finished_fraction), args.finished_fraction)
            review = workdir / f"review-{jobs}.json"
            review.write_text(json.dumps(review_of(job)))
        step["serve"] = measure_serve(backend, workdir, jobs, review, args.latency_seconds)
        last = jobs == counts[-1]
        latecomer = make_job(jobs, 0.0, name="latecomer") if last else None
        step["reconcile"] = measure_reconcile(backend, workdir, jobs, resync_seconds=args.resync_seconds,
                                              workers=args.workers, latecomer=latecomer, steady=last)
        steps.append(step)
    return steps


def mark_of(ok: bool) -> str:
    return "met" if ok else "**missed**"


def report(steps: list[Obj], backend: str, args: argparse.Namespace, load: tuple[float, float]) -> tuple[str, Obj]:
    first, last = steps[0], steps[-1]
    span = last["jobs"] - first["jobs"]

    def slope(process: str) -> float:
        return (last[process]["rss_mb"] - first[process]["rss_mb"]) * 1e6 / span if span else float("nan")

    lat_small, lat_big = first["serve"]["latency"], last["serve"]["latency"]
    ratios = {c: lat_big[c]["p999_ms"] / lat_small[c]["p999_ms"] for c in ("c1", "c16")}
    rec = last["reconcile"]
    steady = rec["steady"]
    cold_writes = rec["resync_writes"] - 3  # the new job's three objects were made during it
    period = args.resync_seconds
    n = f"{last['jobs']:,}"
    checks = [
        ("serve: resident memory per cached Job (slope)", f"{slope('serve'):,.0f} B", "≤ 2,500 B",
         slope("serve") <= TARGETS["serve_bytes_per_job"]),
        ("reconcile: resident memory per cached Job, a running one with its 3 objects (slope)", f"{slope('reconcile'):,.0f} B", "≤ 4,000 B",
         slope("reconcile") <= TARGETS["reconcile_bytes_per_job"]),
        (f"serve: resident memory at {n} Jobs (peak)", f"{last['serve']['rss_mb']:.0f} MB ({last['serve']['hwm_mb']:.0f} MB)",
         "≤ 300 MB", max(last["serve"]["rss_mb"], last["serve"]["hwm_mb"]) <= TARGETS["serve_rss_mb"]),
        (f"reconcile: resident memory at {n} Jobs (peak)", f"{rec['rss_mb']:.0f} MB ({rec['hwm_mb']:.0f} MB)",
         "≤ 450 MB", max(rec["rss_mb"], rec["hwm_mb"]) <= TARGETS["reconcile_rss_mb"]),
        (f"/mutate p99.9 at -c1, {n} vs {first['jobs']:,} Jobs", f"{lat_big['c1']['p999_ms']:.2f} / {lat_small['c1']['p999_ms']:.2f} ms = {ratios['c1']:.2f}×",
         "≤ 1.5×", ratios["c1"] <= TARGETS["p999_ratio"]),
        (f"/mutate p99.9 at -c16, {n} vs {first['jobs']:,} Jobs", f"{lat_big['c16']['p999_ms']:.2f} / {lat_small['c16']['p999_ms']:.2f} ms = {ratios['c16']:.2f}×",
         "≤ 1.5×", ratios["c16"] <= TARGETS["p999_ratio"]),
        (f"/mutate p99 at -c1, {n} Jobs", f"{lat_big['c1']['p99_ms']:.2f} ms", "< 2 ms", lat_big["c1"]["p99_ms"] < TARGETS["p99_ms_c1"]),
        (f"serve: start to Ready, {n} Jobs", f"{last['serve']['ready_s']:.1f} s", "≤ 15 s", last["serve"]["ready_s"] <= TARGETS["serve_ready_s"]),
        (f"reconcile: first (cold) resync of {n} Jobs", f"{rec['resync_s']:.1f} s, {cold_writes:.0f} writes", f"0 writes, ≤ {period:.0f} s",
         cold_writes == 0 and rec["resync_s"] <= period),
        (f"reconcile: periodic resync of {n} Jobs", f"{steady['seconds']:.1f} s, {steady['writes']:.0f} writes, {steady['api_requests'] - 3:.0f} other API requests",
         f"0 writes, ≤ {period:.0f} s", steady["writes"] == 0 and steady["seconds"] <= period),
        (f"reconcile: a new job's 3 objects during the cold resync of {n}",
         f"{rec['latecomer_s']:.2f} s ({rec['latecomer_queue_depth']:,.0f} keys waiting)", "≤ 2 s", rec["latecomer_s"] <= TARGETS["latecomer_s"]),
        (f"reconcile: a new job's 3 objects during the periodic resync of {n}",
         f"{steady['latecomer_s']:.2f} s ({steady['latecomer_queue_depth']:,.0f} keys waiting)", "≤ 2 s",
         steady["latecomer_s"] <= TARGETS["latecomer_s"]),
    ]
    lines = [
        f"API server: {backend}. Jobs: 3.4 KB each, master ×1 + worker ×2, plugins env + svc + pytorch in the "
        f"annotation, {args.finished_fraction:.0%} finished; each running job owns 3 objects. serve on core "
        f"{SERVE_CORE}, wrk on core {CLIENT_CORE}, reconcile on core {RECONCILE_CORE} (serve stopped by then). "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average "
        f"{load[0]:.2f} at start, {load[1]:.2f} at end. KB = 1,000 B, MB = 1,000,000 B.",
        "",
        "| measure | result | target | |",
        "|---|---|---|---|",
        *(f"| {name} | {result} | {target} | {mark_of(ok)} |" for name, result, target, ok in checks),
        "",
        "| Jobs | load into API server | serve Ready | serve RSS (peak) | reconcile Ready | cold resync (writes) | reconcile RSS (peak) |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        s, r = step["serve"], step["reconcile"]
        lines.append(f"| {step['jobs']:,} | {step['load_s']:.1f} s | {s['ready_s']:.2f} s | {s['rss_mb']:.1f} MB ({s['hwm_mb']:.1f}) | "
                     f"{r['ready_s']:.2f} s | {r['resync_s']:.1f} s ({r['resync_writes']:.0f}) | {r['rss_mb']:.1f} MB ({r['hwm_mb']:.1f}) |")
    lines += ["", "| /mutate | Jobs cached | requests | req/s | p50 ms | p99 ms | p99.9 ms | errors | serve's CPU | others' CPU on core 0 / 1 | load avg |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for step in (first, last):
        for conc, row in step["serve"]["latency"].items():
            others = f"{row['others_core0']:.0%} / {row['others_core1']:.0%}" if "others_core0" in row else "n/a"
            lines.append(f"| -{conc} | {step['jobs']:,} | {row['requests']:,} | {row['rps']:,.0f} | {row['p50_ms']:.2f} | "
                         f"{row['p99_ms']:.2f} | {row['p999_ms']:.2f} | {row['errors']} | {row['serve_cpu']:.0%} | {others} | "
                         f"{row['load_average']:.2f} |")
    lines += ["", f"Requests to the API server during the cold resync of {n} (watches aside): {rec['resync_requests']}; "
              f"during the periodic one: {steady['requests']} (each with a new job's 3 creates); while /mutate was loaded: "
              f"{last['serve']['latency_requests']}. serve's startup: {last['serve']['startup_requests']}; reconcile's: "
              f"{rec['startup_requests']}."]
    data = {"backend": backend, "finished_fraction": args.finished_fraction, "plugins": PLUGINS, "load_average": load,
            "latency_seconds": args.latency_seconds, "resync_seconds": period, "steps": steps,
            "slope_bytes_per_job": {"serve": slope("serve"), "reconcile": slope("reconcile")},
            "targets": {name: ok for name, _, _, ok in checks}}
    return "\n".join(lines), data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1_000, 10_000, 30_000, 100_000], help="job counts, at least two")
    parser.add_argument("--finished-fraction", type=float, default=0.0, help="share of jobs Completed (0: every job runs, the worst case)")
    parser.add_argument("--latency-seconds", type=int, default=60, help="each wrk run (at -c1 and -c16)")
    parser.add_argument("--resync-seconds", type=float, default=300.0, help="the reconciler's period (the product's default)")
    parser.add_argument("--workers", type=int, default=4, help="the reconciler's workers (the product's default)")
    parser.add_argument("--quick", action="store_true", help="1,000 and 5,000 jobs, 5 s latency runs, a 20 s period")
    parser.add_argument("--output", help="name of the results files under bench/results (default scale, scale-quick)")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.latency_seconds, args.resync_seconds = [1_000, 5_000], 5, 20.0
    if len(set(args.jobs)) < 2:
        parser.error("--jobs needs at least two counts: the slope is between the smallest and the largest")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tmp)
        assets = find_assets()
        backend: Backend = RealApiServer(assets, workdir) if assets is not None else Double(workdir)
        try:
            steps = measure(backend, workdir, args)
        finally:
            backend.close()
    text, data = report(steps, backend.name, args, (load_before, os.getloadavg()[0]))
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = args.output or ("scale-quick" if args.quick else "scale")
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2))
    (RESULTS / f"{name}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
