"""The real MPI launchers, and DeepSpeed's, read what the chain writes.

Open MPI's ``mpirun`` (Debian ``openmpi-bin``) and MPICH's ``mpiexec.hydra`` (Debian ``mpich``) start
ranks from the ``hostfile`` plugin's file in every ``--format`` and from the ``mpi`` plugin's
``MPI_HOST``. Everything comes from the real chain: the example jobs through ``Chain().resources``
(the ConfigMap that holds the host file, the ssh Secret's ``config``) and ``Chain().mutate`` (the
launcher Pod's environment and mounts, mount paths mapped to files under ``tmp_path``).

The host names are Pod DNS names that do not resolve here, so the launchers' remote shell is AGENT: a
stand-in for ssh that drops ssh's options, looks the host up in the ssh plugin's ``config`` as ssh
would, and runs the command on this machine in a TMPDIR of that host's own (two Open MPI daemons
sharing one session directory race each other). Each rank prints its rank, the world size and the
host it was sent to; every rank must appear once, and every host of the file with as many ranks as
its slots. A missing launcher skips its tests with the package to install.

DeepSpeed reads the deepspeed format twice: its own parser (``fetch_hostfile``) and its launcher
(``deepspeed.launcher.runner`` with ``--launcher openmpi``, which starts ``mpirun`` on the file).
Both need the ``torch`` extra (``pip install -e '.[test,torch]'``); skipped without it.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.jobs import set_plugin_arg
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.plugins import Chain, read_workload
from volcano_job_webhook.plugins.podgen import make_pod

MPIRUN = shutil.which("mpirun.openmpi")
HYDRA = shutil.which("mpiexec.hydra")
needs_openmpi = pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun.openmpi is not installed (apt-get install openmpi-bin)")
needs_hydra = pytest.mark.skipif(HYDRA is None, reason="MPICH's mpiexec.hydra is not installed (apt-get install mpich)")
WORKERS = 3

AGENT = """#!/bin/sh
# Stands in for ssh: skip ssh's options (Hydra passes -x), take the host, look it up in the ssh
# plugin's config as ssh would, run the command here in a TMPDIR of the host's own.
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
asked=$1
shift
host=$asked
if [ -f '{config}' ]; then
  found=$(awk -v h="$asked" '$1 == "Host" {{ m = ($2 == h) }} m && $1 == "HostName" {{ print $2; exit }}' '{config}')
  [ -n "$found" ] && host=$found
fi
mkdir -p '{hosts}'/"$host"
LAUNCHER_ASKED=$asked LAUNCHER_HOST=$host TMPDIR='{hosts}'/"$host"
export LAUNCHER_ASKED LAUNCHER_HOST TMPDIR
exec sh -c "$*"
"""
RANK_SH = """#!/bin/sh
printf '[rank=%s size=%s host=%s asked=%s]\\n' "${OMPI_COMM_WORLD_RANK-$PMI_RANK}" \\
  "${OMPI_COMM_WORLD_SIZE-$PMI_SIZE}" "$LAUNCHER_HOST" "$LAUNCHER_ASKED"
"""
RANK_PY = """import os
e = os.environ
os.write(1, f"[rank={e['OMPI_COMM_WORLD_RANK']} size={e['OMPI_COMM_WORLD_SIZE']} "
            f"host={e['LAUNCHER_HOST']} asked={e['LAUNCHER_ASKED']}]\\n".encode())
"""
# Ranks of one run write through the launcher concurrently; the brackets keep lines apart.
RANK_LINE = re.compile(r"\[rank=(\d+) size=(\d+) host=([^ \]]+) asked=([^ \]]+)\]")
LAUNCHER_VARS = ("OMPI_", "PMIX_", "HYDRA_", "I_MPI_", "PMI_", "LAUNCHER_")


@dataclass
class Rank:
    rank: int
    size: int
    host: str
    asked: str


@dataclass
class Launcher:
    """The launcher Pod as this machine can run it."""

    env: dict[str, str]  # its first container's variables, mount paths mapped to local files
    files: dict[str, Path]  # mount path -> local copy of the ConfigMap key mounted there
    agent: Path
    rank_sh: Path
    tmp: Path


def hostfile_job(fmt: str) -> dict[str, Any]:
    """examples/jobs/hostfile-job.yaml with ``--format=<fmt>`` and three workers of two GPUs (slots)."""
    job = yaml.safe_load((EXAMPLES / "jobs" / "hostfile-job.yaml").read_text())
    set_plugin_arg(job, "hostfile", "format", fmt)
    job["spec"]["tasks"][1]["replicas"] = WORKERS
    return job


def mpi_job() -> dict[str, Any]:
    job = yaml.safe_load((EXAMPLES / "jobs" / "mpi-job.yaml").read_text())
    job["spec"]["tasks"][1]["replicas"] = WORKERS
    return job


def launcher(job_obj: dict[str, Any], task: str, tmp: Path) -> Launcher:
    """Wire the launcher Pod (Pod 0 of ``task``) through the chain and lay its mounted files and ssh
    config out in ``tmp``; ``job_obj`` is a Volcano Job or an Indexed Job."""
    job = read_workload(copy.deepcopy(job_obj))
    resources = Chain().resources(job)
    pod = Chain().mutate(job, make_pod(job, task, 0)).pod
    config_maps = {o["metadata"]["name"]: o.get("data") or {} for o in resources if o["kind"] == "ConfigMap"}
    secrets = {o["metadata"]["name"]: o.get("data") or {} for o in resources if o["kind"] == "Secret"}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    container = pod["spec"]["containers"][0]

    files: dict[str, Path] = {}
    for i, mount in enumerate(container.get("volumeMounts", [])):
        source = volumes[mount["name"]].get("configMap")
        if source and mount.get("subPath"):
            local = tmp / "mounts" / str(i) / Path(mount["mountPath"]).name
            local.parent.mkdir(parents=True)
            local.write_text(config_maps[source["name"]][mount["subPath"]])
            files[mount["mountPath"]] = local
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
        value = config_maps[ref["name"]][ref["key"]] if ref else entry["value"]
        env[entry["name"]] = str(files.get(value, value))

    ssh = secrets.get(f"{job.name}-ssh", {})
    config = tmp / "ssh_config"
    if "config" in ssh:
        config.write_bytes(base64.b64decode(ssh["config"]))
    agent = tmp / "agent"
    agent.write_text(AGENT.format(config=config, hosts=tmp / "hosts"))
    rank_sh = tmp / "rank.sh"
    rank_sh.write_text(RANK_SH)
    for script in (agent, rank_sh):
        script.chmod(0o755)
    return Launcher(env, files, agent, rank_sh, tmp)


def run(argv: list[str], wired: Launcher, extra_env: dict[str, str] | None = None) -> list[Rank]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env.update(wired.env)
    env.update(extra_env or {})
    (wired.tmp / "launcher").mkdir(exist_ok=True)
    env["TMPDIR"] = str(wired.tmp / "launcher")
    done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return [Rank(int(r), int(s), h, a) for r, s, h, a in RANK_LINE.findall(done.stdout)]


def mpirun(wired: Launcher, *args: str, program: list[str] | None = None) -> list[str]:
    assert MPIRUN is not None
    return [MPIRUN, "--allow-run-as-root", "--mca", "plm_rsh_agent", str(wired.agent), *args, *(program or [str(wired.rank_sh)])]


def hydra(wired: Launcher, *args: str) -> list[str]:
    # -iface lo: the proxies call back to 127.0.0.1, not to this machine's name, which may not resolve.
    assert HYDRA is not None
    return [HYDRA, "-iface", "lo", "-launcher", "ssh", "-launcher-exec", str(wired.agent), *args, str(wired.rank_sh)]


def parse_hostfile(text: str) -> dict[str, int]:
    """``host slots=N`` or ``host:N`` lines, as the launchers read them."""
    out = {}
    for line in text.splitlines():
        host, sep, slots = line.partition(" slots=") if " slots=" in line else line.partition(":")
        assert sep and slots.isdigit(), f"not a host file line: {line!r}"
        out[host] = int(slots)
    return out


def check_ranks(ranks: list[Rank], slots: dict[str, int]) -> None:
    """Every rank once, a world of all slots, each host with as many ranks as its slots."""
    total = sum(slots.values())
    assert sorted(r.rank for r in ranks) == list(range(total)), ranks
    assert {r.size for r in ranks} == {total}, ranks
    assert Counter(r.host for r in ranks) == Counter(slots), ranks


def worker_hosts(job: str, task: str) -> list[str]:
    return [f"{job}-{task}-{i}.{job}" for i in range(WORKERS)]


# ---------------------------------------------------------------------------------------------
# hostfile, every format


def hostfile_launcher(fmt: str, tmp: Path) -> tuple[Launcher, Path, dict[str, int]]:
    wired = launcher(hostfile_job(fmt), "mpimaster", tmp)
    path = wired.files["/job/hostfile" if fmt == "deepspeed" else "/etc/mpi/hostfile"]
    slots = parse_hostfile(path.read_text())
    assert list(slots) == worker_hosts("hostfile-demo", "worker")
    assert set(slots.values()) == {2}, "slots=auto takes the workers' nvidia.com/gpu: 2"
    return wired, path, slots


@needs_openmpi
def test_openmpi_reads_the_openmpi_hostfile(tmp_path):
    wired, path, slots = hostfile_launcher("openmpi", tmp_path)
    ranks = run(mpirun(wired, "--hostfile", str(path)), wired)
    check_ranks(ranks, slots)
    # OMPI_MCA_orte_keep_fqdn_hostnames=true: Open MPI asks for the Pod's domain name as written.
    assert {r.asked for r in ranks} == set(slots)


@needs_openmpi
def test_openmpi_finds_the_openmpi_hostfile_from_the_pod_env_alone(tmp_path):
    wired, path, slots = hostfile_launcher("openmpi", tmp_path)
    assert wired.env["OMPI_MCA_orte_default_hostfile"] == str(path)
    check_ranks(run(mpirun(wired), wired), slots)


@needs_openmpi
def test_openmpi_reads_the_deepspeed_hostfile(tmp_path):
    wired, path, slots = hostfile_launcher("deepspeed", tmp_path)
    ranks = run(mpirun(wired, "--hostfile", str(path)), wired)
    check_ranks(ranks, slots)
    # No OMPI_MCA_* on a deepspeed launcher: Open MPI drops the domain, and the ssh plugin's config
    # (Host <pod> / HostName <pod>.<job>) takes ssh to the same Pod.
    assert {r.asked for r in ranks} == {h.split(".")[0] for h in slots}


@needs_hydra
def test_hydra_reads_the_mpich_hostfile(tmp_path):
    wired, path, slots = hostfile_launcher("mpich", tmp_path)
    ranks = run(hydra(wired, "-f", str(path)), wired)
    check_ranks(ranks, slots)
    assert {r.asked for r in ranks} == set(slots)


@needs_hydra
def test_hydra_finds_the_mpich_hostfile_from_the_pod_env_alone(tmp_path):
    wired, path, slots = hostfile_launcher("mpich", tmp_path)
    assert wired.env["HYDRA_HOST_FILE"] == str(path)
    check_ranks(run(hydra(wired), wired), slots)


@needs_hydra
def test_hydra_reads_the_intel_hostfile(tmp_path):
    """Intel MPI's mpiexec is Hydra, reading the same ``host:N`` file; it finds it through
    I_MPI_HYDRA_HOST_FILE, which MPICH's Hydra does not read, so the test passes that path as -f."""
    wired, path, slots = hostfile_launcher("intel", tmp_path)
    assert wired.env["I_MPI_HYDRA_HOST_FILE"] == str(path)
    check_ranks(run(hydra(wired, "-f", wired.env["I_MPI_HYDRA_HOST_FILE"]), wired), slots)


# ---------------------------------------------------------------------------------------------
# mpi: MPI_HOST


@needs_openmpi
def test_openmpi_reads_mpi_host(tmp_path):
    wired = launcher(mpi_job(), "mpimaster", tmp_path)
    hosts = wired.env["MPI_HOST"].split(",")
    assert hosts == worker_hosts("mpi-demo", "mpiworker")
    ranks = run(mpirun(wired, "--host", wired.env["MPI_HOST"], "-np", str(WORKERS)), wired)
    check_ranks(ranks, dict.fromkeys(hosts, 1))
    # As the example's `mpiexec --host ${MPI_HOST}`: Open MPI drops the domain; ssh's config maps it back.
    assert {r.asked for r in ranks} == {h.split(".")[0] for h in hosts}


@needs_hydra
def test_hydra_reads_mpi_host(tmp_path):
    wired = launcher(mpi_job(), "mpimaster", tmp_path)
    hosts = wired.env["MPI_HOST"].split(",")
    ranks = run(hydra(wired, "-hosts", wired.env["MPI_HOST"], "-n", str(WORKERS)), wired)
    check_ranks(ranks, dict.fromkeys(hosts, 1))
    assert {r.asked for r in ranks} == set(hosts)


# ---------------------------------------------------------------------------------------------
# DeepSpeed


def test_deepspeed_parses_the_deepspeed_hostfile(tmp_path):
    runner = pytest.importorskip("deepspeed.launcher.runner", reason="deepspeed is not installed (pip install -e '.[torch]')")
    _, path, slots = hostfile_launcher("deepspeed", tmp_path)
    assert runner.DLTS_HOSTFILE == "/job/hostfile", "the plugin mounts the file where DeepSpeed looks by default"
    pool = runner.fetch_hostfile(str(path))
    assert list(pool.items()) == list(slots.items())


@needs_openmpi
def test_deepspeed_launches_ranks_from_the_deepspeed_hostfile(tmp_path):
    pytest.importorskip("deepspeed.launcher.runner", reason="deepspeed is not installed (pip install -e '.[torch]')")
    on_path = shutil.which("mpirun")
    if on_path is None or os.path.realpath(on_path) != os.path.realpath(MPIRUN or ""):
        pytest.skip(f"DeepSpeed runs the `mpirun` on PATH, which is not Open MPI's here ({on_path})")
    wired, path, slots = hostfile_launcher("deepspeed", tmp_path)
    program = tmp_path / "rank.py"
    program.write_text(RANK_PY)
    launcher_args = f"--allow-run-as-root --mca plm_rsh_agent {wired.agent} --mca btl_tcp_if_include lo"
    argv = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(path), "--launcher", "openmpi",
        # DeepSpeed would ssh to the first host for these two; AGENT is only for the launcher.
        "--no_ssh_check", "--master_addr", "127.0.0.1", "--launcher_args", launcher_args, str(program),
    ]
    check_ranks(run(argv, wired), slots)


# ---------------------------------------------------------------------------------------------
# An Indexed Job (docs/workloads.md): one task, every Pod a host, Pod 0 launches


def indexed_hostfile_job(fmt: str) -> dict[str, Any]:
    """An opted-in Indexed Job of WORKERS Pods with ssh and ``hostfile --format=<fmt>``."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "mpi-indexed", "namespace": "default", "uid": "5b1f3f0e-0000-4000-8000-000000000201",
                     "annotations": {"volcano-job-webhook/plugins": f'{{"ssh": [], "hostfile": ["--format={fmt}"]}}'}},
        "spec": {"completionMode": "Indexed", "completions": WORKERS, "parallelism": WORKERS, "template": {
            "metadata": {"labels": {"volcano-job-webhook/enabled": "true"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "mpi", "image": "mpioperator/openmpi"}]}}},
    }


@pytest.mark.parametrize("fmt", [pytest.param("openmpi", marks=needs_openmpi), pytest.param("mpich", marks=needs_hydra)])
def test_the_launchers_read_an_indexed_jobs_hostfile(fmt, tmp_path):
    wired = launcher(indexed_hostfile_job(fmt), "mpi-indexed", tmp_path)
    path = wired.files["/etc/mpi/hostfile"]
    slots = parse_hostfile(path.read_text())
    assert list(slots) == [f"mpi-indexed-{i}.mpi-indexed" for i in range(WORKERS)]
    # From the Pod's environment alone, as `mpirun prog` / `mpiexec prog` in Pod 0 would start.
    check_ranks(run(mpirun(wired) if fmt == "openmpi" else hydra(wired), wired), slots)
