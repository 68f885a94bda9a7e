"""How long svc's ``volcano-svc-hosts`` init container takes to fill ``/etc/volcano``, and how many
bytes it writes, for jobs past the ConfigMap's 1 MiB: 40,000 workers, 100,000 Pods, and the most
``GENERATED_LIMIT`` allows (262,144 Pods of the longest names). Each script runs as the Pod runs it
(``sh -c SCRIPT volcano-svc-hosts CONFIGMAP_DIR TARGET_DIR``), under ``/bin/sh`` with this machine's
tools and under busybox's ``sh`` with busybox's applets only, on a ConfigMap directory laid out as
the kubelet lays it out. Median of a few rounds; a new target directory for each.

    python bench/svc_hosts.py [--rounds N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.podgen import make_pod

BUSYBOX = shutil.which("busybox")


def job(name: str, tasks: list[tuple[str, int, dict[str, Any]]]) -> Job:
    return Job.from_object({
        "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
        "spec": {"plugins": {"svc": []}, "tasks": [
            {"name": t, "replicas": r, "template": {"spec": {"containers": [{"name": "main", "image": "x:1"}], **extra}}}
            for t, r, extra in tasks
        ]},
    })


JOBS = {
    "40,000 workers (training-run-a)": job("training-run-a", [("worker", 40_000, {})]),
    "1 master + 99,999 workers (big)": job("big", [("master", 1, {}), ("worker", 99_999, {})]),
    "262,144 Pods, 127-byte names": job("j" * 49, [("tttttt", 262_144, {"subdomain": "s" * 63})]),
}


def config_map_dir(root: Path, data: dict[str, str]) -> Path:
    stamp = root / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, value in data.items():
        (stamp / key).write_text(value)
    (root / "..data").symlink_to(stamp.name)
    for key in data:
        (root / key).symlink_to(f"..data/{key}")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    shells = {"sh": (["/bin/sh"], "/usr/local/bin:/usr/bin:/bin")}
    applets = Path(tempfile.mkdtemp(prefix="busybox-bin-"))
    if BUSYBOX:
        for name in subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split():
            (applets / name).symlink_to(BUSYBOX)
        shells["busybox sh"] = ([BUSYBOX, "sh"], str(applets))
    print(f"median of {args.rounds} rounds; bytes written past the ConfigMap per Pod")
    print()
    print("| job | written MB | " + " | ".join(f"{s} s" for s in shells) + " |")
    print("|---|---|" + "---|" * len(shells))
    for label, j in JOBS.items():
        chain = Chain()
        pod = chain.mutate(j, make_pod(j, j.tasks[-1].name, 0)).pod
        command = pod["spec"]["initContainers"][0]["command"]
        config_map = next(o for o in chain.resources(j) if o["kind"] == "ConfigMap")
        times = []
        with tempfile.TemporaryDirectory() as tmp:
            source = config_map_dir(Path(tmp) / "cm", config_map["data"])
            written = 0
            for argv, path in shells.values():
                runs = []
                for i in range(args.rounds):
                    target = Path(tmp) / f"out-{len(times)}-{i}"
                    target.mkdir()
                    start = time.perf_counter()
                    subprocess.run([*argv, "-c", command[2], command[3], str(source), str(target)],
                                   env={"PATH": path}, check=True, capture_output=True)
                    runs.append(time.perf_counter() - start)
                    written = sum(p.stat().st_size for p in target.iterdir()) - sum(map(len, config_map["data"].values()))
                    shutil.rmtree(target)
                times.append(statistics.median(runs))
        print(f"| {label} | {written / 1e6:.1f} | " + " | ".join(f"{t:.2f}" for t in times) + " |")
    shutil.rmtree(applets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
