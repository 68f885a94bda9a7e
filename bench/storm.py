"""Volcano's Pod storm through the webhook on hollow nodes (issue #40): ``python bench/storm.py``, as root
with the node's parts and kubemark (``KUBEBUILDER_ASSETS``, ``KUBE_NODE_ASSETS``, ``VOLCANO_CONTROLLER``,
``VOLCANO_SCHEDULER``, ``VOLCANO_ADMISSION``, ``COREDNS``, ``KUBEMARK``: .ci/run sets them from the cache).

On the one-node cluster of tests/on_node (tests/helpers/node.py: real API server, etcd, controller
manager, scheduler, kubelet, containerd, kube-proxy, CoreDNS) with a whole Volcano (its scheduler,
controllers and admission, registered as its chart registers it; its admission placed in cgroups like
our webhook's Pod, see :data:`POD_LIKE`), ``--hollow`` hollow nodes (kubemark, tests/helpers/hollow.py,
standing for other machines: at the lowest CPU priority, or ``--priority own-core`` on a core of their
own) take the jobs' Pods. Storms one after the
other (``--runs``), each on an empty cluster (the previous storm's namespace deleted, the hollow nodes
started afresh, the machine let settle), each ``--jobs`` Volcano Jobs of 8 Pods at ``--rate`` jobs a
second with the example jobs' plugin sets (tests/helpers/storm.py):

- ``without``: the product not installed;
- ``with``: the product installed by its chart as docs/install.md installs it (the image built by
  tests/programs/test_image.py, imported into the node);
- ``placebo``: not installed, and a process spending the CPU the product spent in ``with`` where
  the product's Pods run: what of the difference is CPU on these two shared cores;
- ``faults``: installed, and during the storm a webhook Pod evicted every 30 s (the Eviction API:
  the chart's PodDisruptionBudget may refuse it), the reconciler's leader killed once (SIGKILL), the
  API server restarted once.

For each: Pod start-up latency (first seen by a watch → seen Running) p50/p90/p99; the API server's
``apiserver_admission_webhook_admission_duration_seconds`` p50/p99 for our Pod webhook and Volcano's
two, over the storm and in its worst 10 s; Volcano's Pod creation rate; refusals by webhook; the
product's containers' CPU seconds, throttling, time waiting for a CPU and peak memory (the node's
cgroups), and the host processes' (API server, etcd, Volcano, the hollow nodes, this process); the
wiring of one Pod of every job against ``volcano-webhook mutate --cluster``. Then a table with each
target of docs/benchmarks.md ("A storm on hollow nodes"), and every figure in
``bench/results/storm.json``. Run it alone on the machine (``flock /tmp/heavy.lock``): on two cores,
anything else running moves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import node as node_module  # noqa: E402
from tests.helpers.cluster import volcano_missing, whole_volcano  # noqa: E402
from tests.helpers.helm import CHART  # noqa: E402
from tests.helpers.hollow import PRIORITIES, HollowNodes, find_kubemark, kubemark_missing  # noqa: E402
from tests.helpers.node import Node  # noqa: E402
from tests.helpers.storm import (  # noqa: E402
    PLUGIN_SETS,
    Fault,
    Storm,
    StormResult,
    container_pids,
    controller_root,
    empty_namespace,
    evict_webhook_pod,
    kill_reconciler_leader,
    webhook_pods,
)
from tests.on_node.conftest import COREDNS_ENV, Cluster, install, uninstall  # noqa: E402
from tests.programs.test_image import TAG  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def log(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def missing() -> str | None:
    reasons = [node_module.missing(), volcano_missing(), kubemark_missing()]
    if not (os.environ.get(COREDNS_ENV) and os.access(os.environ[COREDNS_ENV], os.X_OK)):
        reasons.append(f"{COREDNS_ENV} is not set to an executable coredns")
    return "; ".join(r for r in reasons if r) or None


def product_image(workdir: Path) -> Path:
    """The image built as tests/test_image.py builds it, as an OCI archive to import into the node."""
    from tests.programs.test_image import build_image

    try:
        build_image()
    except BaseException as exc:  # pytest's skip (no buildah or base) is a BaseException
        raise SystemExit(f"cannot build the image: {exc}") from None
    archive = workdir / "product.oci.tar"
    node_module.run("buildah", "push", "--disable-compression", TAG, f"oci-archive:{archive}:{TAG}", timeout=300)
    return archive


def host_pids(node: Node, volcano: dict[str, Any], hollow: HollowNodes) -> dict[str, list[int]]:
    """The host processes whose CPU the storm is measured against, by name."""
    envtest = node.envtest
    pids: dict[str, list[int]] = {}
    for name, process in (("kube-apiserver", envtest._apiserver), ("etcd", envtest._etcd)):
        if process is not None:
            pids[name] = [process.popen.pid]
    for name in ("kube-controller-manager", "kube-scheduler", "coredns", "kubelet", "containerd"):
        if name in node.processes:
            pids[name] = [node.processes[name].popen.pid]
    for name, process in volcano.items():
        pids[name] = [process.popen.pid]
    pids["hollow-nodes"] = list(hollow.pids())
    pids["bench (watch, metrics, submissions)"] = [os.getpid()]
    return pids


def storm(name: str, cluster: Cluster, hollow: HollowNodes, volcano: dict[str, Any], args: argparse.Namespace, workdir: Path,
          *, product: bool, faults: Callable[[], list[Fault]] | None = None) -> StormResult:
    node = cluster.node
    namespace = cluster.namespace(f"storm-{name}-")
    log(f"storm {name}: {args.jobs} jobs at {args.rate}/s into {namespace}, {args.hollow} hollow nodes")
    run = Storm(node.envtest, namespace, args.jobs, args.rate, product=product,
                cgroup_root=node_cgroup(cluster), timeout=args.timeout,
                faults=faults() if faults else (), host_pids=host_pids(node, volcano, hollow), workdir=workdir,
                plugin_sets=args.sets.split(","), held=args.held and not product)
    result = run.run()
    result.figures["hollow_rss_mib_mean"] = sum(rss := hollow.rss_mib()) / max(len(rss), 1)
    log(f"storm {name}: {json.dumps(result.figures, default=str)}")
    for event in result.events:
        log(f"  {event}")
    for problem in result.problems:
        log(f"  PROBLEM: {problem[:2000]}")
    took = empty_namespace(cluster.admin, namespace, timeout=900)
    log(f"storm {name}: namespace emptied in {took:.0f} s; hollow nodes started afresh")
    hollow.restart(cluster.admin, timeout=300)
    log(f"storm {name}: the machine settled in {settle():.0f} s")
    return result


def idle_share(seconds: float) -> float:
    """The share of the machine's CPU time idle over the next ``seconds`` (``/proc/stat``)."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle, total = sample()
    time.sleep(seconds)
    idle2, total2 = sample()
    return (idle2 - idle) / max(total2 - total, 1)


def settle(timeout: float = 300.0, idle: float = 0.5, window: float = 10.0) -> float:
    """Wait until the machine is at least ``idle`` idle over ``window`` seconds (the previous storm's
    clean-up and 50 kubelets registering again keep two cores busy for a minute or more, and a storm
    started then is measured against them); returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout and idle_share(window) < idle:
        pass
    return time.monotonic() - started


def product_cpu_rate(results: dict[str, StormResult]) -> float:
    """CPU seconds a second the product's containers spent in the 'with' storm."""
    if "with" not in results:
        raise SystemExit("the placebo storm needs the 'with' storm before it, or --placebo-rate")
    f = results["with"].figures
    return (f.get("webhook_cpu_seconds", 0) + f.get("reconciler_cpu_seconds", 0)) / f["storm_s"]


def ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


def mark(ok: bool | None) -> str:
    return "—" if ok is None else "met" if ok else "**missed**"


def table(results: dict[str, StormResult]) -> list[str]:
    """The figures side by side, then each target."""
    runs = list(results)
    rows: list[tuple[str, str, int]] = [
        ("Pods Running / expected", "pods_running", 0), ("Pods on hollow nodes", "pods_on_hollow_nodes", 0),
        ("storm (first job → last Pod Running), s", "storm_s", 1), ("jobs submitted a second", "submit_rate_jobs_s", 2),
        ("Pod start-up p50, s", "startup_p50_s", 2), ("Pod start-up p90, s", "startup_p90_s", 2),
        ("Pod start-up p99, s", "startup_p99_s", 2), ("Pod start-up max, s", "startup_max_s", 2),
        ("… created → bound to a node p50, s", "startup_to_bound_p50_s", 2), ("… p99, s", "startup_to_bound_p99_s", 2),
        ("… bound → started p50, s", "startup_bound_to_started_p50_s", 2), ("… p99, s", "startup_bound_to_started_p99_s", 2),
        ("hollow nodes waiting for a CPU, s (all)", "host_hollow-nodes_waiting_seconds", 0),
        ("API server requests (storm.json: by verb and resource)", "api_requests", 0),
        ("Volcano's Pod creation rate, Pods/s", "pod_creation_rate_s", 1), ("… its busiest 10 s, Pods/s", "pod_creation_peak_10s_rate_s", 1),
        ("our Pod webhook: calls", "admission_ours_calls", 0), ("… p50, ms", "admission_ours_p50_ms", 1), ("… p99, ms", "admission_ours_p99_ms", 0),
        ("… p99 in its worst 10 s, ms", "admission_ours_peak_window_p99_ms", 0),
        ("Volcano's mutatepod: p50, ms", "admission_volcano_mutatepod_p50_ms", 1), ("… p99, ms", "admission_volcano_mutatepod_p99_ms", 0),
        ("… p99 in its worst 10 s, ms", "admission_volcano_mutatepod_peak_window_p99_ms", 0),
        ("Volcano's validatepod: p50, ms", "admission_volcano_validatepod_p50_ms", 1), ("… p99, ms", "admission_volcano_validatepod_p99_ms", 0),
        ("asked directly (a storm Pod every 1 s): ours p50, ms", "probe_ours_p50_ms", 1), ("… p99, ms", "probe_ours_p99_ms", 0),
        ("… Volcano's mutatepod p50, ms", "probe_volcano_mutatepod_p50_ms", 1), ("… p99, ms", "probe_volcano_mutatepod_p99_ms", 0),
        ("our /mutate inside the process: p50, ms", "webhook_inside_p50_ms", 2), ("… p99, ms", "webhook_inside_p99_ms", 0),
        ("connections our webhook accepted", "webhook_connections_accepted", 0),
        ("refused by our webhooks", "refused_by_ours", 0), ("refused by Volcano's", "refused_by_volcano", 0),
        ("Pods wired as `mutate --cluster` says (one a job)", "wiring_checked", 0), ("… not", "wiring_mismatched", 0),
        ("side objects missing", "side_objects_missing", 0),
        ("webhook CPU s (all replicas)", "webhook_cpu_seconds", 1), ("webhook waiting for a CPU, s", "webhook_waiting_seconds", 1),
        ("webhook throttled periods / periods", "webhook_throttled_periods", 0), ("webhook peak RSS, MiB", "webhook_rss_peak_mib", 0),
        ("webhook peak cgroup memory, MiB", "webhook_memory_peak_mib", 0),
        ("reconciler CPU s", "reconciler_cpu_seconds", 1), ("reconciler peak RSS, MiB", "reconciler_rss_peak_mib", 0),
        ("vc-webhook-manager CPU s", "host_vc-webhook-manager_cpu_seconds", 1),
        ("vc-webhook-manager waiting for a CPU, s", "host_vc-webhook-manager_waiting_seconds", 1),
        ("kube-apiserver CPU s", "host_kube-apiserver_cpu_seconds", 1), ("etcd CPU s", "host_etcd_cpu_seconds", 1),
        ("vc-controller-manager CPU s", "host_vc-controller-manager_cpu_seconds", 1), ("vc-scheduler CPU s", "host_vc-scheduler_cpu_seconds", 1),
        ("hollow nodes CPU s (all)", "host_hollow-nodes_cpu_seconds", 1), ("hollow node RSS, MiB (mean)", "hollow_rss_mib_mean", 0),
        ("this bench's CPU s", "host_bench (watch, metrics, submissions)_cpu_seconds", 1),
        ("load average before / after", "load_average_before_after", 0),
    ]
    out = ["| | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for label, key, digits in rows:
        cells = []
        for run in runs:
            value = results[run].figures.get(key)
            if key == "pods_running":
                value = f"{value} / {results[run].figures.get('pods_expected')}"
            elif key == "webhook_throttled_periods" and value is not None:
                value = f"{value:.0f} / {results[run].figures.get('webhook_periods', 0):.0f}"
            cells.append(fmt(value, digits=digits))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    w, wo, fa = (results.get(k) for k in ("with", "without", "faults"))
    targets: list[tuple[str, str, bool | None]] = []
    if w and wo:
        p99 = ratio(w.figures.get("startup_p99_s"), wo.figures.get("startup_p99_s"))
        targets.append(("Pod start-up p99 with ≤ 1.05 × without", fmt(p99, " ×", 2), p99 is not None and p99 <= 1.05))
        slo = (wo.figures.get("startup_p99_s") or 99) <= 5
        targets.append(("Pod start-up p99 with ≤ 5 s (where the run without meets it)", fmt(w.figures.get("startup_p99_s"), " s", 2),
                        (w.figures.get("startup_p99_s") or 99) <= 5 if slo else None))
        created = ratio(w.figures.get("pod_creation_rate_s"), wo.figures.get("pod_creation_rate_s"))
        targets.append(("Volcano's Pod creation rate with ≥ 0.95 × without", fmt(created, " ×", 2), created is not None and created >= 0.95))
    pl = results.get("placebo")
    if w and pl:
        p99 = ratio(w.figures.get("startup_p99_s"), pl.figures.get("startup_p99_s"))
        targets.append(("(not a target) start-up p99 with ÷ placebo: what is left of the product's cost once its CPU is paid",
                        fmt(p99, " ×", 2), None))
    if w:
        f = w.figures
        peak = f.get("admission_ours_peak_window_p99_ms")
        targets.append(("our admission p99 ≤ 50 ms at the storm's peak (worst 10 s)", fmt(peak, " ms"), peak is not None and peak <= 50))
        for q in (50, 99):
            ours, theirs = f.get(f"admission_ours_p{q}_ms"), f.get(f"admission_volcano_mutatepod_p{q}_ms")
            targets.append((f"our admission p{q} ≤ Volcano's mutatepod p{q}", f"{fmt(ours, ' ms', 1)} vs {fmt(theirs, ' ms', 1)}",
                            ours is not None and theirs is not None and ours <= theirs))
        targets.append(("0 Pods refused by ours", fmt(f.get("refused_by_ours")), f.get("refused_by_ours") == 0))
        targets.append(("every sampled Pod wired", f"{fmt(f.get('wiring_checked'))} checked, {fmt(f.get('wiring_mismatched'))} not",
                        f.get("wiring_mismatched") == 0 and bool(f.get("wiring_checked"))))
        targets.append(("webhook memory inside the chart's limit (512 MiB)", fmt(f.get("webhook_memory_peak_mib"), " MiB"),
                        (f.get("webhook_memory_peak_mib") or 0) <= 512))
    if fa and w:
        f = fa.figures
        targets.append(("faults: 0 Pods refused by ours", fmt(f.get("refused_by_ours")), f.get("refused_by_ours") == 0))
        targets.append(("faults: every job's Pods Running", f"{f.get('pods_running')} / {f.get('pods_expected')}",
                        f.get("pods_running") == f.get("pods_expected")))
        targets.append(("faults: no job missing a side object", fmt(f.get("side_objects_missing")), f.get("side_objects_missing") == 0))
        p99 = ratio(f.get("startup_p99_s"), w.figures.get("startup_p99_s"))
        targets.append(("faults: start-up p99 ≤ 2 × the quiet run's", fmt(p99, " ×", 2), p99 is not None and p99 <= 2))
    out += ["", "| target | result | |", "|---|---|---|"]
    out += [f"| {what} | {value} | {mark(ok)} |" for what, value, ok in targets]
    return out


def save(args: argparse.Namespace, timings: dict[str, float], results: dict[str, StormResult]) -> None:
    """Every figure so far in ``bench/results/storm.json`` (after each storm: a later one may fail)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"args": vars(args), "timings": timings, "runs": {run: {"figures": r.figures, "events": r.events, "problems": r.problems,
                                                                   "windows": r.windows} for run, r in results.items()}}
    (RESULTS / "storm.json").write_text(json.dumps(out, indent=1, default=str))


def node_cgroup(cluster: Cluster) -> str:
    """kubelet's cgroupRoot on the node, under which its Pods' cgroups are ("" when it made none)."""
    return cluster.node.footprint.cgroup if cluster.node.footprint else ""


def profile_plan(cluster: Cluster, seconds: float, out: Path) -> list[Fault]:
    """py-spy on each webhook replica's process for ``seconds`` from 10 s into the storm (sampling without
    stopping it, 100 a second): flame graph data in ``out``/profile-POD.txt (collapsed stacks)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

    def start() -> str:
        started = []
        for pod in webhook_pods(cluster.admin):
            for pid in container_pids(pod, "webhook", node_cgroup(cluster))[:1]:
                target = out / f"profile-{pod['metadata']['name']}.txt"
                subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100", "--nonblocking", "--gil",
                                  "--format", "raw", "--output", str(target)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                started.append(f"{pod['metadata']['name']} ({pid})")
        return f"py-spy on {', '.join(started)} for {seconds:.0f} s"

    return [Fault("profile", 10.0, start)]


def top_frames(path: Path, count: int = 25) -> list[str]:
    """The functions most often on the stack (cumulative) and at its top (self) in a collapsed-stack file."""
    total = 0
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        samples = int(n)
        total += samples
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + samples
        own[frames[-1]] = own.get(frames[-1], 0) + samples
    rows = [f"{total} samples"]
    rows += [f"self {n / total:6.1%}  {f}" for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:count]]
    rows += [f"incl {n / total:6.1%}  {f}" for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:count]]
    return rows


# Volcano's admission placed as a Pod of the node would be: a cgroup beside our webhook's Pods in the
# node's kubepods/burstable, with our webhook's request and limit (cpu.shares 153 for the Pod, 102 and
# a quota of 100 ms a 100 ms period for its container). Both Pod webhooks then meet the same CPU
# scheduling; as host processes Volcano's would outweigh every Pod of the node together. Its name
# holds no "pod", so kubelet's clean-up of orphaned Pod cgroups passes it by.
POD_LIKE = (("volcano-admission", {"cpu.shares": "153", "cpu.cfs_quota_us": "150000"}),
            ("container", {"cpu.shares": "102", "cpu.cfs_quota_us": "100000"}))


def place_like_a_pod(pid: int, node_cgroup: str, name: str = "volcano-admission") -> list[tuple[Path, list[Path]]]:
    """Move process ``pid`` into :data:`POD_LIKE` cgroups under the node's ``kubepods/burstable``
    (cpu and cpuacct); returns each hierarchy's root and the directories made, for :func:`unplace`."""
    made = []
    for controller in ("cpu", "cpuacct"):
        top = controller_root(controller)
        if top is None:
            raise SystemExit("no cgroup v1 cpu hierarchy to place Volcano's admission in")
        path, dirs = top / node_cgroup.lstrip("/") / "kubepods" / "burstable", []
        for level, settings in POD_LIKE:
            path = path / (name if level == POD_LIKE[0][0] else level)
            path.mkdir(exist_ok=True)
            dirs.append(path)
            for key, value in settings.items() if controller == "cpu" else ():
                (path / key).write_text(value)
        (path / "cgroup.procs").write_text(str(pid))
        made.append((top, dirs))
    return made


def unplace(made: list[tuple[Path, list[Path]]]) -> None:
    """What :func:`place_like_a_pod` made undone: its processes back in the root cgroup, its directories removed."""
    for top, dirs in made:
        for path in reversed(dirs):
            for pid in (path / "cgroup.procs").read_text().split() if path.exists() else ():
                try:
                    (top / "cgroup.procs").write_text(pid)
                except OSError:  # gone meanwhile
                    pass
            try:
                path.rmdir()
            except OSError:
                pass


# A process that only spends CPU, at the rate the product spent it in the 'with' storm, where the
# product's Pods run: the 'placebo' storm (without the product) tells what of the start-up latency
# is the product's CPU on these two shared cores (in a cluster, other machines') rather than its work.
BURNER = """
import sys, time
rate, began = float(sys.argv[1]), time.monotonic()
while True:
    while time.process_time() < rate * (time.monotonic() - began):
        pass
    time.sleep(0.01)
"""


@dataclass
class Placebo:
    """:data:`BURNER` at ``rate`` CPU seconds a second in the node's ``kubepods/burstable`` (the
    product's weight: its webhook container's shares), from :meth:`start` until :meth:`stop`."""

    rate: float
    node_cgroup: str
    process: subprocess.Popen[bytes] | None = None
    placed: list[tuple[Path, list[Path]]] = field(default_factory=list)

    def start(self) -> str:
        self.process = subprocess.Popen([sys.executable, "-c", BURNER, str(self.rate)])
        self.placed = place_like_a_pod(self.process.pid, self.node_cgroup, "placebo")
        return f"burning {self.rate:.3f} CPU s a second"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        unplace(self.placed)


def fault_plan(cluster: Cluster, args: argparse.Namespace) -> Callable[[], list[Fault]]:
    submit = args.jobs / args.rate
    cgroup_root = node_cgroup(cluster)

    def plan() -> list[Fault]:
        return [
            Fault("a webhook Pod evicted", 15.0, lambda: evict_webhook_pod(cluster.admin), every=30.0),
            Fault("the reconciler's leader killed", submit * 0.35, lambda: kill_reconciler_leader(cluster.admin, cgroup_root)),
            Fault("the API server restarted", submit * 0.6, lambda: f"ready again in {cluster.node.envtest.restart_apiserver(timeout=300):.1f} s"),
        ]

    return plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hollow", type=int, default=50, help="hollow nodes")
    parser.add_argument("--jobs", type=int, default=1000, help="Volcano Jobs of 8 Pods a storm")
    parser.add_argument("--rate", type=float, default=10.0, help="jobs submitted a second")
    parser.add_argument("--runs", default="with,placebo,without,faults", help="which storms, in order")
    parser.add_argument("--priority", choices=PRIORITIES, default="nice", help="the hollow nodes' CPU priority, or own-core: the last core theirs")
    parser.add_argument("--sets", default=",".join(PLUGIN_SETS), help="the plugin sets the jobs take in turn")
    parser.add_argument("--volcano-admission-as-a-pod", action=argparse.BooleanOptionalAction, default=True,
                        help="run vc-webhook-manager in cgroups like our webhook's Pod's (its request and limit)")
    parser.add_argument("--placebo-rate", type=float, default=0.0,
                        help="CPU seconds a second the placebo storm burns (default: the product's in the 'with' storm)")
    parser.add_argument("--held", action="store_true",
                        help="without the product, give each waitfor job's master a never-ending init container (waitfor's hold on a hollow node)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a chart value for the product's install (helm's --set), e.g. webhook.resources.requests.cpu=250m")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a storm may take to have every Pod Running")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--profile", type=float, default=0.0,
                        help="seconds of py-spy on each webhook replica in the 'with' storm (pip install py-spy)")
    args = parser.parse_args()
    reason = missing()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    runs = [r for r in args.runs.split(",") if r]
    unknown = set(runs) - {"without", "with", "faults", "placebo"}
    if unknown:
        parser.error(f"unknown runs: {sorted(unknown)}")
    binary = find_kubemark()
    assert binary is not None
    RESULTS.mkdir(parents=True, exist_ok=True)
    for old in RESULTS.glob("profile-*.txt") if args.profile else ():
        old.unlink()
    workdir = Path(tempfile.mkdtemp(prefix="bench-storm-"))
    log(f"work directory {workdir}; load average {os.getloadavg()[0]:.1f}")
    archive = product_image(workdir) if {"with", "faults"} & set(runs) else None
    assets, node_assets = node_module.find_assets(), node_module.find_node_assets()
    assert assets is not None and node_assets is not None
    results: dict[str, StormResult] = {}
    timings: dict[str, float] = {}
    begun = time.monotonic()
    with Node(assets, node_assets, workdir / "node", coredns=Path(os.environ[COREDNS_ENV])) as node:
        timings["node_up_s"] = node.timings["bring_up"]
        if archive is not None:
            node.import_image(archive, base_name=TAG.rpartition(":")[0])
        admin = node.api_client()
        with whole_volcano(admin, node.kubeconfig(), workdir / "volcano") as volcano:
            cluster = Cluster(node, admin, volcano, timings)
            placed = (place_like_a_pod(volcano["vc-webhook-manager"].popen.pid, node_cgroup(cluster))
                      if args.volcano_admission_as_a_pod and node.footprint else [])
            hollow = HollowNodes(binary, node.kubeconfig(), workdir / "hollow", args.hollow, priority=args.priority)
            started = time.monotonic()
            try:
                hollow.start(admin, timeout=max(120.0, args.hollow * 3.0))
                timings["hollow_nodes_ready_s"] = time.monotonic() - started
                log(f"the machine settled in {settle():.0f} s")
                log(f"{args.hollow} hollow nodes Ready in {timings['hollow_nodes_ready_s']:.0f} s, {sum(hollow.rss_mib()) / args.hollow:.0f} MiB each")
                installed = False
                for run in runs:
                    product = run in ("with", "faults")
                    if product and not installed:
                        install(cluster, CHART, *(f"--set={v}" for v in args.set))
                        log(f"installed; the machine settled in {settle():.0f} s")
                        installed = True
                    elif not product and installed:
                        uninstall(cluster)
                        installed = False
                    plan = fault_plan(cluster, args) if run == "faults" else None
                    if run == "with" and args.profile:
                        plan = lambda: profile_plan(cluster, args.profile, RESULTS)  # noqa: E731
                    placebo = Placebo(args.placebo_rate or product_cpu_rate(results), node_cgroup(cluster)) if run == "placebo" else None
                    if placebo is not None:
                        plan = lambda started=placebo.start: [Fault("placebo", 0.0, started)]  # noqa: E731
                    try:
                        results[run] = storm(run, cluster, hollow, volcano, args, workdir, product=product, faults=plan)
                    finally:
                        if placebo is not None:
                            placebo.stop()
                    save(args, timings, results)
                if installed:
                    uninstall(cluster)
            finally:
                hollow.stop(admin)
                unplace(placed)
    timings["total_s"] = time.monotonic() - begun
    lines = table(results)
    print(f"{args.hollow} hollow nodes ({args.priority}), {args.jobs} jobs × 8 Pods at {args.rate:g} jobs/s; "
          f"cluster up {timings['node_up_s']:.0f} s, hollow nodes Ready {timings.get('hollow_nodes_ready_s', 0):.0f} s, all {timings['total_s'] / 60:.0f} min")
    print("\n".join(lines))
    for run, result in results.items():
        for event in result.events:
            print(f"- {run}: {event}")
        for problem in result.problems:
            print(f"- {run}: PROBLEM: {problem[:600]}")
    save(args, timings, results)
    for profile in sorted(RESULTS.glob("profile-*.txt")) if args.profile else []:
        print(f"\n{profile.name}:\n" + "\n".join(top_frames(profile)))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
