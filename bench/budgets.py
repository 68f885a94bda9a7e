"""Size budgets at 10^9 replicas: ``python bench/budgets.py`` (``--quick`` for a short run).

For each plugin, a job of one master (head) and 10^9 workers, in a fresh process per plugin:

* ``check``: ``Chain().check`` of a Job object never seen before (what ``/validate`` does);
* ``cold``: ``Chain().mutate`` of the master Pod of a Job object never seen before (the first Pod of
  a job: plugins built and checked, then the Pod wired or refused);
* ``warm``: master and worker Pods of a job already prepared (every further Pod; a refused job is
  prepared again for each, as the webhook's job cache keeps only prepared jobs);
* extra resident memory: the process's peak RSS after all of that, less its RSS before the first
  job was built (``VmHWM`` and ``VmRSS`` from ``/proc/self/status``).

A refusal (svc's host files, 24.9 GB against the 32 MiB it writes per Pod) is an answer like any other: it
is timed the same way, and the table says which plugin answered. Since svc refuses first for every
plugin that brings it in, a second table runs each plugin on its own (its class, no svc in front):
``check`` then ``mutate`` of the master and of the last worker, a new instance each round, so each
plugin's own budget (mpi leaves MPI_HOST out, tensorflow and hostfile refuse) is what is timed. Targets: under 10 ms per Pod and
under 20 MB of extra RSS. Before the budgets, the mpi master Pod of this job took 38 s and 7.5 GB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from volcano_job_webhook.plugins import (
    Chain,
    Job,
    PluginError,
    PodContext,
    default_registry,
)
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.registry import BUILTINS

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = tuple(BUILTINS)
ARGS = {"waitfor": ["--tasks=worker"]}
REPLICAS = 10**9
TARGET_MS = 10.0
TARGET_MB = 20.0


def job_object(plugin: str) -> dict[str, Any]:
    first = "head" if plugin == "ray" else "master"
    container = {"name": first if plugin == "ray" else "main", "image": "busybox:1.36.1"}
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "big", "namespace": "default", "uid": "uid-big"},
        "spec": {"plugins": {plugin: ARGS.get(plugin, [])}, "tasks": [
            {"name": first, "replicas": 1, "template": {"spec": {"containers": [container]}}},
            {"name": "worker", "replicas": REPLICAS, "template": {"spec": {"containers": [dict(container, name="worker")]}}},
        ]},
    }


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def answer(call: Any) -> str:
    """``ok``, ``ok+warning`` or ``refused by <plugin>``."""
    try:
        result = call()
    except PluginError as exc:
        return f"refused by {exc.plugin or 'the chain'}"
    warnings = result if isinstance(result, list) else result.warnings
    return "ok, warned" if warnings else "ok"


def timed(call: Any, rounds: int) -> float:
    """Median milliseconds of ``call`` (refusals included)."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        try:
            call()
        except PluginError:
            pass
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def measure(plugin: str, rounds: int) -> dict[str, Any]:
    raw = job_object(plugin)
    first = raw["spec"]["tasks"][0]["name"]
    chain = Chain()
    pods = {task: make_pod(Job.from_object(raw), task, index) for task, index in ((first, 0), ("worker", REPLICAS - 1))}
    before = rss_kb("VmRSS")

    check_ms = timed(lambda: chain.check(Job.from_object(raw)), rounds)
    cold_ms = timed(lambda: Chain().mutate(Job.from_object(raw), pods[first]), rounds)
    job = Job.from_object(raw)
    try:
        wire = chain.prepare(job).mutate  # once per job, as the webhook's job cache does
    except PluginError:
        def wire(pod: dict[str, Any]) -> Any:  # a refused job is prepared, and refused, for every Pod
            return chain.mutate(job, pod)
    warm_ms = {task: timed(lambda pod=pod: wire(pod), rounds) for task, pod in pods.items()}
    extra_mb = (rss_kb("VmHWM") - before) / 1024
    return {
        "plugin": plugin,
        "answer": {"check": answer(lambda: chain.check(job)), "master": answer(lambda: wire(pods[first])),
                   "worker": answer(lambda: wire(pods["worker"]))},
        "check_ms": check_ms,
        "cold_mutate_ms": cold_ms,
        "warm_mutate_ms": warm_ms,
        "extra_rss_mb": extra_mb,
    }


def measure_alone(plugin: str, rounds: int) -> dict[str, Any]:
    raw = job_object(plugin)
    first = raw["spec"]["tasks"][0]["name"]
    cls = default_registry().get(plugin)
    assert cls is not None
    job = Job.from_object(raw)
    pods = {task: make_pod(job, task, index) for task, index in ((first, 0), ("worker", REPLICAS - 1))}
    before = rss_kb("VmRSS")

    def run(task: str | None) -> list[str]:
        instance = cls(job, ARGS.get(plugin, []))
        if task is None:
            return instance.check()
        found = job.task(task)
        assert found is not None
        ctx = PodContext(job=job, pod=json.loads(json.dumps(pods[task])), task=found)
        instance.mutate(ctx)
        return ctx.warnings

    ms = {label: timed(lambda task=task: run(task), rounds) for label, task in (("check", None), ("master", first), ("worker", "worker"))}
    return {
        "plugin": plugin,
        "ms": ms,
        "answer": {label: answer(lambda task=task: run(task)) for label, task in (("check", None), ("master", first), ("worker", "worker"))},
        "extra_rss_mb": (rss_kb("VmHWM") - before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the per-plugin child process
    parser.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = 5 if args.quick else 30
    if args.one:
        print(json.dumps(measure_alone(args.one, rounds) if args.alone else measure(args.one, rounds)))
        return

    def child(plugin: str, *extra: str) -> dict[str, Any]:
        command = [sys.executable, __file__, "--one", plugin, *extra, *(["--quick"] if args.quick else [])]
        return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

    rows = [child(plugin) for plugin in PLUGINS]
    alone = [child(plugin, "--alone") for plugin in PLUGINS]
    lines = [
        f"job: 1 master (ray: head) + {REPLICAS:,} workers; median of {rounds} rounds; one process per plugin",
        "",
        "| plugin | check ms | first Pod ms (cold) | master ms | worker ms | extra RSS MB | master Pod | worker Pod |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst_ms = worst_mb = 0.0
    for row in rows:
        warm = row["warm_mutate_ms"]
        worst_ms = max(worst_ms, row["check_ms"], row["cold_mutate_ms"], *warm.values())
        worst_mb = max(worst_mb, row["extra_rss_mb"])
        master = next(iter(warm))
        lines.append(
            f"| {row['plugin']} | {row['check_ms']:.3f} | {row['cold_mutate_ms']:.3f} | {warm[master]:.3f} | "
            f"{warm['worker']:.3f} | {row['extra_rss_mb']:.1f} | {row['answer']['master']} | {row['answer']['worker']} |"
        )
    lines += [
        "",
        "Each plugin on its own (no svc in front), a new instance per call:",
        "",
        "| plugin | check ms | master ms | worker ms | extra RSS MB | check | master Pod | worker Pod |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in alone:
        ms, said = row["ms"], row["answer"]
        worst_ms = max(worst_ms, *ms.values())
        worst_mb = max(worst_mb, row["extra_rss_mb"])
        lines.append(
            f"| {row['plugin']} | {ms['check']:.3f} | {ms['master']:.3f} | {ms['worker']:.3f} | {row['extra_rss_mb']:.1f} | "
            f"{said['check']} | {said['master']} | {said['worker']} |"
        )
    lines += [
        "",
        f"- {'met' if worst_ms < TARGET_MS else 'MISSED'}: under {TARGET_MS:.0f} ms per Pod and per check (worst {worst_ms:.3f} ms)",
        f"- {'met' if worst_mb < TARGET_MB else 'MISSED'}: under {TARGET_MB:.0f} MB extra RSS (worst {worst_mb:.1f} MB)",
    ]
    text = "\n".join(lines)
    print(text)
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "budgets.json").write_text(json.dumps({"chain": rows, "alone": alone}, indent=2))
    (results / "budgets.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
