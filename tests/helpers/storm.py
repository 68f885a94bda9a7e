"""Volcano's Pod storm through the webhook on hollow nodes (issue #40): what tests/on_node/test_storm.py
and bench/storm.py share.

A storm submits Volcano Jobs at a steady rate into one namespace of the node's cluster
(tests/node.py with a whole Volcano), each of :data:`PODS_PER_JOB` Pods with one of the example jobs'
plugin sets (:data:`PLUGIN_SETS`: Volcano's svc and env in ``spec.plugins``; our torchrun, jax and
waitfor in the job annotation), every Pod selecting and tolerating the hollow nodes of
tests/helpers/hollow.py. While it runs:

- a watch (the product's own :class:`Informer`) records when each Pod is first seen and first seen
  ``Running``, and its wiring (env, host name, mounts) as created;
- the API server's ``/metrics`` is read every few seconds: the histogram
  ``apiserver_admission_webhook_admission_duration_seconds`` and the counter
  ``apiserver_admission_webhook_rejection_count`` by webhook name, ours and Volcano's;
- the product's containers are read from the node's cgroups (CPU seconds, throttling, peak
  memory), its processes from ``/proc`` (time spent waiting for a CPU);
- faults, when given, run at their times (a webhook Pod evicted or deleted, the reconciler's leader
  killed, the API server restarted).

Then :class:`StormResult` holds the figures: Pod start-up latency (first seen → Running), admission
latency percentiles from the histogram's increase (as Prometheus's ``histogram_quantile`` reads
it), Volcano's Pod creation rate, refusals, and the wiring of a sample of Pods (or all) against the
chain ``volcano-webhook mutate --cluster`` builds (the command itself is run on one job of each
plugin set, and must agree). The arithmetic is pure and tested alone (tests/unit/helpers/test_storm_figures.py).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import EnvTest, https_get, product_env, request, wait_until
from tests.helpers.hollow import NODE_SELECTOR, TOLERATION, process_cpu_seconds, process_peak_rss, process_schedstat
from tests.helpers.jobs import job_owner, volcano_job
from volcano_job_webhook.cli.inputs import build_pod
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import Version, resource_version
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins import Job
from volcano_job_webhook.plugins.kinds import POD, VOLCANO_JOB
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.admission import admission_review

Obj = dict[str, Any]

PODS_PER_JOB = 8
# The example jobs' plugin sets (examples/jobs/): Volcano's own in spec.plugins, ours in the job
# annotation (Volcano's admission refuses plugin names it does not know in spec.plugins). No ssh or
# hostfile: their subPath mounts never start on a hollow node (real-kubernetes.md).
PLUGIN_SETS: dict[str, tuple[dict[str, list[str]], dict[str, list[str]] | None]] = {
    "svc-env": ({"svc": [], "env": []}, None),
    "torchrun": ({"svc": ["--publish-not-ready-addresses"]}, {"torchrun": ["--master=master", "--worker=worker"]}),
    "jax": ({"svc": ["--publish-not-ready-addresses"]}, {"jax": ["--coordinator=master", "--port=6666"]}),
    "waitfor": ({"svc": []}, {"waitfor": ["--tasks=worker", "--timeout=300"]}),
}
# The Pod webhooks the API server times, by who runs them.
OURS = ("pods.volcano-job-webhook.io",)
VOLCANOS = ("mutatepod.volcano.sh", "validatepod.volcano.sh")
ADMISSION_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"
REJECTIONS = "apiserver_admission_webhook_rejection_count"
# What the API server was asked, by resource and verb: where its CPU went in one storm against another.
API_REQUESTS = "apiserver_request_total"
SCRAPED = (ADMISSION_HISTOGRAM, REJECTIONS, "apiserver_admission_webhook_request_total", "apiserver_admission_webhook_fail_open_count",
           API_REQUESTS)
JOB_LABEL = "volcano.sh/job-name"
RELEASE_NAMESPACE = "volcano-job-webhook"
SUBMITTERS = 4  # Jobs being created at once, at most (Storm.run)


# The arithmetic ------------------------------------------------------------------------------------

Series = tuple[str, tuple[tuple[str, str], ...]]  # a metric's name and its labels, sorted
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, prefixes: Sequence[str] = ()) -> dict[Series, float]:
    """The samples of a Prometheus text exposition (those whose name starts with one of ``prefixes``,
    when given), by name and labels."""
    out: dict[Series, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or (prefixes and not line.startswith(tuple(prefixes))):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        pairs = tuple(sorted((k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, v in _LABEL.findall(labels or "")))
        out[(name, pairs)] = float(value)
    return out


def increase(snapshots: Sequence[Mapping[Series, float]]) -> dict[Series, float]:
    """How much each counter grew across the snapshots, oldest first, as Prometheus's ``increase``
    without extrapolation: a drop is a restart of the process that counts (the API server's), after
    which the counter grew from zero. A series first seen in a later snapshot grew from zero too."""
    total: dict[Series, float] = defaultdict(float)
    previous: Mapping[Series, float] = snapshots[0] if snapshots else {}
    for snapshot in snapshots[1:]:
        for series, value in snapshot.items():
            before = previous.get(series)
            if before is None:
                total[series] += value
            else:
                total[series] += value - before if value >= before else value
        previous = snapshot
    return dict(total)


def buckets(samples: Mapping[Series, float], metric: str, match: Callable[[dict[str, str]], bool]) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, summed over every series of ``metric``
    whose labels ``match`` (every label but ``le``)."""
    out: dict[float, float] = defaultdict(float)
    for (name, pairs), value in samples.items():
        if name != f"{metric}_bucket":
            continue
        labels = dict(pairs)
        le = labels.pop("le")
        if match(labels):
            out[math.inf if le == "+Inf" else float(le)] += value
    return dict(sorted(out.items()))


def histogram_quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile``: the ``q`` quantile of a histogram from its cumulative
    bucket counts, interpolated linearly inside the bucket it falls in (from 0 in the first); the
    highest finite bound when it falls in ``+Inf``. None when the histogram is empty."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile of raw values by linear interpolation between the nearest ranks (NumPy's
    default); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def p50_p99_count(groups: Mapping[Any, list[float]]) -> dict[Any, tuple[float, float, int]]:
    """Each group's p50 and p99 (rounded to 10 ms) and its size, by key in order."""
    return {k: (round(percentile(v, 0.5) or 0, 2), round(percentile(v, 0.99) or 0, 2), len(v)) for k, v in sorted(groups.items())}


def rate(times: Iterable[float]) -> float | None:
    """Events a second between the first and the last of ``times`` (None for fewer than two, or all at once)."""
    ordered = sorted(times)
    if len(ordered) < 2 or ordered[-1] == ordered[0]:
        return None
    return (len(ordered) - 1) / (ordered[-1] - ordered[0])


def peak_rate(times: Iterable[float], window: float) -> float:
    """The most events in any ``window`` seconds (half-open windows starting at an event), a second."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while t - ordered[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best / window


def windowed_quantiles(snapshots: Sequence[tuple[float, Mapping[Series, float]]], metric: str, match: Callable[[dict[str, str]], bool],
                       q: float, window: float, minimum: int = 20) -> list[tuple[float, float, float]]:
    """``(start, calls, quantile)`` of each run of snapshots ``window`` seconds long (back to back)
    whose histogram grew by at least ``minimum`` calls: the quantile at each stage of a storm."""
    out: list[tuple[float, float, float]] = []
    i = 0
    while i < len(snapshots) - 1:
        j = i + 1
        while j < len(snapshots) - 1 and snapshots[j][0] - snapshots[i][0] < window:
            j += 1
        grown = buckets(increase([snapshots[i][1], snapshots[j][1]]), metric, match)
        calls = grown[max(grown)] if grown else 0.0
        value = histogram_quantile(q, grown) if calls >= minimum else None
        if value is not None:
            out.append((snapshots[i][0], calls, value))
        i = j
    return out


def api_requests(grown: Mapping[Series, float]) -> dict[str, float]:
    """The API server's requests in ``grown`` by verb, resource and subresource (``PATCH pods status``),
    the most first: every code and client together; none that did not grow."""
    out: dict[str, float] = defaultdict(float)
    for (name, pairs), value in grown.items():
        if name == API_REQUESTS and value:
            labels = dict(pairs)
            out[" ".join(filter(None, (labels.get("verb"), labels.get("resource"), labels.get("subresource"))))] += value
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def named(names: Sequence[str]) -> Callable[[dict[str, str]], bool]:
    return lambda labels: labels.get("name") in names


# The jobs -----------------------------------------------------------------------------------------


def storm_job(name: str, plugin_set: str, namespace: str, pods: int = PODS_PER_JOB, *, held: bool = False) -> Obj:
    """A Volcano Job of ``pods`` Pods (a master and workers) with the plugins of ``plugin_set``, every
    Pod on a hollow node (their label and taint), gang-scheduled by vc-scheduler. The container asks
    for a sliver of CPU and memory, so that vc-scheduler's allocate (not its best-effort backfill)
    places it, as it places real jobs. ``held``: a ``waitfor`` job's master gets an init container of
    its own, sized as its container and never ended by a hollow node, as ``waitfor``'s is (the
    product's hold, without the product)."""
    plugins, annotation = PLUGIN_SETS[plugin_set]
    job = volcano_job(name, namespace=namespace, tasks=[("master", 1), ("worker", pods - 1)], plugins=plugins,
                      annotation=annotation, image="busybox:1.36.1", schedulerName="volcano", minAvailable=pods, queue="default")
    for task in job["spec"]["tasks"]:
        spec = task["template"]["spec"]
        spec.update(nodeSelector=dict(NODE_SELECTOR), tolerations=[dict(TOLERATION)], restartPolicy="Never",
                    terminationGracePeriodSeconds=0)
        spec["containers"][0].update(command=["sleep", "infinity"],
                                     resources={"requests": {"cpu": "1m", "memory": "1Mi"}})
    if held and plugin_set == "waitfor":
        master = job["spec"]["tasks"][0]["template"]["spec"]
        master["initContainers"] = [{"name": "held", "image": "busybox:1.36.1", "command": ["sleep", "infinity"],
                                     "resources": master["containers"][0]["resources"]}]
    job["metadata"].setdefault("labels", {})["vjw-storm/plugin-set"] = plugin_set
    return job


def plugin_set_of(index: int, sets: Sequence[str] = tuple(PLUGIN_SETS)) -> str:
    """The plugin set of the storm's ``index``-th job: ``sets`` in turn."""
    return sets[index % len(sets)]


# What a Pod is wired with ------------------------------------------------------------------------


def _env(container: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for entry in container.get("env") or []:
        source = entry.get("valueFrom")
        if source is not None:
            source = json.loads(json.dumps(source))
            (source.get("fieldRef") or {}).pop("apiVersion", None)  # the API server's default
        out.append((entry["name"], json.dumps(entry.get("value", "") if source is None else source, sort_keys=True)))
    return sorted(out)


def _mounts(container: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((m["name"], m["mountPath"], m.get("subPath", "")) for m in container.get("volumeMounts") or []
                  if not m["name"].startswith("kube-api-access-"))


def wiring(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the plugins wire in a Pod, comparable between a Pod the API server stored and one the
    chain built: each container's and init container's env and mounts, the host name and subdomain,
    the volumes by name (the API server's token volume left out)."""
    spec = pod.get("spec") or {}
    return {
        "hostname": spec.get("hostname"), "subdomain": spec.get("subdomain"),
        "containers": {c["name"]: {"env": _env(c), "mounts": _mounts(c)} for c in spec.get("containers") or []},
        "initContainers": {c["name"]: {"env": _env(c), "mounts": _mounts(c)} for c in spec.get("initContainers") or []},
        "volumes": sorted(v["name"] for v in spec.get("volumes") or [] if not v["name"].startswith("kube-api-access-")),
    }


def task_and_index(pod_name: str, job_name: str) -> tuple[str, int]:
    """``(task, index)`` of a Pod Volcano's controller named ``<job>-<task>-<index>``."""
    task, _, index = pod_name.removeprefix(f"{job_name}-").rpartition("-")
    return task, int(index)


class Expected:
    """What ``volcano-webhook mutate --cluster`` says a Pod of a job is wired with, computed with the
    command's own chain in this process (one chain, each job prepared once)."""

    def __init__(self) -> None:
        self.chain = load_settings(None).chain(on_cluster=True)
        self._prepared: dict[str, Any] = {}

    def pod(self, job_obj: Obj, task: str, index: int) -> Obj:
        uid = job_obj["metadata"]["uid"]
        job = Job.from_object(job_obj)
        if uid not in self._prepared:
            self._prepared[uid] = self.chain.prepare(job)
        prepared = self._prepared[uid]
        sent = prepared.volcano_part(build_pod(job, task, index))
        result: Obj = prepared.mutate(sent.pod, volcano_wired=True).pod
        return result

    def resources(self, job_obj: Obj) -> list[tuple[str, str]]:
        """The side objects ``volcano-webhook resources --cluster`` says we make for the job."""
        return sorted((o["kind"], o["metadata"]["name"]) for o in self.chain.resources(Job.from_object(job_obj)))


def mutate_command(job_obj: Obj, task: str, index: int, workdir: Path) -> Obj:
    """``volcano-webhook mutate --cluster --job FILE --task TASK --index INDEX``'s Pod."""
    path = workdir / f"{job_obj['metadata']['name']}.json"
    path.write_text(json.dumps(job_obj))
    done = subprocess.run([sys.executable, "-m", "volcano_job_webhook", "mutate", "--cluster", "--job", str(path), "--task", task,
                           "--index", str(index), "-o", "json"], capture_output=True, text=True, env=product_env(), timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pod: Obj = json.loads(done.stdout)
    return pod


# The watch -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class PodRecord:
    """What the watch keeps of a Pod (the Informer's record)."""

    key: tuple[str, str]
    version: Version
    uid: str
    job: str
    phase: str
    node: str
    created: str  # creationTimestamp (whole seconds)
    init_started: bool  # an init container reported running or done
    wiring: dict[str, Any] | None


def _pod_record(obj: Obj) -> PodRecord:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    init_started = any(set(s.get("state") or {}) & {"running", "terminated"} for s in status.get("initContainerStatuses") or [])
    return PodRecord((meta.get("namespace") or "", meta.get("name") or ""), resource_version(obj), meta.get("uid") or "",
                     (meta.get("labels") or {}).get(JOB_LABEL, ""), status.get("phase") or "",
                     spec.get("nodeName") or "", meta.get("creationTimestamp") or "", init_started, None)


class PodWatch:
    """Every Pod of Volcano jobs in ``namespace``: when first seen, when first seen started, on which
    node, and its wiring as created (Pods are immutable in what the webhook wires).

    Started is Running, or for a Pod with an init container its init container reported running: a
    hollow node runs an init container forever (nothing runs; it never ends), so the Pods waitfor
    holds never reach Running there. The SLO leaves init containers' time out of start-up latency;
    what is measured of those Pods is the time to their first container started."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.first_seen: dict[str, float] = {}
        self.running: dict[str, float] = {}  # started, as above
        self.bound: dict[str, float] = {}  # first seen with a node
        self.in_init: set[str] = set()  # of those, the ones started in an init container
        self.pods: dict[str, PodRecord] = {}
        self.deleted: set[str] = set()
        self._lock = threading.Lock()
        self.informer: Informer[PodRecord] = Informer(api, POD, [namespace], transform=self._transform, label_selector=JOB_LABEL)
        self.informer.add_event_handler(self._event)

    def _transform(self, obj: Obj) -> PodRecord:
        record = _pod_record(obj)
        uid = record.uid
        if uid not in self.pods:
            record.wiring = wiring(obj)
        return record

    def _event(self, kind: str, record: Any) -> None:
        now = time.monotonic()
        if not isinstance(record, PodRecord):
            return
        with self._lock:
            if kind == "DELETED":
                self.deleted.add(record.uid)
                return
            known = self.pods.get(record.uid)
            if known is not None and record.wiring is None:
                record.wiring = known.wiring
            self.pods[record.uid] = record
            self.first_seen.setdefault(record.uid, now)
            if record.node:
                self.bound.setdefault(record.uid, now)
            started = record.phase == "Running" or (record.phase == "Pending" and record.init_started)
            if started and record.uid not in self.running:
                self.running[record.uid] = now
                if record.phase != "Running":
                    self.in_init.add(record.uid)

    def start(self, timeout: float = 60.0) -> PodWatch:
        self.informer.start()
        wait_until(lambda: self.informer.synced, timeout, "the storm's watch of Pods")
        return self

    def stop(self) -> None:
        self.informer.stop()

    def running_count(self) -> int:
        return len(self.running)

    def startup_seconds(self) -> list[float]:
        """First seen → first seen started, of every Pod seen started."""
        return self.between(self.first_seen, self.running)

    def between(self, first: Mapping[str, float], then: Mapping[str, float]) -> list[float]:
        """Seconds from ``first`` to ``then`` of every Pod in both (e.g. :attr:`first_seen` → :attr:`bound`)."""
        with self._lock:
            return [then[uid] - first[uid] for uid in then if uid in first]


# The API server's metrics, read along -----------------------------------------------------------------


class Scraper:
    """The API server's admission metrics every ``interval`` seconds, in a thread: ``snapshots`` are
    ``(time.monotonic(), samples)``. A read that fails (the API server restarting) is skipped."""

    def __init__(self, envtest: EnvTest, interval: float = 5.0, also: Callable[[], None] | None = None) -> None:
        self.envtest, self.interval, self.also = envtest, interval, also
        self.snapshots: list[tuple[float, dict[Series, float]]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storm-scraper", daemon=True)

    def read(self) -> bool:
        answer = https_get(f"{self.envtest.host}/metrics", self.envtest.ca_file, timeout=10,
                           headers={"Authorization": f"Bearer {self.envtest.token()}"})
        if answer is None or answer[0] != 200:
            self.failures += 1
            return False
        self.snapshots.append((time.monotonic(), parse_metrics(answer[1].decode(), SCRAPED)))
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.read()
            if self.also is not None:
                try:
                    self.also()
                except Exception:  # a sample missed (a Pod gone meanwhile): the next one counts
                    pass

    def start(self) -> Scraper:
        wait_until(self.read, 60, "the API server's /metrics")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for _ in range(10):  # the last read after the storm: retried while the API server is away
            if self.read():
                break
            time.sleep(1.0)


# Each webhook asked directly, beside the API server -------------------------------------------------------


class AdmissionProbe:
    """POSTs the same AdmissionReview to each target (``name`` → ``https://host:port/path``) every
    ``interval`` seconds, each over a kept-alive connection of its own, from this process, and records
    how long each answer took: each webhook's latency under the storm without the API server's part
    (its queue, the Service's route, applying the patch)."""

    # Each call is a Pod's admission more for the webhook asked and CPU for this process: at 0.25 s, the
    # probe was a third of our webhook's calls in a storm, and the storm with the product paid for it.
    def __init__(self, targets: Mapping[str, str], body: bytes, interval: float = 1.0) -> None:
        self.targets, self.body, self.interval = dict(targets), body, interval
        self.latencies: dict[str, list[float]] = {name: [] for name in targets}
        self.errors: dict[str, int] = dict.fromkeys(targets, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storm-probe", daemon=True)

    def _run(self) -> None:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        connections: dict[str, http.client.HTTPSConnection] = {}
        while not self._stop.wait(self.interval):
            for name, url in self.targets.items():
                parts = urllib.parse.urlsplit(url)
                try:
                    connection = connections.get(name)
                    if connection is None:
                        connection = connections[name] = http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context, timeout=10)
                        connection.connect()
                    started = time.perf_counter()
                    connection.request("POST", parts.path, body=self.body, headers={"Content-Type": "application/json"})
                    answer = connection.getresponse()
                    answer.read()
                    took = time.perf_counter() - started
                    if answer.status == 200:
                        self.latencies[name].append(took)
                    else:
                        self.errors[name] += 1
                except (OSError, http.client.HTTPException):
                    self.errors[name] += 1
                    broken = connections.pop(name, None)
                    if broken is not None:
                        broken.close()
        for connection in connections.values():
            connection.close()

    def start(self) -> AdmissionProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def figures(self) -> dict[str, Any]:
        """p50 and p99 by target, and of every replica of ours together (``probe_ours_*``)."""
        out: dict[str, Any] = {}
        groups = dict(self.latencies)
        groups["ours"] = [v for name, values in self.latencies.items() if name.startswith("ours_") for v in values]
        self.errors["ours"] = sum(n for name, n in self.errors.items() if name.startswith("ours_"))
        for name, values in groups.items():
            out[f"probe_{name}_calls"] = len(values)
            out[f"probe_{name}_errors"] = self.errors[name]
            for q in (50, 99):
                value = percentile(values, q / 100)
                out[f"probe_{name}_p{q}_ms"] = value * 1000 if value is not None else None
        return out


def probe_targets(api: client.ApiClient, product: bool) -> dict[str, str]:
    """Where each Pod webhook answers: ours at each replica's Pod IP, Volcano's at the URL its
    registration names."""
    targets: dict[str, str] = {}
    found = request(api, "GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")["items"]
    for configuration in found:
        for hook in configuration.get("webhooks") or []:
            if hook["name"] == VOLCANOS[0] and hook["clientConfig"].get("url"):
                targets["volcano_mutatepod"] = hook["clientConfig"]["url"]
    if product:
        for i, pod in enumerate(webhook_pods(api)):
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
                targets[f"ours_{i}"] = f"https://{ip}:8443/mutate"
    return targets


# The product's containers, from the node's cgroups ----------------------------------------------------


def controller_root(controller: str) -> Path | None:
    """The mount point of the cgroup v1 hierarchy that holds ``controller`` (None on v2 alone)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        words = after.split()
        if words and words[0] == "cgroup" and controller in words[-1].split(","):
            return Path(before.split()[4])
    return None


def container_cgroup(controller: str, cgroup_root: str, pod_uid: str, container_id: str) -> Path | None:
    """A container's cgroup directory in ``controller``'s hierarchy, under kubelet's ``cgroupRoot``
    (cgroupfs driver: ``kubepods/[burstable|besteffort/]pod<uid>/<id>``)."""
    top = controller_root(controller)
    if top is None:
        return None
    base = top / cgroup_root.lstrip("/") / "kubepods"
    for qos in ("burstable/", "besteffort/", ""):
        path = base / f"{qos}pod{pod_uid}" / container_id
        if path.is_dir():
            return path
    return None


def _read_int(path: Path | None, name: str) -> int | None:
    try:
        return int((path / name).read_text().split()[0]) if path is not None else None
    except (OSError, ValueError, IndexError):
        return None


def _cpu_stat(path: Path | None) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in (path / "cpu.stat").read_text().splitlines())} if path else {}
    except (OSError, ValueError):
        return {}


@dataclass
class ContainerSample:
    """One reading of one of the product's containers."""

    pod: str
    container: str
    cpu_seconds: float  # cpuacct.usage
    throttled_periods: int  # cpu.stat nr_throttled
    throttled_seconds: float  # cpu.stat throttled_time
    periods: int  # cpu.stat nr_periods
    memory_peak: int  # memory.max_usage_in_bytes (page cache included)
    rss_peak: int  # the processes' VmHWM, summed
    waiting_seconds: float  # runnable but waiting for a CPU (schedstat), the processes' threads summed
    cpu_shares: int | None
    cpu_quota_us: int | None
    accepted: int = 0  # TCP connections accepted in the Pod's network namespace (Tcp PassiveOpens)


def passive_opens(pid: int) -> int:
    """TCP connections accepted so far in the network namespace of ``pid`` (``/proc/PID/net/snmp``)."""
    try:
        lines = [line.split() for line in Path(f"/proc/{pid}/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
        return int(dict(zip(lines[0], lines[1], strict=True))["PassiveOpens"])
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def cgroup_pids(path: Path | None) -> list[int]:
    """The processes in the cgroup at ``path`` (none when it is gone or None)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()] if path is not None else []
    except (OSError, ValueError):
        return []


def container_pids(pod: Obj, container: str, cgroup_root: str) -> list[int]:
    """The host pids of ``pod``'s ``container`` (none while it has no container ID or cgroup)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status["name"] == container and status.get("containerID"):
            return cgroup_pids(container_cgroup("cpu", cgroup_root, pod["metadata"]["uid"], status["containerID"].rpartition("://")[2]))
    return []


def sample_container(cgroup_root: str, pod: str, pod_uid: str, container: str, container_id: str) -> ContainerSample | None:
    cpu = container_cgroup("cpu", cgroup_root, pod_uid, container_id)
    acct = container_cgroup("cpuacct", cgroup_root, pod_uid, container_id)
    memory = container_cgroup("memory", cgroup_root, pod_uid, container_id)
    usage = _read_int(acct, "cpuacct.usage")
    if usage is None:
        return None
    stat = _cpu_stat(cpu)
    pids = cgroup_pids(cpu or acct)
    waits = [w for pid in pids if (w := process_schedstat(pid)) is not None]
    return ContainerSample(pod, container, usage / 1e9, stat.get("nr_throttled", 0), stat.get("throttled_time", 0) / 1e9,
                           stat.get("nr_periods", 0), _read_int(memory, "memory.max_usage_in_bytes") or 0,
                           sum(process_peak_rss(pid) or 0 for pid in pids), sum(w[1] for w in waits),
                           _read_int(cpu, "cpu.shares"), _read_int(cpu, "cpu.cfs_quota_us"), accepted=passive_opens(pids[0]) if pids else 0)


class ProductUsage:
    """The product's containers over a storm: each container's first and last reading (a container
    replaced mid-storm keeps its last), so CPU seconds, throttling and waits are what the storm cost."""

    def __init__(self, api: client.ApiClient, cgroup_root: str, namespace: str = RELEASE_NAMESPACE) -> None:
        self.api, self.cgroup_root, self.namespace = api, cgroup_root, namespace
        self.first: dict[str, ContainerSample] = {}
        self.last: dict[str, ContainerSample] = {}
        self.began: set[str] = set()  # containers there when the storm began
        # The webhook's own /metrics, by Pod: the first and last read (its time inside, its lookups).
        self.served: dict[str, list[dict[Series, float]]] = {}
        self._lock = threading.Lock()

    def sample(self, *, at_start: bool = False) -> None:
        pods = request(self.api, "GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        for pod in pods:
            ip = (pod.get("status") or {}).get("podIP")
            if ip and (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "webhook":
                answer = https_get(f"https://{ip}:8443/metrics", timeout=2)
                if answer is not None and answer[0] == 200:
                    read = parse_metrics(answer[1].decode(), ("volcano_webhook_admission", "volcano_webhook_job_lookups"))
                    with self._lock:
                        # A replica started during the storm counts from zero.
                        self.served.setdefault(pod["metadata"]["name"], [read if at_start else {}, read])[1] = read
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                cid = (status.get("containerID") or "").rpartition("://")[2]
                if not cid:
                    continue
                found = sample_container(self.cgroup_root, pod["metadata"]["name"], pod["metadata"]["uid"], status["name"], cid)
                if found is None:
                    continue
                with self._lock:
                    self.first.setdefault(cid, found)
                    self.last[cid] = found
                    if at_start:
                        self.began.add(cid)

    def totals(self) -> dict[str, dict[str, float]]:
        """By container name (``webhook``, ``reconciler``): CPU seconds over the storm (all replicas),
        throttled periods and seconds, seconds waiting for a CPU, the peak of any one container's
        memory (RSS and the cgroup's), its limits, and how many containers were seen."""
        out: dict[str, defaultdict[str, float]] = {}
        with self._lock:
            for cid, last in self.last.items():
                first = self.first[cid] if cid in self.began else None
                row = out.setdefault(last.container, defaultdict(float))
                row["cpu_seconds"] += last.cpu_seconds - (first.cpu_seconds if first else 0.0)
                row["throttled_periods"] += last.throttled_periods - (first.throttled_periods if first else 0)
                row["periods"] += last.periods - (first.periods if first else 0)
                row["throttled_seconds"] += last.throttled_seconds - (first.throttled_seconds if first else 0.0)
                row["waiting_seconds"] += max(0.0, last.waiting_seconds - (first.waiting_seconds if first else 0.0))
                row["rss_peak_mib"] = max(row["rss_peak_mib"], last.rss_peak / 2**20)
                row["memory_peak_mib"] = max(row["memory_peak_mib"], last.memory_peak / 2**20)
                row["containers"] += 1
                row["connections_accepted"] += last.accepted - (first.accepted if first else 0)
                row["cpu_shares"] = last.cpu_shares or 0
                row["cpu_quota_ms"] = (last.cpu_quota_us or 0) / 1000
        return {name: dict(row) for name, row in out.items()}

    def served_figures(self) -> dict[str, Any]:
        """The webhook's own view over the storm (its replicas summed): ``/mutate``'s time inside the
        process, p50 and p99, and its Job lookups by result (a miss of the cache is a GET)."""
        with self._lock:
            grown: dict[Series, float] = defaultdict(float)
            for first, last in self.served.values():
                for series, value in increase([first, last]).items():
                    grown[series] += value
        inside = buckets(grown, "volcano_webhook_admission_duration_seconds", lambda labels: labels.get("endpoint") == "mutate")
        out: dict[str, Any] = {}
        for q in (50, 99):
            quantile = histogram_quantile(q / 100, inside)
            out[f"webhook_inside_p{q}_ms"] = quantile * 1000 if quantile is not None else None
        out["webhook_lookups"] = {dict(p).get("result", ""): v for (n, p), v in grown.items()
                                  if n == "volcano_webhook_job_lookups_total" and v}
        return out


class HostUsage:
    """CPU seconds, time waiting for a CPU and peak memory of the host's processes over a storm, by name."""

    def __init__(self, pids: Mapping[str, Iterable[int]]) -> None:
        self.pids = {name: list(p) for name, p in pids.items()}
        self.start = {name: self._cpu(p) for name, p in self.pids.items()}

    @staticmethod
    def _cpu(pids: Iterable[int]) -> tuple[float, float]:
        cpu = sum(process_cpu_seconds(pid) or 0.0 for pid in pids)
        wait = sum((process_schedstat(pid) or (0.0, 0.0))[1] for pid in pids)
        return cpu, wait

    def totals(self) -> dict[str, dict[str, float]]:
        out = {}
        for name, pids in self.pids.items():
            if not all(Path(f"/proc/{pid}").exists() for pid in pids):
                continue  # one ended (the API server restarted): its figures would count from another process
            cpu, wait = self._cpu(pids)
            out[name] = {"cpu_seconds": cpu - self.start[name][0], "waiting_seconds": wait - self.start[name][1],
                         "rss_peak_mib": max((process_peak_rss(pid) or 0 for pid in pids), default=0) / 2**20, "processes": len(pids)}
        return out


# Faults --------------------------------------------------------------------------------------------------


def webhook_pods(api: client.ApiClient, namespace: str = RELEASE_NAMESPACE) -> list[Obj]:
    pods: list[Obj] = request(api, "GET", f"/api/v1/namespaces/{namespace}/pods",
                              query=[("labelSelector", "app.kubernetes.io/component=webhook")])["items"]
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["creationTimestamp"])


def evict_webhook_pod(api: client.ApiClient, namespace: str = RELEASE_NAMESPACE) -> str:
    """Evict the oldest webhook Pod through the Eviction API, which the PodDisruptionBudget guards:
    ``evicted NAME`` or ``refused NAME (429: the budget)``."""
    pods = webhook_pods(api, namespace)
    if not pods:
        return "no webhook Pod"
    name = pods[0]["metadata"]["name"]
    try:
        request(api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}})
    except ApiException as exc:
        return f"refused {name} ({exc.status})"
    return f"evicted {name}"


def delete_webhook_pod(api: client.ApiClient, namespace: str = RELEASE_NAMESPACE) -> str:
    """Delete the oldest webhook Pod (its grace period and preStop as the chart sets them)."""
    pods = webhook_pods(api, namespace)
    if not pods:
        return "no webhook Pod"
    name = pods[0]["metadata"]["name"]
    request(api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return f"deleted {name}"


def kill_reconciler_leader(api: client.ApiClient, cgroup_root: str, namespace: str = RELEASE_NAMESPACE,
                           lease: str = "volcano-job-webhook-reconciler") -> str:
    """SIGKILL the processes of the reconciler container of the Pod that holds the Lease (kubelet
    restarts the container; another replica takes the Lease when it expires)."""
    held = request(api, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}")
    holder = (held.get("spec") or {}).get("holderIdentity") or ""
    pod = request(api, "GET", f"/api/v1/namespaces/{namespace}/pods/{holder}")
    pids = container_pids(pod, "reconciler", cgroup_root)
    assert pids, f"no processes found for {holder}'s reconciler"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return f"killed the reconciler of {holder} (leader; pids {pids})"


@dataclass
class Fault:
    """Something done to the cluster at ``at`` seconds into the storm (again every ``every`` seconds
    while the storm submits, when given)."""

    name: str
    at: float
    action: Callable[[], str]
    every: float | None = None


# The storm ------------------------------------------------------------------------------------------------


@dataclass
class StormResult:
    """The figures of one storm (``figures``), what happened (``events``), and what failed (``problems``)."""

    figures: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    windows: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)


@dataclass
class Storm:
    """``jobs`` Volcano Jobs at ``rate`` a second into ``namespace`` (made here) of the cluster
    ``envtest`` serves. ``product``: the product is installed (its containers are measured and its
    wiring checked); ``check_all``: every Pod's wiring is checked, not one a job."""

    envtest: EnvTest
    namespace: str
    jobs: int
    rate: float = 10.0
    pods_per_job: int = PODS_PER_JOB
    product: bool = True
    cgroup_root: str = ""
    timeout: float = 600.0
    check_all: bool = False
    faults: Sequence[Fault] = ()
    host_pids: Mapping[str, Iterable[int]] = field(default_factory=dict)
    workdir: Path | None = None
    seed: int = 40
    probe: bool = True  # each Pod webhook asked directly too (AdmissionProbe)
    plugin_sets: Sequence[str] = tuple(PLUGIN_SETS)  # taken in turn, job by job
    held: bool = False  # storm_job's: waitfor's hold, without the product

    def run(self) -> StormResult:
        result = StormResult()
        admin = self.envtest.api_client()
        widen_pool(admin, 8 + SUBMITTERS)
        rest = Rest(admin)
        expected_pods = self.jobs * self.pods_per_job
        watch = PodWatch(self.envtest.api_client(), self.namespace).start()
        usage = ProductUsage(admin, self.cgroup_root) if self.product else None
        if usage is not None:
            usage.sample(at_start=True)
        scraper = Scraper(self.envtest, also=usage.sample if usage is not None else None).start()
        host = HostUsage(self.host_pids)
        load_before = os.getloadavg()
        submitted: dict[str, float] = {}
        create_failures: list[str] = []
        started = time.monotonic()
        probe: AdmissionProbe | None = None
        stop_faults = threading.Event()
        fault_thread = threading.Thread(target=self._faults, args=(started, result, stop_faults), name="storm-faults", daemon=True)
        fault_thread.start()
        try:
            def create(name: str, body: Obj) -> None:
                for attempt in range(60):  # the API server restarting: the client tries again, as kubectl would be rerun
                    try:
                        rest.create(VOLCANO_JOB, self.namespace, body)
                        break
                    except ApiException as exc:
                        if exc.status == 409:
                            break
                        create_failures.append(f"{name}: {exc.status} {exc.reason}: {str(exc.body)[:300]}")
                        if exc.status not in (429, 500, 502, 503, 504):  # refused: trying again changes nothing
                            result.problems.append(f"Job {name} refused: {exc.status} {str(exc.body)[:500]}")
                            break
                    except Exception as exc:  # connection refused while it restarts
                        create_failures.append(f"{name}: {type(exc).__name__}")
                    time.sleep(min(0.5 * (attempt + 1), 2.0))
                submitted[name] = time.monotonic()

            # A create waits for the Job's admission (Volcano's webhooks, and ours when installed): one
            # client creating each Job once the last was answered fell to 7.3 jobs a second in two storms
            # with the product, where the storm is to keep its rate whatever the API server answers.
            with ThreadPoolExecutor(SUBMITTERS, thread_name_prefix="storm-submit") as submitters:
                creates = []
                for i in range(self.jobs):
                    due = started + i / self.rate
                    time.sleep(max(0.0, due - time.monotonic()))
                    name = f"storm-{i:05d}"
                    body = storm_job(name, plugin_set_of(i, self.plugin_sets), self.namespace, self.pods_per_job, held=self.held)
                    if i == 2 and self.probe:
                        probe = self._probe(rest, admin)
                    creates.append(submitters.submit(create, name, body))
                for done_create in creates:
                    done_create.result()
            submit_end = time.monotonic()

            def done() -> bool:
                return watch.running_count() >= expected_pods

            try:
                wait_until(done, self.timeout, f"{expected_pods} Pods Running", interval=0.5)
            except AssertionError as exc:
                result.problems.append(f"{exc} ({watch.running_count()} Running, {len(watch.first_seen)} seen)")
            finished = time.monotonic()
        finally:
            stop_faults.set()
            if probe is not None:
                probe.stop()
            fault_thread.join(timeout=120)
            scraper.stop()
            watch.stop()
        self.envtest.wait_ready(300)  # a restarted API server may still be coming back
        if usage is not None:
            usage.sample()
        load_after = os.getloadavg()
        self._figures(result, watch, scraper, usage, host, started, submit_end, finished, submitted, expected_pods)
        if probe is not None:
            result.figures.update(probe.figures())
        result.figures["job_create_retries"] = len(create_failures)
        result.figures["load_average_before_after"] = f"{load_before[0]:.1f} / {load_after[0]:.1f}"
        if create_failures:
            result.events.append(f"job creates retried: {create_failures[:5]}{' ...' if len(create_failures) > 5 else ''}")
        self._check(result, watch, admin)
        return result

    def _probe(self, rest: Rest, admin: client.ApiClient) -> AdmissionProbe:
        """Each Pod webhook asked about a Pod of the storm's second job (a torchrun job: our chain
        patches it), beside the API server."""
        name = "storm-00001"
        job_obj = rest.get(VOLCANO_JOB, self.namespace, name)
        assert job_obj is not None
        pod = make_pod(Job.from_object(job_obj), "worker", 1)
        pod["metadata"].update(name=f"{name}-worker-1", namespace=self.namespace, ownerReferences=[job_owner(job_obj)])
        review = admission_review(pod, uid="00000000-0000-4000-8000-000000000040")
        return AdmissionProbe(probe_targets(admin, self.product), json.dumps(review).encode()).start()

    def _faults(self, started: float, result: StormResult, stop: threading.Event) -> None:
        """Each fault at its time, a repeated one again and again, until the storm ends."""
        pending = sorted((f.at, i, f) for i, f in enumerate(self.faults))
        while pending:
            at, i, fault = pending.pop(0)
            if stop.wait(max(0.0, started + at - time.monotonic())):
                return
            try:
                what = fault.action()
            except Exception as exc:  # recorded: the storm goes on, and the figures say what happened
                what = f"failed: {type(exc).__name__}: {exc}"
            result.events.append(f"{time.monotonic() - started:.1f} s: {fault.name}: {what}")
            if fault.every is not None:
                pending.append((at + fault.every, i, fault))
                pending.sort(key=lambda p: (p[0], p[1]))

    def _figures(self, result: StormResult, watch: PodWatch, scraper: Scraper, usage: ProductUsage | None, host: HostUsage,
                 started: float, submit_end: float, finished: float, submitted: Mapping[str, float], expected_pods: int) -> None:
        f = result.figures
        f["jobs"] = self.jobs
        f["pods_expected"] = expected_pods
        f["pods_seen"] = len(watch.first_seen)
        f["pods_running"] = watch.running_count()
        f["pods_started_in_init"] = len(watch.in_init)
        f["pods_on_hollow_nodes"] = sum(1 for uid in watch.running if watch.pods[uid].node.startswith("hollow-"))
        f["submit_rate_jobs_s"] = (len(submitted) - 1) / (submit_end - started) if len(submitted) > 1 else 0.0
        f["storm_s"] = finished - started
        latencies = watch.startup_seconds()
        for q in (50, 90, 99):
            f[f"startup_p{q}_s"] = percentile(latencies, q / 100)
        f["startup_max_s"] = max(latencies, default=None)
        # Where the time goes: the schedulers (created → bound to a node), then the node (→ started).
        for part, seconds in (("to_bound", watch.between(watch.first_seen, watch.bound)), ("bound_to_started", watch.between(watch.bound, watch.running))):
            for q in (50, 99):
                f[f"startup_{part}_p{q}_s"] = percentile(seconds, q / 100)
        # Whether Pods held in init slow the others of their own hollow node (the kubelet) or every Pod
        # (the rest of the cluster): bound → started of the Pods that run, by how many their node holds.
        holding = Counter(watch.pods[uid].node for uid in watch.in_init if uid in watch.pods)
        beside: dict[int, list[float]] = defaultdict(list)
        for uid, at in watch.running.items():
            if uid not in watch.in_init and uid in watch.bound and (record := watch.pods.get(uid)) is not None:
                beside[holding[record.node]].append(at - watch.bound[uid])
        per_node = Counter(watch.pods[uid].node for uid in watch.running if uid in watch.pods)
        f["pods_a_node_min_median_max"] = (min(per_node.values()), percentile(per_node.values(), 0.5), max(per_node.values())) if per_node else None
        f["bound_to_started_p50_p99_s_by_pods_in_init_on_the_node"] = p50_p99_count(beside)
        by_set: dict[str, list[float]] = defaultdict(list)
        for uid, at in watch.running.items():
            record, seen = watch.pods.get(uid), watch.first_seen.get(uid)
            if record is not None and seen is not None and record.job.startswith("storm-"):
                key = plugin_set_of(int(record.job.removeprefix("storm-")), self.plugin_sets) + (" (held in init)" if uid in watch.in_init else "")
                by_set[key].append(at - seen)
        f["startup_p50_p99_s_by_plugin_set"] = p50_p99_count(by_set)
        created = list(watch.first_seen.values())
        f["pod_creation_rate_s"] = rate(created)
        f["pod_creation_peak_10s_rate_s"] = peak_rate(created, 10.0)
        f["first_pod_after_first_job_s"] = (min(created) - started) if created else None
        f["last_running_after_last_job_s"] = (max(watch.running.values()) - submit_end) if watch.running else None
        snapshots = [s for _, s in scraper.snapshots]
        grown = increase(snapshots)
        for label, names in (("ours", OURS), ("volcano_mutatepod", VOLCANOS[:1]), ("volcano_validatepod", VOLCANOS[1:])):
            histogram = buckets(grown, ADMISSION_HISTOGRAM, named(names))
            f[f"admission_{label}_calls"] = histogram[max(histogram)] if histogram else 0
            for q in (50, 99):
                value = histogram_quantile(q / 100, histogram)
                f[f"admission_{label}_p{q}_ms"] = value * 1000 if value is not None else None
            windows = windowed_quantiles(scraper.snapshots, ADMISSION_HISTOGRAM, named(names), 0.99, 10.0)
            result.windows[label] = [(at - started, calls, value) for at, calls, value in windows]
            f[f"admission_{label}_peak_window_p99_ms"] = max((v for _, _, v in windows), default=0.0) * 1000 or None
        by_name: dict[str, float] = defaultdict(float)
        for (name, pairs), value in grown.items():
            if name == REJECTIONS:
                by_name[dict(pairs).get("name", "")] += value
        f["refused_by_ours"] = sum(v for n, v in by_name.items() if n in OURS or n.endswith(".volcano-job-webhook.io"))
        f["refused_by_volcano"] = sum(v for n, v in by_name.items() if n.endswith(".volcano.sh"))
        f["refusals_by_webhook_and_type"] = {f"{dict(p).get('name')} {dict(p).get('error_type')} {dict(p).get('rejection_code')}": v
                                             for (n, p), v in grown.items() if n == REJECTIONS and v}
        requests = api_requests(grown)
        f["api_requests"] = sum(requests.values())
        f["api_requests_by_verb_and_resource"] = dict(list(requests.items())[:20])
        f["metrics_reads"] = len(scraper.snapshots)
        f["metrics_reads_failed"] = scraper.failures
        if usage is not None:
            for container, row in usage.totals().items():
                for key, value in row.items():
                    f[f"{container}_{key}"] = value
            f.update(usage.served_figures())
        for name, row in host.totals().items():
            for key, value in row.items():
                f[f"host_{name}_{key}"] = value

    def _check(self, result: StormResult, watch: PodWatch, admin: client.ApiClient) -> None:
        """Every job has its Pods, each Running on a hollow node; wiring against ``mutate --cluster``."""
        rest = Rest(admin)
        jobs = {j["metadata"]["name"]: j for j in rest.call("GET", VOLCANO_JOB.path(self.namespace))["items"]}
        by_job: dict[str, list[PodRecord]] = defaultdict(list)
        for uid, record in watch.pods.items():
            if uid not in watch.deleted:
                by_job[record.job].append(record)
        short = {name: len(by_job.get(name, [])) for name in jobs if len(by_job.get(name, [])) < self.pods_per_job}
        if short:
            result.problems.append(f"{len(short)} jobs with fewer than {self.pods_per_job} Pods: {dict(list(short.items())[:5])}")
        not_running = [r.key[1] for rs in by_job.values() for r in rs if r.uid not in watch.running]
        if not_running:
            result.problems.append(f"{len(not_running)} Pods never seen started: {not_running[:5]}")
        elsewhere = [r.key[1] for rs in by_job.values() for r in rs if r.node and not r.node.startswith("hollow-")]
        if elsewhere:
            result.problems.append(f"{len(elsewhere)} Pods not on a hollow node: {elsewhere[:5]}")
        phases: dict[str, int] = defaultdict(int)
        for job in jobs.values():
            phases[((job.get("status") or {}).get("state") or {}).get("phase") or "none"] += 1
        result.figures["job_phases"] = dict(phases)
        if not self.product:
            return
        expected = Expected()
        rng = random.Random(self.seed)
        checked = mismatched = 0
        first_of_set: dict[str, tuple[Obj, str, int, dict[str, Any]]] = {}
        for name, records in sorted(by_job.items()):
            job = jobs.get(name)
            if job is None or not records:
                continue
            for record in records if self.check_all else [rng.choice(records)]:
                task, index = task_and_index(record.key[1], name)
                want = wiring(expected.pod(job, task, index))
                checked += 1
                if record.wiring != want:
                    mismatched += 1
                    if mismatched <= 3:
                        result.problems.append(f"Pod {record.key[1]} wired otherwise than mutate --cluster says: "
                                               f"{json.dumps(record.wiring)[:1500]} != {json.dumps(want)[:1500]}")
                first_of_set.setdefault((job["metadata"].get("labels") or {}).get("vjw-storm/plugin-set", ""), (job, task, index, want))
        result.figures["wiring_checked"] = checked
        result.figures["wiring_mismatched"] = mismatched
        if self.workdir is not None:  # the command itself, once a plugin set
            for plugin_set, (job, task, index, want) in sorted(first_of_set.items()):
                said = wiring(mutate_command(job, task, index, self.workdir))
                if said != want:
                    result.problems.append(f"{plugin_set}: `mutate --cluster` says {said}, the storm's chain {want}")
            result.figures["wiring_command_runs"] = len(first_of_set)
        # Side objects: ours as `resources --cluster` says, and Volcano's svc's (its ConfigMap and Service) by name.
        present = present_objects(admin, self.namespace)
        missing = []
        for name, job in jobs.items():
            want_objects = set(expected.resources(job))
            if "svc" in (job["spec"].get("plugins") or {}):
                want_objects |= {("ConfigMap", f"{name}-svc"), ("Service", name)}
            missing += [f"{name}: {k} {n}" for k, n in sorted(want_objects - present)]
        result.figures["side_objects_missing"] = len(missing)
        if missing:
            result.problems.append(f"{len(missing)} side objects missing: {missing[:5]}")


SIDE_KINDS = (("ConfigMap", "/api/v1", "configmaps"), ("Service", "/api/v1", "services"), ("Secret", "/api/v1", "secrets"),
              ("NetworkPolicy", "/apis/networking.k8s.io/v1", "networkpolicies"))


def present_objects(api: client.ApiClient, namespace: str) -> set[tuple[str, str]]:
    """``(kind, name)`` of every ConfigMap, Service, Secret and NetworkPolicy of the namespace."""
    return {(kind, o["metadata"]["name"]) for kind, base, plural in SIDE_KINDS
            for o in request(api, "GET", f"{base}/namespaces/{namespace}/{plural}")["items"]}


def empty_namespace(api: client.ApiClient, namespace: str, timeout: float = 300.0) -> float:
    """Delete the storm's Jobs, then its Pods at once (grace 0: the hollow nodes need not confirm),
    then the namespace; return the seconds until it is gone."""
    started = time.monotonic()
    jobs = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{namespace}/jobs"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        request(api, "DELETE", jobs)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def no_pods() -> bool:
        left = request(api, "GET", pods, query=[("limit", "1")])["items"]
        if left:
            request(api, "DELETE", pods, query=[("gracePeriodSeconds", "0")])
        return not left and not request(api, "GET", jobs, query=[("limit", "1")])["items"]

    wait_until(no_pods, timeout, f"the Pods and Jobs of {namespace} deleted", interval=2.0)
    try:
        request(api, "DELETE", f"/api/v1/namespaces/{namespace}")
    except ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            request(api, "GET", f"/api/v1/namespaces/{namespace}")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout, f"namespace {namespace} gone", interval=1.0)
    return time.monotonic() - started
