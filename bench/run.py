"""The benchmark: ``python bench/run.py`` (``--quick`` for a short run).

Measures, on this machine, and prints a table with every target marked met or missed; the same
figures go to ``bench/results/latest.json`` and the chain's cost to ``bench/results/chain.png``:

1. ``/mutate`` over HTTPS with keep-alive: the real app, one uvicorn worker pinned to core 0, loaded
   by ``wrk`` pinned to core 1, at concurrency 1, 16 and 64, for three Pods (env only; pytorch
   master + 2 workers; svc with 1,000 replicas per task), taking turns with ``/baseline`` (a
   FastAPI route that parses the review and answers allowed) in five rounds: each figure the median
   round, its ratio the median of each round's ratio to the baseline, and the server's CPU time per
   admission (read from /proc);
2. the plugin chain in process: microseconds per Pod (chain and patch) for each plugin as replicas
   grow 1 to 10,000;
3. resident memory of ``serve`` with 10,000 Jobs in its cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from processes import cpu_seconds, pinned, wait_ready  # noqa: E402

from volcano_job_webhook.certs import ensure_certs  # noqa: E402
from volcano_job_webhook.plugins import Chain, Job, PluginError  # noqa: E402
from volcano_job_webhook.plugins.podgen import make_pod  # noqa: E402
from volcano_job_webhook.server.admission import admission_review  # noqa: E402
from volcano_job_webhook.server.patch import make_patch  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REPLICAS = (1, 10, 100, 1_000, 10_000)
PLUGIN_SETS: dict[str, dict[str, list[str]]] = {
    "env": {"env": []},
    "svc": {"svc": []},
    "env+svc": {"env": [], "svc": []},
    "ssh": {"ssh": []},
    "pytorch": {"pytorch": []},
    "tensorflow": {"tensorflow": []},
    "mpi": {"mpi": []},
    "ray": {"ray": []},
    "hcclrank": {"hcclrank": []},
}
# Plugins whose patch grows with the host list; all others must stay flat.
GROWING = {"tensorflow"}
TARGETS = {
    "pytorch_rps_vs_baseline_c16": 0.70,
    "p99_ms_c1": 3.0,
    "p99_ms_c16": 15.0,
    "chain_us_env_svc": 100.0,
    "rss_mb_10k_jobs": 200.0,
}


def bench_job(name: str, plugins: dict[str, list[str]], workers: int, masters: int = 1) -> dict[str, Any]:
    def task(task_name: str, replicas: int, container: str = "main") -> dict[str, Any]:
        return {
            "name": task_name,
            "replicas": replicas,
            "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": container, "image": "busybox:1.36.1", "resources": {"limits": {"cpu": "1"}}}]}},
        }

    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "plugins": plugins,
            "tasks": [task("master", masters), task("worker", workers), task("head", 1, "head")],
        },
    }


# 2. The chain in process --------------------------------------------------------------------------

def wiring(chain: Chain, job: Job, pod: dict[str, Any]) -> Callable[[], None]:
    """One Pod through the prepared job and the patch. A refused job (tensorflow at 10,000 workers:
    TF_CONFIG over what Linux passes in one environment string) is refused for every Pod, the
    webhook preparing it each time: that is what is timed then."""
    try:
        prepared = chain.prepare(job)
    except PluginError:
        def refuse() -> None:
            try:
                chain.mutate(job, pod)
            except PluginError:
                pass
        return refuse
    def wire() -> None:
        make_patch(pod, prepared.mutate(pod).pod)
    return wire


def chain_costs(quick: bool) -> dict[str, dict[int, float]]:
    chain = Chain()
    out: dict[str, dict[int, float]] = {}
    for label, plugins in PLUGIN_SETS.items():
        out[label] = {}
        for replicas in REPLICAS:
            job = Job.from_object(bench_job("bench", plugins, replicas))
            pod = make_pod(job, "worker", 0)
            wire = wiring(chain, job, pod)  # prepared once per job, as the webhook's job cache does: not per-Pod cost
            rounds = []
            n = 50 if quick else 300
            for _ in range(3 if quick else 7):
                started = time.perf_counter()
                for _ in range(n):
                    wire()
                rounds.append((time.perf_counter() - started) / n * 1e6)
            out[label][replicas] = statistics.median(rounds)
    return out


def plot_chain(costs: dict[str, dict[int, float]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, row in costs.items():
        ax.plot(list(row), list(row.values()), marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("replicas in the worker task")
    ax.set_ylabel("µs per Pod (chain + patch)")
    ax.axhline(TARGETS["chain_us_env_svc"], color="grey", linestyle=":", label="100 µs target (env+svc)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


# 1. The server under load -------------------------------------------------------------------------

def start_server(jobs_dir: Path, certs_dir: Path, port: int, core: str | None) -> subprocess.Popen[bytes]:
    ensure_certs(certs_dir)  # before the server starts, so the client has the CA to trust
    cmd = [sys.executable, str(ROOT / "bench" / "server.py"), str(jobs_dir), str(certs_dir), str(port)]
    proc = subprocess.Popen(pinned(cmd, core), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc


def run_wrk(url: str, body: Path, connections: int, seconds: int, core: str | None, server: int) -> dict[str, float]:
    """wrk's figures, and the ``server`` process's CPU time per request (what an admission costs the
    machine, which in a storm the API server and the nodes wait for)."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", str(ROOT / "bench" / "post.lua"), url]
    before = cpu_seconds(server)
    done = subprocess.run(pinned(cmd, core), capture_output=True, text=True, env={**os.environ, "BODY": str(body)}, check=True)
    spent = cpu_seconds(server) - before
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            row = json.loads(line[len("RESULT "):])
            row["cpu_us"] = spent / max(row["requests"], 1) * 1e6
            return row
    raise RuntimeError(f"wrk printed no result:\n{done.stdout}\n{done.stderr}")


def median_run(rows: list[dict[str, float]], baseline: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over the rounds, errors summed; ``ratio``, the median of each
    round's rate over the baseline's in the same round."""
    out = {key: statistics.median(row[key] for row in rows) for key in ("rps", "p50_ms", "p99_ms", "p999_ms", "cpu_us")}
    out["ratio"] = statistics.median(row["rps"] / base["rps"] for row, base in zip(rows, baseline, strict=True))
    out["errors"] = sum(row["errors"] for row in rows)
    return out


def load_figures(quick: bool) -> dict[str, Any]:
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed: apt-get install wrk")
    cores = os.cpu_count() or 1
    server_core, client_core = ("0", "1") if cores >= 2 else (None, None)
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        jobs_dir, certs_dir = tmpdir / "jobs", tmpdir / "certs"
        jobs_dir.mkdir()
        reviews: dict[str, Path] = {}
        cases = {
            "env": (bench_job("env-only", {"env": []}, 2), "worker", 1),
            "pytorch": (bench_job("pt", {"pytorch": []}, 2), "worker", 1),
            "svc-1000": (bench_job("svc-big", {"svc": []}, 1000, masters=1000), "worker", 999),
        }
        for label, (job, task, index) in cases.items():
            (jobs_dir / f"{job['metadata']['name']}.json").write_text(json.dumps(job))
            pod = make_pod(Job.from_object(job), task, index)
            path = tmpdir / f"{label}.json"
            path.write_text(json.dumps(admission_review(pod, uid=f"bench-{label}")))
            reviews[label] = path
        port = 18443
        proc = start_server(jobs_dir, certs_dir, port, server_core)
        try:
            wait_ready(port, certs_dir / "ca.crt")
            rounds, seconds = (2, 1) if quick else (5, 2)
            figures: dict[str, Any] = {}
            for connections in (1, 16, 64):
                run_wrk(f"https://127.0.0.1:{port}/baseline", reviews["pytorch"], connections, 1, client_core, proc.pid)  # warm-up
                # The cases take turns with the baseline, round after round, so that a machine that
                # speeds up or slows down meanwhile weighs on every case alike.
                runs: dict[str, list[dict[str, float]]] = {}
                for _ in range(rounds):
                    for label, route, body in (("baseline", "baseline", reviews["pytorch"]),
                                              *((label, "mutate", body) for label, body in reviews.items())):
                        runs.setdefault(label, []).append(run_wrk(
                            f"https://127.0.0.1:{port}/{route}", body, connections, seconds, client_core, proc.pid))
                for label, rows in runs.items():
                    figures[f"{label}/c{connections}"] = median_run(rows, runs["baseline"])
        finally:
            proc.terminate()
            proc.wait(10)
    return figures


# 3. Memory ----------------------------------------------------------------------------------------

def rss_with_jobs(count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        jobs_dir = tmpdir / "jobs"
        jobs_dir.mkdir()
        # A realistic spread: 100 files of 100 jobs each, every job a pytorch job of 3 tasks.
        for f in range(count // 100):
            docs = []
            for i in range(100):
                job = bench_job(f"job-{f}-{i}", {"pytorch": [], "svc": []}, 8)
                docs.append(json.dumps(job))
            (jobs_dir / f"jobs-{f}.yaml").write_text("\n---\n".join(docs))
        port = 18444
        proc = start_server(jobs_dir, tmpdir / "certs", port, None)
        try:
            wait_ready(port, tmpdir / "certs" / "ca.crt", timeout=120)
            status = Path(f"/proc/{proc.pid}/status").read_text()
            kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            return kb / 1024
        finally:
            proc.terminate()
            proc.wait(10)


# Report -------------------------------------------------------------------------------------------

def mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(figures: dict[str, Any], costs: dict[str, dict[int, float]], rss: float, plotted: bool) -> tuple[str, dict[str, Any]]:
    lines = [f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}", ""]
    lines.append("| case | conc. | admissions/s | × baseline | p50 ms | p99 ms | p99.9 ms | server CPU µs | errors |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for key, row in figures.items():
        label, conc = key.split("/")
        lines.append(
            f"| {label} | {conc[1:]} | {row['rps']:,.0f} | {row['ratio']:.2f} | {row['p50_ms']:.2f} | "
            f"{row['p99_ms']:.2f} | {row['p999_ms']:.2f} | {row['cpu_us']:.0f} | {row['errors']} |"
        )
    lines += ["", "| plugins | " + " | ".join(f"{r:,} replicas" for r in REPLICAS) + " |", "|---" * (len(REPLICAS) + 1) + "|"]
    for label, row in costs.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[r]:,.1f} µs" for r in REPLICAS) + " |")
    checks = {
        "pytorch /mutate ≥ 70% of baseline at c16, no errors": figures["pytorch/c16"]["ratio"] >= TARGETS["pytorch_rps_vs_baseline_c16"]
        and all(row["errors"] == 0 for key, row in figures.items() if not key.startswith("baseline")),
        "p99 < 3 ms at concurrency 1 (pytorch)": figures["pytorch/c1"]["p99_ms"] < TARGETS["p99_ms_c1"],
        "p99 < 15 ms at concurrency 16 (pytorch)": figures["pytorch/c16"]["p99_ms"] < TARGETS["p99_ms_c16"],
        "chain < 100 µs per Pod for env+svc at every replica count": max(costs["env+svc"].values()) < TARGETS["chain_us_env_svc"],
        "chain flat where the patch does not grow (≤ 2× from 1 to 10,000 replicas)": all(
            row[REPLICAS[-1]] <= 2 * row[REPLICAS[0]] for label, row in costs.items() if label not in GROWING),
        "serve < 200 MB resident with 10,000 cached jobs": rss < TARGETS["rss_mb_10k_jobs"],
    }
    lines += ["", f"serve resident memory with 10,000 cached jobs: {rss:.0f} MB", ""]
    lines += [f"- {mark(ok)}: {name}" for name, ok in checks.items()]
    if plotted:
        lines.append("\nchain cost plot: bench/results/chain.png")
    data = {"figures": figures, "chain_us": costs, "rss_mb": rss, "targets": {k: bool(v) for k, v in checks.items()},
            "machine": lines[0]}
    return "\n".join(lines), data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (for a smoke test)")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    costs = chain_costs(args.quick)
    plotted = plot_chain(costs, RESULTS / "chain.png")
    figures = load_figures(args.quick)
    rss = rss_with_jobs(10_000)
    text, data = report(figures, costs, rss, plotted)
    print(text)
    (RESULTS / "latest.json").write_text(json.dumps(data, indent=2))
    (RESULTS / "latest.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
