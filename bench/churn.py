"""The reconciler under churn, on a real kube-apiserver + etcd with kube-controller-manager's garbage collector:
``python bench/churn.py`` (needs ``KUBEBUILDER_ASSETS`` with kube-controller-manager, as the tests).

For ``--minutes`` (10) it runs ``volcano-webhook reconcile --leader-elect`` as the manifests' ServiceAccount
while a driver, as users and other writers do:

1. creates ``--jobs`` (2,000) Volcano Jobs (svc + ssh, 1 master + 2 workers: a ConfigMap, a Service, a
   NetworkPolicy and a Secret each; one job in ten generates its SSH keys, the others are given one
   pair, so the two cores go to the API server rather than to RSA) at ``--rate`` jobs a second;
2. then, until the end, at ``--rate`` operations a second: deletes a job and makes it again under its
   name, deletes a job, makes a deleted one again, edits a side object (another writer's data),
   deletes a side object;
3. kills the reconciler with SIGKILL every ``--kill-every`` seconds and starts a new one at once (it takes
   the Lease when the dead one's expires), and restarts the API server once, at half time.

After the last change it waits until every live job has exactly the objects ``volcano-webhook resources
--cluster`` says (the same chain in this process, checked against the command itself on a sample), each
with its own job as owner, and no object of a deleted job is left; then prints, with the target of each:
the time to converge after the last change, the reconciler's writes per job, its LISTs by process start
(one per watched kind at start; none for a watch cut), its queue, and its memory at start and end.
The machine is shared: the load average at start and end is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.reconcile import Objects, log, mark, wait  # noqa: E402
from bench.reconcile import Reconciler as ReconcileProcess  # noqa: E402
from tests.helpers.envtest import WEBHOOK_USER, EnvTest, controller_manager, find_assets, new_namespace, product_env  # noqa: E402
from tests.helpers.jobs import PLUGINS_ANNOTATION, volcano_job  # noqa: E402
from volcano_job_webhook.config import load_settings  # noqa: E402
from volcano_job_webhook.kube.rest import Rest, widen_pool  # noqa: E402
from volcano_job_webhook.plugins import Job  # noqa: E402
from volcano_job_webhook.plugins.builtin.ssh import generate_key_pair  # noqa: E402
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB  # noqa: E402
from volcano_job_webhook.reconciler.digests import digested  # noqa: E402
from volcano_job_webhook.reconciler.owned import MANAGED_SELECTOR, OWNED, controlling  # noqa: E402

LEASE = ("volcano-job-webhook-reconciler", "volcano-job-webhook")  # the one Lease the install's Role allows
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
Ident = tuple[str, str]


class Driver:
    """The users and other writers: each job's name → its live uid (absent: deleted)."""

    def __init__(self, server: EnvTest, namespace: str, keys: list[str], seed: int) -> None:
        self.rest = Rest(server.api_client())
        widen_pool(self.rest.api, 8)
        self.namespace = namespace
        self.keys = keys
        self.random = random.Random(seed)
        self.live: dict[str, str] = {}
        self.gone: set[str] = set()
        self.bodies: dict[str, dict[str, Any]] = {}
        self.ops: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.last_change = time.monotonic()

    def body(self, name: str) -> dict[str, Any]:
        if name not in self.bodies:
            generated = int(name.rsplit("-", 1)[1]) % 10 == 0
            self.bodies[name] = volcano_job(name, namespace=self.namespace, plugins={}, tasks=(("master", 1), ("worker", 2)),
                                            annotation={"svc": [], "ssh": [] if generated else self.keys})
        return self.bodies[name]

    def _do(self, op: str, fn: Any) -> None:
        try:
            fn()
            self.ops[op] += 1
        except Exception as exc:  # the API server restarting: counted, the run goes on
            self.failed[f"{op} ({getattr(exc, 'status', None) or type(exc).__name__})"] += 1
        self.last_change = time.monotonic()

    def create(self, name: str) -> None:
        made = self.rest.create(VOLCANO_JOB, self.namespace, self.body(name))
        self.live[name] = made["metadata"]["uid"]
        self.gone.discard(name)

    def delete(self, name: str) -> None:
        self.rest.delete(VOLCANO_JOB, self.namespace, name)
        self.live.pop(name, None)
        self.gone.add(name)

    def step(self) -> None:
        roll = self.random.random()
        live = list(self.live)
        if roll < 0.4 and live:
            name = self.random.choice(live)

            def again() -> None:
                self.delete(name)
                wait(lambda: self.rest.get(VOLCANO_JOB, self.namespace, name) is None, 30, f"{name} gone")
                self.create(name)
            self._do("made again", again)
        elif roll < 0.5 and live:
            self._do("deleted", lambda: self.delete(self.random.choice(live)))
        elif roll < 0.6 and self.gone:
            self._do("made after deletion", lambda: self.create(self.random.choice(sorted(self.gone))))
        elif roll < 0.8 and live:
            name = self.random.choice(live)
            patch = {"data": {"VC_MASTER_NUM": "99"}}
            self._do("side object edited",
                     lambda: self.rest.merge_patch(OWNED["ConfigMap"], self.namespace, f"{name}-svc", patch, "another-writer"))
        elif live:
            name = self.random.choice(live)
            kind, obj = self.random.choice([("Service", name), ("Secret", f"{name}-ssh"), ("NetworkPolicy", name)])
            self._do("side object deleted", lambda: self.rest.delete(OWNED[kind], self.namespace, obj))


def desired(driver: Driver) -> dict[Ident, tuple[str, dict[str, Any]]]:
    """What the reconciler should hold: each live job's objects by the chain ``resources --cluster`` builds
    (with the given key pair where a job generates its own: the objects and the ConfigMaps are the same,
    and the bench does not spend seconds of RSA on a comparison of names)."""
    chain = load_settings(None).chain(on_cluster=True)
    out: dict[Ident, tuple[str, dict[str, Any]]] = {}
    for name, uid in driver.live.items():
        body = driver.body(name)
        body = {**body, "metadata": {**body["metadata"], "uid": uid,
                                     "annotations": {PLUGINS_ANNOTATION: json.dumps({"svc": [], "ssh": driver.keys})}}}
        for obj in chain.resources(Job.from_object(body)):
            out[(obj["kind"], obj["metadata"]["name"])] = (uid, digested(obj))
    return out


def command_agrees(driver: Driver, tmp: Path, sample: int = 5) -> None:
    """The chain above is the command's: ``volcano-webhook resources --cluster`` on a few jobs says the same."""
    chain = load_settings(None).chain(on_cluster=True)
    for name in sorted(driver.live)[:sample]:
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(driver.body(name)))
        out = subprocess.run([sys.executable, "-m", "volcano_job_webhook", "resources", "--cluster", "--job", str(path), "-o", "json"],
                             capture_output=True, check=True, env=product_env())
        said = sorted((o["kind"], o["metadata"]["name"]) for o in json.loads(out.stdout))
        here = sorted((o["kind"], o["metadata"]["name"]) for o in chain.resources(Job.from_object(driver.body(name))))
        if said != here:
            raise SystemExit(f"{name}: the command says {said}, the bench's chain {here}")


def differences(found: dict[Ident, dict[str, Any]], want: dict[Ident, tuple[str, dict[str, Any]]]) -> list[str]:
    """What the cluster holds that it should not, and what it lacks (empty: converged)."""
    out = [f"{k} {n}: left of a deleted or earlier job" for (k, n) in found if (k, n) not in want]
    for ident, (uid, obj) in want.items():
        live = found.get(ident)
        if live is None:
            out.append(f"{ident[0]} {ident[1]}: missing")
        elif controlling(live)[2] != uid:
            out.append(f"{ident[0]} {ident[1]}: owned by {controlling(live)[2]}, not its job {uid}")
        elif ident[0] == "ConfigMap" and live.get("data") != obj.get("data"):
            out.append(f"{ident[0]} {ident[1]}: data not as desired")
    return out


def live_objects(server: EnvTest, namespace: str) -> dict[Ident, dict[str, Any]]:
    """Our objects in the namespace as the API server lists them, long values as digests."""
    admin = Rest(server.api_client())
    return {(kind, obj["metadata"]["name"]): digested(obj) for kind, resource in OWNED.items()
            for obj in admin.call("GET", resource.path(namespace), query=[("labelSelector", MANAGED_SELECTOR)])["items"]}


def keep_logs(work: Path) -> None:
    """The reconcilers' logs, kept where the bench's results go (the work directory is removed)."""
    out = ROOT / "bench" / "results" / "churn-logs"
    out.mkdir(parents=True, exist_ok=True)
    for log_file in work.glob("reconcile-*.log"):
        (out / log_file.name).write_bytes(log_file.read_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=20.0, help="jobs created, then operations, a second")
    parser.add_argument("--kill-every", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    assets = find_assets()
    if assets is None or not (assets / "kube-controller-manager").exists():
        print("KUBEBUILDER_ASSETS must name a directory with kube-apiserver, etcd and kube-controller-manager", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    pair = generate_key_pair()
    keys = [f"--ssh-private-key={pair.private_pem.decode()}", f"--ssh-public-key={pair.public_openssh.decode().strip()}"]
    duration = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="bench-churn-") as tmp, EnvTest(assets, Path(tmp)) as server:
        work = Path(tmp)
        server.install_prerequisites()
        namespace = new_namespace(server.api_client(), "churn-")
        with controller_manager(server, work, controllers=("garbage-collector-controller",)):
            driver = Driver(server, namespace, keys, args.seed)
            processes: list[ReconcileProcess] = []
            memory: list[tuple[str, float]] = []

            def start_reconciler() -> ReconcileProcess:
                process = ReconcileProcess(server, work, workers=4, resync=300, namespaces=[namespace],
                                           extra=["--leader-elect", f"--lease-name={LEASE[0]}", f"--lease-namespace={LEASE[1]}"])
                processes.append(process)
                return process

            current = start_reconciler()
            wait(current.ready, 60, "the first reconciler's caches")
            memory.append(("start", current.rss_mib()))
            started_wall, started = datetime.now(UTC), time.monotonic()
            events: list[str] = []
            restarted = False
            next_kill = started + args.kill_every
            names = [f"churn-{i:04d}" for i in range(args.jobs)]
            tick = 1.0 / args.rate
            while (now := time.monotonic()) - started < duration:
                if names:
                    name = names.pop(0)
                    driver._do("created", lambda n=name: driver.create(n))
                else:
                    driver.step()
                if now >= next_kill:
                    current.process.popen.send_signal(signal.SIGKILL)
                    current.process.popen.wait()
                    events.append(f"{now - started:.0f} s: reconciler {current.process.popen.pid} killed")
                    current = start_reconciler()
                    next_kill += args.kill_every
                if not restarted and now - started >= duration / 2:
                    restarted = True
                    took = server.restart_apiserver()
                    events.append(f"{now - started:.0f} s: API server restarted ({took:.1f} s to ready)")
                time.sleep(max(0.0, tick - (time.monotonic() - now)))
            last_change = driver.last_change
            log("operations", dict(driver.ops))
            log("failed operations", dict(driver.failed))
            for event in events:
                log("event", event)
            command_agrees(driver, work)
            want = desired(driver)
            # A watch of the bench's own from here, so each look costs no request: started only now, so it
            # took no CPU from the run.
            view = Objects(server, namespace)
            problems: list[str] = []

            def converged() -> bool:
                found = {(informer.resource.kind, record.key[1]): record.object()
                         for informer in view.informers for record in informer.items()}
                problems[:] = differences(found, want)
                return not problems
            try:
                wait(converged, 300, "convergence", interval=0.1)
            except SystemExit:
                print(f"not converged: {len(problems)} differences, e.g. {problems[:10]}", file=sys.stderr)
                keep_logs(work)
                raise
            finally:
                view.stop()
            took = time.monotonic() - last_change
            if (late := differences(live_objects(server, namespace), want)):  # what the API server itself holds
                raise SystemExit(f"the watch said converged, a LIST disagrees: {late[:10]}")
            keep_logs(work)
            wait(lambda: current.metric("volcano_reconciler_queue_depth") == 0, 60, "the queue empty")
            memory.append(("end", current.rss_mib()))
            time.sleep(1.0)  # the audit log is written as requests complete
            calls = [e for e in server.audit_events(WEBHOOK_USER, started_wall) if e.verb != "watch"]
            writes = [e for e in calls if e.verb in WRITES and e.resource in {k.plural for k in OWNED.values()}]
            # A list's further pages (``continue=``) are one LIST.
            lists = Counter(f"{e.api_group or 'core'}/{e.resource}" for e in calls
                            if e.verb == "list" and e.code == 200 and "continue=" not in e.uri)
            # A kind the API server does not serve (JobSet without its CRD here) is looked for every 10 s: a 404.
            probes = sum(1 for e in calls if e.verb == "list" and e.code == 404)
            by_verb = Counter(e.verb for e in writes)
            jobs_made = driver.ops["created"] + driver.ops["made again"] + driver.ops["made after deletion"]
            starts = len(processes)
    load_after = os.getloadavg()
    listed = sum(lists.values())
    kinds = len(lists)  # the kinds it watches that the API server serves
    rows = [
        ("jobs made (first, again, after deletion) / deleted", f"{args.jobs} / {driver.ops['made again']} / "
         f"{driver.ops['made after deletion']} / {driver.ops['deleted'] + driver.ops['made again']}", "", ""),
        ("side objects edited / deleted by another writer", f"{driver.ops['side object edited']} / {driver.ops['side object deleted']}", "", ""),
        (f"reconciler processes (killed every {args.kill_every:.0f} s) / API server restarts", f"{starts} / 1", "", ""),
        ("converged after the last change", f"{took:.1f} s", "≤ 10 s", mark(took <= 10)),
        ("every live job's objects as `resources --cluster` says, its own owner; none of a deleted job", "yes", "yes", "met"),
        ("writes per job made", f"{len(writes) / max(jobs_made, 1):.2f} ({len(writes)} writes: {dict(by_verb)})", "", ""),
        # The first process listed before the window opened: each later start lists every kind once.
        ("LISTs by the reconciler, of the kinds served", f"{listed} = {listed / max(kinds, 1):.1f} per kind: {dict(lists)}",
         f"one per process start in the run ({starts - 1}) a kind, none per watch cut or API server restart",
         mark(all(n <= starts - 1 for n in lists.values()))),
        ("LISTs of a kind not served (JobSet, every 10 s)", str(probes), "", ""),
        ("queue at the end", "0 ready", "0", "met"),
        ("reconciler memory at start / end", " / ".join(f"{mib:.0f} MiB" for _, mib in memory), "", ""),
    ]
    print(f"load average {load_before[0]:.1f} at start, {load_after[0]:.1f} at end; {args.jobs} jobs, {args.minutes:.0f} min")
    print("| measure | result | target | |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "churn"
    sys.exit(main())
