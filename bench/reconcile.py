"""The reconciler's benchmark against a real kube-apiserver + etcd: ``python bench/reconcile.py``.

Needs ``KUBEBUILDER_ASSETS`` (a directory with ``kube-apiserver`` and ``etcd``, as for the tests);
starts them the way tests/helpers/envtest.py does (audit log on), installs the Job CRD and the manifests'
RBAC, and runs ``volcano-webhook reconcile`` as a subprocess under exactly that RBAC. In one run it
measures, and prints as a table with each target marked:

1. convergence for 500 and then 5,000 more jobs (svc + ssh + pytorch; 1 master + 3 workers: a
   ConfigMap, a Service, a NetworkPolicy and a Secret each), created before a fresh reconciler
   starts: objects per second from its caches' sync to the last object, as a ratio to the raw
   create rate (8 client threads creating 2,000 ConfigMaps as the same user) measured just before
   and just after, the mean of the two. The last object is the reconciler's own count of objects
   created (each counted on the API server's 201), checked by a LIST afterwards: a watch of the
   bench's own would take CPU from the two cores the run is measured on, which the raw
   measurement does not pay;
2. one steady-state resync of every job (5,500): API requests and writes, from the audit log;
3. drift repair: a deleted Service, a deleted ConfigMap, a hand-edited ConfigMap, until restored;
4. a new job's objects while a full resync of every job is under way;
5. the reconciler's resident memory with all that cached, and its SIGTERM-to-exit time;
6. convergence again for jobs whose SSH keys are given (``--ssh-private-key``): the ssh plugin
   generates an RSA-2048 key pair per job otherwise (as Volcano does), and that is the bound of (1);
   the key rate of one core is printed too.

The machine is shared: the load average at start and end is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from processes import cpu_seconds  # noqa: E402

from tests.helpers.envtest import WEBHOOK_USER, EnvTest, Process, find_assets, free_port, new_namespace, start_product, wait_until  # noqa: E402
from volcano_job_webhook.kube.informer import Informer  # noqa: E402
from volcano_job_webhook.kube.rest import Rest, widen_pool  # noqa: E402
from volcano_job_webhook.plugins.builtin.ssh import generate_key_pair  # noqa: E402
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB  # noqa: E402
from volcano_job_webhook.reconciler.owned import MANAGED_SELECTOR, OWNED  # noqa: E402
from volcano_job_webhook.reconciler.transforms import OwnedRecord  # noqa: E402

JOBS = VOLCANO_JOB
OBJECTS_PER_JOB = 4
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def bench_job(namespace: str, name: str, keys: tuple[str, str] | None = None) -> dict[str, Any]:
    """svc + ssh + pytorch, 1 master + 3 workers; ``keys`` (private, public) given to ssh, else it
    generates a pair for the job."""
    ssh = [f"--ssh-private-key={keys[0]}", f"--ssh-public-key={keys[1]}"] if keys else []

    def task(task_name: str, replicas: int) -> dict[str, Any]:
        return {"name": task_name, "replicas": replicas, "template": {"spec": {
            "containers": [{"name": task_name, "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"}]}}}
    # Named in our annotation, as beside Volcano's own controller (which runs spec.plugins itself).
    plugins = {"svc": [], "ssh": ssh, "pytorch": ["--master=master", "--worker=worker", "--port=23456"]}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "annotations": {"volcano-job-webhook/plugins": json.dumps(plugins)}},
            "spec": {"minAvailable": 4, "schedulerName": "volcano", "queue": "default",
                     "tasks": [task("master", 1), task("worker", 3)]}}


def in_parallel(fn: Any, items: list[Any], threads: int = 8) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(fn, items):
            pass
    return time.monotonic() - started


def raw_create_rate(server: EnvTest, count: int = 2000) -> float:
    api = server.api_client(WEBHOOK_USER)
    widen_pool(api, 16)
    rest = Rest(api)
    namespace = new_namespace(server.api_client(), "raw-")
    data = {"VC_WORKER_HOSTS": ",".join(f"bench-00000-worker-{i}.bench-00000" for i in range(3)), "VC_WORKER_NUM": "3"}

    def make(i: int) -> None:
        rest.create(OWNED["ConfigMap"], namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": f"raw-{i}", "namespace": namespace}, "data": data})

    in_parallel(make, list(range(100)))  # warm up: connections, the API server's caches
    return count / in_parallel(make, list(range(100, 100 + count)))


def create_jobs(server: EnvTest, namespace: str, count: int, keys: tuple[str, str] | None) -> None:
    rest = Rest(server.api_client())
    widen_pool(rest.api, 16)
    in_parallel(lambda i: rest.create(JOBS, namespace, bench_job(namespace, f"bench-{i:05d}", keys)), list(range(count)))


class Objects:
    """The bench's own view of one namespace's side objects, by watch."""

    def __init__(self, server: EnvTest, namespace: str) -> None:
        api = server.api_client()
        widen_pool(api, 12)
        self.informers = [Informer(api, resource, [namespace], transform=OwnedRecord, label_selector=MANAGED_SELECTOR)
                          for resource in OWNED.values()]
        for informer in self.informers:
            informer.start()
        wait(lambda: all(informer.synced for informer in self.informers), 120, "the bench's caches to sync")

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        informer = next(i for i in self.informers if i.resource.kind == kind)
        record = informer.get(namespace, name)
        return record.object() if record is not None else None

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()


def wait(predicate: Any, timeout: float, what: str, interval: float = 0.01) -> Any:
    """``wait_until``, ending the run with its message rather than a traceback."""
    try:
        return wait_until(predicate, timeout, what, interval)
    except AssertionError as timed_out:
        raise SystemExit(str(timed_out)) from None


class Reconciler:
    """``volcano-webhook reconcile`` as the manifests' ServiceAccount, all namespaces."""

    def __init__(self, server: EnvTest, workdir: Path, workers: int, resync: float, namespaces: list[str],
                 extra: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.log_path = workdir / f"reconcile-{self.port}.log"
        self.started = time.monotonic()
        self.process: Process = start_product([
            "reconcile", f"--kubeconfig={server.kubeconfig(WEBHOOK_USER)}", f"--health-port={self.port}",
            f"--workers={workers}", f"--resync-seconds={resync}", *(f"--namespace={ns}" for ns in namespaces), *extra,
        ], self.log_path)

    def get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as response:
                return bytes(response.read())
        except OSError:
            return None

    def metric(self, name: str, **labels: str) -> float:
        text = (self.get("/metrics") or b"").decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                head, _, value = line.rpartition(" ")
                if not want or all(f'{k}="{v}"' in head for k, v in labels.items()):
                    total += float(value)
        return total

    def ready(self) -> bool:
        body = self.get("/readyz")
        return body is not None and json.loads(body).get("status") == "ready"

    def resyncs(self) -> int:
        return sum(1 for line in self.log_path.read_text().splitlines() if '"resync: ' in line and " jobs.batch.volcano.sh " in line)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.process.popen.pid)

    def sigterm(self) -> float:
        sent = time.monotonic()
        self.process.popen.send_signal(signal.SIGTERM)
        self.process.popen.wait(60)
        return time.monotonic() - sent


def managed_objects(server: EnvTest, namespace: str) -> int:
    admin = Rest(server.api_client())
    return sum(len(admin.call("GET", resource.path(namespace), query=[("labelSelector", MANAGED_SELECTOR)])["items"])
               for resource in OWNED.values())


def converge(server: EnvTest, workdir: Path, count: int, workers: int, resync: float,
             keys: tuple[str, str] | None = None, namespaces: list[str] | None = None) -> tuple[Reconciler, str, dict[str, float]]:
    """``count`` jobs made in a new namespace, then a new reconciler (all namespaces, or
    ``namespaces`` and the new one): objects per second from its caches' sync to the last object
    it created, and as a ratio to the raw create rate measured just before and after."""
    namespace = new_namespace(server.api_client(), f"bench-{count}-")
    create_jobs(server, namespace, count, keys)
    before = raw_create_rate(server)
    reconciler = Reconciler(server, workdir, workers, resync, [*namespaces, namespace] if namespaces is not None else [])
    wait(reconciler.ready, 120, "the reconciler's caches to sync", interval=0.05)
    ready, cpu = time.monotonic(), reconciler.cpu_seconds()
    made = count * OBJECTS_PER_JOB
    wait(lambda: reconciler.metric("volcano_reconciler_writes_total", action="create") >= made, 3600,
         f"{made} objects created", interval=0.05)
    done = time.monotonic()
    cpu_ms = 1000 * (reconciler.cpu_seconds() - cpu) / made
    quiet(reconciler)  # a resync under way would take from the raw rate
    after = raw_create_rate(server)
    if (found := managed_objects(server, namespace)) != made:
        raise SystemExit(f"{namespace}: {found} objects, {made} wanted")
    rate, raw = made / (done - ready), (before + after) / 2
    return reconciler, namespace, {"seconds": done - ready, "rate": rate, "raw": raw, "raw_before": before,
                                   "raw_after": after, "ratio": rate / raw, "cpu_ms": cpu_ms}


def quiet(reconciler: Reconciler, seconds: float = 2.0) -> None:
    """Until the reconciler has had nothing to do for ``seconds``."""
    last, since = reconciler.metric("volcano_reconciler_reconciles_total"), time.monotonic()
    while time.monotonic() - since < seconds:
        time.sleep(0.2)
        now = reconciler.metric("volcano_reconciler_reconciles_total")
        if now != last or reconciler.metric("volcano_reconciler_queue_depth") > 0:
            last, since = now, time.monotonic()


def steady_resync(server: EnvTest, reconciler: Reconciler, jobs: int) -> dict[str, float]:
    quiet(reconciler)
    before = reconciler.resyncs()
    reconciles = reconciler.metric("volcano_reconciler_reconciles_total")
    wait(lambda: reconciler.resyncs() > before, 600, "the next periodic resync", interval=0.005)
    started_wall, started = time.time(), time.monotonic()
    wait(lambda: reconciler.metric("volcano_reconciler_reconciles_total") - reconciles >= jobs
         and reconciler.metric("volcano_reconciler_queue_depth") == 0, 600, "the resync to finish", interval=0.05)
    took = time.monotonic() - started
    time.sleep(1.0)  # the audit log is written as requests complete
    since = datetime.fromtimestamp(started_wall - 0.5, UTC)
    until = datetime.fromtimestamp(started_wall + took, UTC)
    requests = [e for e in server.audit_events(WEBHOOK_USER, since) if e.received <= until]
    calls = [e for e in requests if e.verb != "watch"]
    return {"seconds": took, "reconciles": reconciler.metric("volcano_reconciler_reconciles_total") - reconciles,
            "calls": len(calls), "writes": sum(1 for e in calls if e.verb in WRITES),
            "lists": sum(1 for e in calls if e.verb == "list"),
            # A kind not served (JobSet without its CRD here) is looked for every 10 s: a LIST answered 404.
            "listed": sorted(f"{e.api_group or 'core'}/{e.resource} {e.code}" for e in calls if e.verb == "list")}


def drift(server: EnvTest, objects: Objects, namespace: str) -> dict[str, float]:
    """From the change to the moment the bench's own watch sees the object as it should be."""
    admin = Rest(server.api_client())
    name = "bench-00007"

    def restored(kind: str, obj_name: str, change: Any, check: Any) -> float:
        started = time.monotonic()
        changed = change()
        wait(lambda: (obj := objects.get(kind, namespace, obj_name)) is not None and check(obj, changed), 60,
             f"{kind} {obj_name} restored")
        return time.monotonic() - started

    out = {}
    for kind, obj_name in (("Service", name), ("ConfigMap", f"{name}-svc")):
        uid = objects.get(kind, namespace, obj_name)["metadata"]["uid"]  # type: ignore[index]
        out[f"deleted {kind}"] = restored(kind, obj_name, lambda k=kind, n=obj_name: admin.delete(OWNED[k], namespace, n),
                                          lambda obj, _, u=uid: obj["metadata"]["uid"] != u)
    good = objects.get("ConfigMap", namespace, f"{name}-svc")["data"]["VC_WORKER_NUM"]  # type: ignore[index]
    edit = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-svc", "namespace": namespace},
            "data": {"VC_WORKER_NUM": "99"}}
    out["hand-edited ConfigMap"] = restored(
        "ConfigMap", f"{name}-svc", lambda: admin.apply(OWNED["ConfigMap"], edit, "kubectl-edit"),
        lambda obj, edited: int(obj["metadata"]["resourceVersion"]) > int(edited["metadata"]["resourceVersion"])
        and obj["data"].get("VC_WORKER_NUM") == good)
    return out


def new_job_during_resync(server: EnvTest, objects: Objects, reconciler: Reconciler, namespace: str, jobs: int) -> dict[str, float]:
    quiet(reconciler)
    admin = Rest(server.api_client())
    before = reconciler.resyncs()
    reconciles = reconciler.metric("volcano_reconciler_reconciles_total")
    wait(lambda: reconciler.resyncs() > before, 600, "the next periodic resync", interval=0.005)
    started = time.monotonic()
    admin.create(JOBS, namespace, bench_job(namespace, "latecomer"))
    names = [("ConfigMap", "latecomer-svc"), ("Service", "latecomer"), ("NetworkPolicy", "latecomer"), ("Secret", "latecomer-ssh")]
    wait(lambda: all(objects.get(kind, namespace, n) is not None for kind, n in names), 600, "the new job's objects")
    latency = time.monotonic() - started
    in_resync = reconciler.metric("volcano_reconciler_reconciles_total") - reconciles
    wait(lambda: reconciler.metric("volcano_reconciler_reconciles_total") - reconciles >= jobs
         and reconciler.metric("volcano_reconciler_queue_depth") == 0, 600, "the resync to finish", interval=0.05)
    return {"latency": latency, "resync": time.monotonic() - started, "done_before": in_resync}


def keygen_rate(seconds: float = 3.0) -> float:
    started, count = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        generate_key_pair()
        count += 1
    return count / (time.monotonic() - started)


def log(what: str, value: object) -> None:
    print(f"{what}: {value}", file=sys.stderr)


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs=2, default=[500, 5000], metavar=("FIRST", "THEN"))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--resync-seconds", type=float, default=30.0, help="the reconciler's period; two are measured")
    args = parser.parse_args()
    assets = find_assets()
    if assets is None:
        print("KUBEBUILDER_ASSETS must name a directory with kube-apiserver and etcd", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    first, then = args.jobs
    total = first + then
    pair = generate_key_pair()
    given = (pair.private_pem.decode(), pair.public_openssh.decode().strip())
    with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as tmp, EnvTest(assets, Path(tmp)) as server:
        server.install_prerequisites()
        keys = keygen_rate()
        # Keys generated per job (as Volcano does): the ssh plugin's RSA-2048 key pair is the bound.
        small, _, converged = converge(server, Path(tmp), first, args.workers, args.resync_seconds)
        stops = [small.sigterm()]
        big, namespace, converged_big = converge(server, Path(tmp), then, args.workers, args.resync_seconds)
        log("generated keys", (converged, converged_big))
        objects = Objects(server, namespace)
        resync = steady_resync(server, big, total)
        log("steady resync", resync)
        repaired = drift(server, objects, namespace)
        log("drift", repaired)
        late = new_job_during_resync(server, objects, big, namespace, total + 1)
        log("new job during resync", late)
        rss = big.rss_mib()
        stops.append(big.sigterm())
        objects.stop()
        # The same jobs with their keys given: what the reconciler itself does per object.
        small, given_ns, given_small = converge(server, Path(tmp), first, args.workers, args.resync_seconds, given, [])
        stops.append(small.sigterm())
        big, _, given_big = converge(server, Path(tmp), then, args.workers, args.resync_seconds, given, [given_ns])
        stops.append(big.sigterm())
        log("given keys", (given_small, given_big))
    load_after = os.getloadavg()

    def rate(result: dict[str, float]) -> str:
        return (f"{result['rate']:.0f} objects/s = {result['ratio']:.2f} × {result['raw']:.0f}/s raw "
                f"({result['raw_before']:.0f} before, {result['raw_after']:.0f} after; {result['seconds']:.1f} s; "
                f"{result['cpu_ms']:.1f} ms CPU per object)")

    def flat(small: dict[str, float], big: dict[str, float]) -> bool:
        return big["ratio"] >= 0.5 and big["ratio"] >= 0.8 * small["ratio"]

    rows = [
        (f"convergence, {first} jobs, keys generated", rate(converged), "≥ 0.5 × raw", mark(converged["ratio"] >= 0.5)),
        (f"convergence, {then:,} jobs, keys generated", rate(converged_big), "≥ 0.5 × raw, flat", mark(flat(converged, converged_big))),
        ("RSA-2048 key pairs (ssh plugin, one per job), one core", f"{keys:.1f}/s, i.e. {4 * keys:.0f} objects/s", "", ""),
        (f"convergence, {first} jobs, keys given", rate(given_small), "≥ 0.5 × raw", mark(given_small["ratio"] >= 0.5)),
        (f"convergence, {then:,} jobs, keys given", rate(given_big), "≥ 0.5 × raw, flat", mark(flat(given_small, given_big))),
        (f"steady-state resync of {total:,} jobs: API requests (watches aside)",
         f"{resync['calls']} ({resync['lists']} LIST: {', '.join(resync['listed']) or 'none'}), {resync['writes']} writes; "
         f"{resync['reconciles']:.0f} reconciles in {resync['seconds']:.1f} s",
         "0 writes, 0 LIST of a served kind",
         mark(resync["writes"] == 0 and not [item for item in resync["listed"] if not item.endswith(" 404")])),
        ("drift repaired: deleted Service / deleted ConfigMap / hand-edited ConfigMap",
         " / ".join(f"{v:.2f} s" for v in repaired.values()), "≤ 2 s", mark(max(repaired.values()) <= 2)),
        (f"new job's 4 objects while {total:,} jobs resync", f"{late['latency']:.2f} s (the resync took {late['resync']:.1f} s)",
         "≤ 2 s", mark(late["latency"] <= 2)),
        (f"resident memory, {total:,} jobs and {total * 4:,} objects cached", f"{rss:.0f} MiB", "≤ 300 MB", mark(rss * 1.048576 <= 300)),
        ("SIGTERM to exit (Lease released), each run", " / ".join(f"{s:.2f} s" for s in stops), "≤ 2 s", mark(max(stops) <= 2)),
    ]
    print(f"\nreconciler benchmark: kube-apiserver + etcd on loopback, {args.workers} workers; jobs svc + ssh + pytorch, "
          f"1 master + 3 workers (4 objects each); raw = 8 threads creating 2,000 ConfigMaps just before and after each run, the mean; "
          f"load average {load_before[0]:.1f} at start, {load_after[0]:.1f} at end ({os.cpu_count()} cores)\n")
    print("| measure | result | target | |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
