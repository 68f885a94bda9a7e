"""Size budgets (issue 13): every value made from a job's host lists is sized from counts before it is
built, and left out with a warning or refused when it would pass a Kubernetes limit; Pods the API
server would reject are never produced.

Memory is bounded with ``tracemalloc`` (a peak of a few MB for a job of 10^9 replicas, whose host
lists would take gigabytes), never with timings: speed lives in ``bench/budgets.py``.
"""

from __future__ import annotations

import base64
import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.jobs import task as job_task
from tests.helpers.jobs import volcano_job
from tests.helpers.schema import validate_object, validate_pod
from volcano_job_webhook.plugins import (
    Chain,
    ChainConfig,
    Job,
    PluginError,
    PodContext,
    Settings,
)
from volcano_job_webhook.plugins.budget import (
    DATA_LIMIT,
    ENV_STRING_LIMIT,
    STORE_LIMIT,
    digits_below,
    env_value_limit,
    task_hosts,
)
from volcano_job_webhook.plugins.builtin.hostfile import HostfilePlugin
from volcano_job_webhook.plugins.builtin.jax import JaxPlugin
from volcano_job_webhook.plugins.builtin.mpi import MPIPlugin
from volcano_job_webhook.plugins.builtin.paddle import PaddlePlugin
from volcano_job_webhook.plugins.builtin.pytorch import PytorchPlugin
from volcano_job_webhook.plugins.builtin.ssh import SSHPlugin
from volcano_job_webhook.plugins.builtin.svc import SvcPlugin
from volcano_job_webhook.plugins.builtin.tensorflow import TensorflowPlugin
from volcano_job_webhook.plugins.builtin.torchrun import TorchrunPlugin
from volcano_job_webhook.plugins.builtin.waitfor import WaitforPlugin
from volcano_job_webhook.plugins.builtin.xgboost import XGBoostPlugin
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.registry import BUILTINS
from volcano_job_webhook.server.admission import admission_review

BILLION = 10**9
MEMORY_BOUND = 4 * 1024 * 1024  # bytes of Python allocations at peak; the lists would be gigabytes
HEADER = "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n"


def job_object(plugins: dict[str, list[str]], tasks: list[tuple[str, int]], **pod: Any) -> dict[str, Any]:
    """Job "big": image x:1, ``pod`` more fields of every task's Pod spec."""
    return volcano_job("big", plugins=plugins, tasks=tasks, uid="u-1", image="x:1", pod=pod)


def make_job(plugins: dict[str, list[str]], tasks: list[tuple[str, int]], **pod: Any) -> Job:
    return Job.from_object(job_object(plugins, tasks, **pod))


@contextmanager
def bounded_memory(limit: int = MEMORY_BOUND) -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak of {peak} bytes allocated"


def context(job: Job, task: str, index: int = 0) -> PodContext:
    found = job.task(task)
    assert found is not None
    return PodContext(job=job, pod=make_pod(job, task, index), task=found)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


# ---------------------------------------------------------------------------------------------
# The arithmetic is exact: checked against the strings it stands for


names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)


@st.composite
def small_jobs(draw: st.DrawFn) -> dict[str, Any]:
    tasks = []
    for i, task in enumerate(draw(st.lists(names, min_size=1, max_size=4, unique=True))):
        container: dict[str, Any] = {"name": "c", "image": "x:1"}
        pod: dict[str, Any] = {"containers": [container]}
        if draw(st.booleans()) and i:
            pod["hostname"] = draw(names)
        if draw(st.booleans()):
            pod["subdomain"] = draw(names)
        if draw(st.booleans()):
            container["resources"] = {"limits": {"nvidia.com/gpu": draw(st.integers(1, 16))}}
        replicas = draw(st.sampled_from([0, 1, 2, 9, 10, 11, 99, 100, 101, 999, 1000, 1001]))
        tasks.append(job_task(task, replicas, pod=pod))
    return volcano_job(draw(names), uid="u", plugins={}, tasks=tasks)


@settings(max_examples=60, deadline=None)
@given(small_jobs(), st.integers(1, 65535))
def test_sizes_equal_the_built_strings(raw: dict[str, Any], port: int) -> None:
    job = Job.from_object(raw)
    for task in job.tasks:
        hosts = job.host_names(task)
        assert task_hosts(job, task).joined() == len(",".join(hosts))
        every = [job.domain_name(task, i) for i in range(task.replicas)]
        assert task_hosts(job, task, every_replica=True).joined(sep=2, each=3) == len(", ".join(f"{h}abc" for h in every))
        assert digits_below(task.replicas) == sum(len(str(i)) for i in range(task.replicas))

    ssh = SSHPlugin(job, [f"--ssh-port={port}"])
    assert ssh.config_size() == len(ssh.ssh_config())

    names_ = [t.name for t in job.tasks]
    tf = TensorflowPlugin(job, [f"--port={port}", f"--worker={names_[0]}", f"--ps={names_[-1]}"])
    if not tf._single():
        assert tf.cluster_size() == len(tf._cluster_json)
        values = []
        for task in job.tasks:
            for index in range(min(task.replicas, 1)), range(max(task.replicas - 1, 0), task.replicas):
                for i in index:
                    ctx = context(job, task.name, i)
                    tf.mutate(ctx)
                    values.append(len(env_of(ctx.pod["spec"]["containers"][0])["TF_CONFIG"]))
        assert tf.largest_tf_config()[0] == max(values, default=tf.largest_tf_config()[0])

    if len(names_) >= 2:
        for fmt in ("openmpi", "intel"):
            hostfile = HostfilePlugin(job, [f"--master={names_[0]}", f"--worker={names_[1]}", "--include-master", f"--format={fmt}"])
            assert hostfile.hostfile_size() == len(hostfile.hostfile)

    svc = SvcPlugin(job, [])
    data = svc.hosts_data()
    assert sum(map(len, data.values())) <= DATA_LIMIT
    for task in job.tasks:
        assert len(data[f"{task.name}.host"]) == task_hosts(job, task).joined()


def test_env_value_limit_is_max_arg_strlen() -> None:
    # execve counts NAME=value and the terminating NUL against MAX_ARG_STRLEN (32 pages of 4 KiB).
    assert ENV_STRING_LIMIT == 131_072
    assert len("MPI_HOST") + 1 + env_value_limit("MPI_HOST") + 1 == ENV_STRING_LIMIT


# ---------------------------------------------------------------------------------------------
# 10^9 replicas: an answer in small memory from every plugin, through the chain


ARGS = {"waitfor": ["--tasks=worker"]}


def billion_job(plugin: str) -> Job:
    tasks = [("head", 1), ("worker", BILLION)] if plugin == "ray" else [("master", 1), ("worker", BILLION)]
    return make_job({plugin: ARGS.get(plugin, [])}, tasks)


SVC_PLUGINS = [name for name, cls in BUILTINS.items() if name == "svc" or "svc" in cls.requires]


@pytest.mark.parametrize("plugin", SVC_PLUGINS)
def test_billion_replicas_refused_by_svc_everywhere(plugin: str) -> None:
    """Every plugin that brings in svc: the host files (24.9 GB) could be neither in the svc ConfigMap
    (1 MiB) nor written in each Pod (32 MiB), so /validate, every Pod and the reconciler get the
    same refusal, with the size."""
    job = billion_job(plugin)
    chain = Chain()
    first = job.tasks[0].name
    calls: list[Callable[[], Any]] = [
        lambda: chain.check(job),
        lambda: chain.mutate(job, make_pod(job, first, 0)),
        lambda: chain.mutate(job, make_pod(job, "worker", BILLION - 1)),
        lambda: chain.resources(job),
    ]
    with bounded_memory():
        messages = []
        for call in calls:
            with pytest.raises(PluginError) as info:
                call()
            messages.append(str(info.value))
    assert len(set(messages)) == 1
    message = messages[0]
    assert message.startswith("job default/big: plugin svc: spec.tasks[1].replicas: the host files (/etc/volcano/<task>.host) would be ")
    size = int(message.split(" would be ")[1].split(" bytes")[0])
    assert size > BILLION * len("big-worker-.big")  # a lower bound, without the index digits
    assert "the ConfigMap 'big-svc' cannot hold would be written in every Pod" in message
    assert "task 'worker' alone has " in message and f"for {BILLION} hosts" in message
    assert "over 33554432 bytes, the most svc writes to each Pod" in message


def test_billion_replicas_ssh_leaves_host_entries_out() -> None:
    job = billion_job("ssh")
    chain = Chain()
    with bounded_memory():
        warnings = chain.check(job)
        master = chain.mutate(job, make_pod(job, "master", 0))
        worker = chain.mutate(job, make_pod(job, "worker", BILLION - 1))
        (secret,) = chain.resources(job)
    assert len(warnings) == 1 and "the ssh config would be" in warnings[0] and "Host entries are left out" in warnings[0]
    size = int(warnings[0].split("the ssh config would be ")[1].split(" bytes")[0])
    assert size > BILLION * 2 * len("big-worker-")
    assert master.warnings == worker.warnings == warnings
    assert base64.b64decode(secret["data"]["config"]).decode() == HEADER
    validate_object(secret)
    validate_pod(worker.pod)


def test_billion_replicas_plugins_alone() -> None:
    """The plugins' own budgets, without svc in front: mpi leaves MPI_HOST out, tensorflow and hostfile
    refuse with the size, torchrun/jax/pytorch/paddle/xgboost/waitfor have no lists and wire the Pod."""
    job = make_job({}, [("master", 1), ("worker", BILLION)])
    with bounded_memory():
        mpi = MPIPlugin(job, [])
        (warning,) = mpi.check()
        ctx = context(job, "master")
        mpi.mutate(ctx)
        assert "MPI_HOST" not in env_of(ctx.pod["spec"]["containers"][0])
        assert ctx.pod["spec"]["containers"][0]["ports"] == [{"name": "mpijob-port", "containerPort": 22}]

        tf = TensorflowPlugin(job, [])
        with pytest.raises(PluginError) as tf_error:
            tf.check()
        with pytest.raises(PluginError) as tf_mutate:
            tf.mutate(context(job, "worker", 5))

        hostfile = HostfilePlugin(job, [])
        with pytest.raises(PluginError) as hf_error:
            hostfile.check()
        with pytest.raises(PluginError) as hf_resources:
            hostfile.resources()

        torchrun = TorchrunPlugin(job, [])
        assert torchrun.check() == []
        trc = context(job, "worker", BILLION - 1)
        torchrun.mutate(trc)
        jax = JaxPlugin(job, [])
        assert jax.check() == []
        jc = context(job, "worker", BILLION - 1)
        jax.mutate(jc)
        pytorch = PytorchPlugin(job, [])
        assert pytorch.check() == []
        pc = context(job, "worker", BILLION - 1)
        pytorch.mutate(pc)
        paddle = PaddlePlugin(job, [])
        assert paddle.check() == []
        pdc = context(job, "worker", BILLION - 1)
        paddle.mutate(pdc)
        xgboost = XGBoostPlugin(job, [])
        assert xgboost.check() == []
        xc = context(job, "worker", BILLION - 1)
        xgboost.mutate(xc)
        waitfor = WaitforPlugin(job, ["--tasks=worker"])
        assert waitfor.check() == []
        wc = context(job, "master")
        waitfor.mutate(wc)

    assert warning.startswith("job default/big: plugin mpi: MPI_HOST left out of the master's containers: the hosts of task 'worker' are ")
    assert "over 131072 bytes" in warning and "--hostfile /etc/volcano/worker.host" in warning
    assert str(tf_error.value) == str(tf_mutate.value)
    assert str(tf_error.value).startswith("job default/big: plugin tensorflow: spec.tasks[1].replicas: TF_CONFIG would be ")
    assert f"(a cluster of {BILLION} addresses), over 131072 bytes" in str(tf_error.value)
    assert str(hf_error.value) == str(hf_resources.value)
    assert str(hf_error.value).startswith("job default/big: plugin hostfile: spec.tasks[1].replicas: the host file would be ")
    assert f"({BILLION} hosts), over 1048576 bytes" in str(hf_error.value)
    assert env_of(trc.pod["spec"]["containers"][0])["PET_NNODES"] == str(BILLION + 1)
    assert env_of(trc.pod["spec"]["containers"][0])["PET_NODE_RANK"] == str(BILLION)
    assert env_of(jc.pod["spec"]["containers"][0])["JAX_PROCESS_ID"] == str(BILLION)
    assert env_of(pc.pod["spec"]["containers"][0])["WORLD_SIZE"] == str(BILLION + 1)
    assert env_of(pdc.pod["spec"]["containers"][0])["PADDLE_NNODES"] == str(BILLION + 1)
    assert env_of(xc.pod["spec"]["containers"][0])["DMLC_TASK_ID"] == str(BILLION)
    # The script loops over the replicas in the shell: its text does not grow with them.
    script = wc.pod["spec"]["initContainers"][0]["command"][2]
    assert f"add big-worker {BILLION} big" in script and len(script) < 4096


def test_ssh_keys_over_the_secret_limit_are_refused() -> None:
    """Host entries can be left out, the keys cannot."""
    job = make_job({}, [("worker", 2)])
    ssh = SSHPlugin(job, ["--ssh-private-key=" + "k" * 600_000, "--ssh-public-key=" + "p" * 300_000])
    with pytest.raises(PluginError) as info:
        ssh.check()
    assert str(info.value) == (
        "job default/big: plugin ssh: --ssh-private-key: the keys are 1200000 bytes; the Secret 'big-ssh' would be over "
        "1048576 bytes, the most a ConfigMap's or Secret's data may hold"
    )


def test_mpi_port_checked_on_other_tasks_without_a_worker_task() -> None:
    """No worker task: the master is left alone (as Volcano), other Pods still get the port."""
    job = make_job({"mpi": ["--worker=none"]}, [("master", 1), ("extra", 1)],
                   containers=[{"name": "main", "image": "x:1", "ports": [{"name": "mpijob-port", "containerPort": 80}]}])
    with pytest.raises(PluginError, match=r"plugin mpi: spec.tasks\[1\].template.spec.containers\[0\].ports: .*'mpijob-port'"):
        Chain().check(job)


def test_billion_replicas_svc_without_host_env_still_refused() -> None:
    """--inject-hosts-env=false drops the variables, not the host files every Pod mounts."""
    job = make_job({"svc": ["--inject-hosts-env=false"]}, [("worker", BILLION)])
    with bounded_memory(), pytest.raises(PluginError, match=r"the host files \(/etc/volcano/<task>.host\) would be .* over 33554432 bytes"):
        Chain().check(job)


# ---------------------------------------------------------------------------------------------
# Large but legal jobs: what fits is built, what does not is left out, nothing passes a limit


def test_ten_thousand_tasks() -> None:
    """10,000 tasks of one replica: the ConfigMap fits (1 MiB of values, 1.5 MiB stored), but two
    VC_* references per task in every container would make a 1.9 MB Pod: left out, with a warning."""
    job = make_job({"svc": []}, [(f"t{i}", 1) for i in range(10_000)])
    chain = Chain()
    assert chain.check(job) == []
    result = chain.mutate(job, make_pod(job, "t9999", 0))
    (warning,) = result.warnings
    assert warning.startswith("job default/big: plugin svc: Pod 'big-t9999-0': the VC_<TASK>_HOSTS and VC_<TASK>_NUM variables of the job's 10000 tasks would add ")
    assert "over 1572864 bytes" in warning and "--inject-hosts-env=false" in warning
    container = result.pod["spec"]["containers"][0]
    assert "env" not in container and container["volumeMounts"] == [{"name": "big-svc", "mountPath": "/etc/volcano"}]
    assert len(orjson.dumps(result.pod)) < STORE_LIMIT
    assert chain.mutate(job, result.pod).pod == result.pod  # idempotent
    config_map, *_ = chain.resources(job)
    data = config_map["data"]
    assert len(data) == 30_000 and data["VC_T9999_HOSTS"] == "big-t9999-0.big" and data["t0.host"] == "big-t0-0.big"
    assert sum(map(len, data.values())) <= DATA_LIMIT and len(orjson.dumps(config_map)) < STORE_LIMIT


def test_two_thousand_tasks_fit_the_pod() -> None:
    job = make_job({"svc": []}, [(f"t{i}", 1) for i in range(2_000)])
    result = Chain().mutate(job, make_pod(job, "t0", 0))
    assert result.warnings == []
    assert len(result.pod["spec"]["containers"][0]["env"]) == 4_000
    assert len(orjson.dumps(result.pod)) < STORE_LIMIT


def test_svc_keys_dropped_largest_first() -> None:
    """Host files fit, their comma-joined copies do not all fit: the largest copy goes (and its
    variable), the smaller task keeps both."""
    job = make_job({"svc": []}, [("small", 10), ("large", 40_000)])
    chain = Chain()
    (warning,) = chain.check(job)
    assert "task 'large': VC_LARGE_HOSTS left out of the ConfigMap 'big-svc' and of every container" in warning
    pod = chain.mutate(job, make_pod(job, "small", 0)).pod
    assert list(env_of(pod["spec"]["containers"][0])) == ["VC_SMALL_HOSTS", "VC_SMALL_NUM", "VC_LARGE_NUM"]
    data = chain.resources(job)[0]["data"]
    assert sorted(data) == ["VC_LARGE_NUM", "VC_SMALL_HOSTS", "VC_SMALL_NUM", "large.host", "small.host"]
    assert data["VC_LARGE_NUM"] == "40000" and len(data["large.host"].split("\n")) == 40_000
    assert sum(map(len, data.values())) <= DATA_LIMIT


def test_mpi_ten_thousand_workers() -> None:
    """MPI_HOST left out (199 KB for this job), the same hosts served as /etc/volcano/worker.host, and
    the ssh config (about 600 KB) kept whole."""
    job = make_job({"mpi": []}, [("master", 1), ("worker", 10_000)])
    chain = Chain()
    warnings = chain.check(job)
    assert [w.split(": ")[1] for w in warnings] == ["plugin svc", "plugin mpi"]
    master = chain.mutate(job, make_pod(job, "master", 0)).pod
    assert "MPI_HOST" not in env_of(master["spec"]["containers"][0])
    validate_pod(master)
    objects = {o["kind"]: o for o in chain.resources(job)}
    config_map, secret = objects["ConfigMap"], objects["Secret"]
    assert config_map["data"]["worker.host"].split("\n") == job.host_names(job.task("worker"))
    config = base64.b64decode(secret["data"]["config"]).decode()
    assert config.count("\nHost ") == 10_001


def test_mpi_host_just_under_the_limit_is_kept() -> None:
    replicas = 6_000
    job = make_job({"mpi": []}, [("master", 1), ("worker", replicas)])
    hosts = ",".join(job.host_names(job.task("worker")))
    assert 100_000 < len(hosts) <= env_value_limit("MPI_HOST")
    result = Chain().mutate(job, make_pod(job, "master", 0))
    assert env_of(result.pod["spec"]["containers"][0])["MPI_HOST"] == hosts


def test_pod_over_the_store_limit_is_refused_naming_the_plugin() -> None:
    """Each MPI_HOST fits one environment string, but fourteen containers of them make a Pod etcd
    would not store (1.5 MiB): refused, naming mpi and the sizes. Ten containers fit."""
    containers = [{"name": f"c{i}", "image": "x:1"} for i in range(14)]
    job = make_job({"mpi": ["--port=2222"]}, [("master", 1), ("worker", 6_000)], containers=containers)
    with pytest.raises(PluginError) as info:
        Chain().mutate(job, make_pod(job, "master", 0))
    message = str(info.value)
    assert message.startswith("job default/big: plugin mpi: Pod: Pod 'big-master-0' of task 'master' would be ")
    wired = int(message.split(" would be ")[1].split(" bytes")[0])
    assert wired > STORE_LIMIT and "over 1572864 bytes, the largest object etcd stores" in message
    fits = make_job({"mpi": ["--port=2222"]}, [("master", 1), ("worker", 6_000)], containers=containers[:10])
    pod = Chain().mutate(fits, make_pod(fits, "master", 0)).pod
    assert len(orjson.dumps(pod)) < STORE_LIMIT


def test_hosts_env_limit_above_the_kernel_limit_is_capped() -> None:
    job = make_job({"svc": []}, [("worker", 8_000)])
    assert len(",".join(job.host_names(job.task("worker")))) > ENV_STRING_LIMIT
    chain = Chain(config=ChainConfig(settings=Settings(hosts_env_limit=10_000_000)))
    (warning,) = chain.check(job)
    assert "VC_WORKER_HOSTS left out" in warning and "over 131072 bytes for NAME=value" in warning


# ---------------------------------------------------------------------------------------------
# Pods the API server would reject: the path, port or name is named instead


def sidecar_pod(job: Job, task: str, container: dict[str, Any], *, init: bool = False) -> dict[str, Any]:
    """A Pod another webhook changed after Volcano's controller built it: the template is clean,
    so only the Pod shows the conflict."""
    pod = make_pod(job, task, 0)
    pod["spec"].setdefault("initContainers" if init else "containers", []).append(container)
    pod["spec"].setdefault("volumes", []).append({"name": "other", "emptyDir": {}})
    return pod


MOUNT_CASES = [
    ("svc", [], "/etc/volcano", "spec.containers[1].volumeMounts", False),
    ("svc", [], "/etc/volcano", "spec.initContainers[0].volumeMounts", True),
    ("ssh", [], "/root/.ssh", "--ssh-key-file-path: spec.containers[1]", False),
    ("ssh", ["--ssh-key-file-path=/home/u/.ssh"], "/home/u/.ssh", "--ssh-key-file-path: spec.initContainers[0]", True),
    ("hostfile", [], "/etc/mpi/hostfile", "--path: spec.containers[1]", False),
]


@pytest.mark.parametrize(("plugin", "args", "path", "where", "init"), MOUNT_CASES)
def test_mount_path_taken_in_the_pod(plugin: str, args: list[str], path: str, where: str, init: bool) -> None:
    job = make_job({plugin: args}, [("master", 1), ("worker", 2)])
    pod = sidecar_pod(job, "master", {"name": "side", "image": "x:1", "volumeMounts": [{"name": "other", "mountPath": path}]}, init=init)
    with pytest.raises(PluginError) as info:
        Chain().mutate(job, pod)
    assert str(info.value).startswith(f"job default/big: plugin {plugin}: {where}")
    assert f"container 'side' already mounts volume 'other' at {path!r}" in str(info.value)
    assert "mount paths to be unique" in str(info.value)


PORT_CASES = [
    ("mpi", [], "worker", "mpijob-port", 22),
    ("pytorch", [], "worker", "pytorchjob-port", 23456),
    ("torchrun", [], "worker", "torchrun-port", 29500),
    ("jax", [], "master", "jax-port", 6666),
    ("paddle", [], "master", "paddle-port", 6768),
    ("xgboost", [], "master", "xgboost-port", 9091),
]


@pytest.mark.parametrize(("plugin", "args", "task", "port", "number"), PORT_CASES)
def test_port_name_taken_in_the_pod(plugin: str, args: list[str], task: str, port: str, number: int) -> None:
    job = make_job({plugin: args}, [("master", 1), ("worker", 2)])
    pod = make_pod(job, task, 0)
    pod["spec"]["containers"][0]["ports"] = [{"name": port, "containerPort": 1}]
    with pytest.raises(PluginError) as info:
        Chain().mutate(job, pod)
    assert str(info.value).startswith(f"job default/big: plugin {plugin}: spec.containers[0].ports: ")
    assert f"already has a port named {port!r} (containerPort 1); adding {port!r} for port {number}" in str(info.value)


def test_ray_head_port_name_taken_in_the_pod() -> None:
    job = make_job({"ray": []}, [("head", 1), ("worker", 1)], containers=[{"name": "head", "image": "x:1"}])
    pod = make_pod(job, "head", 0)
    pod["spec"]["containers"][0]["ports"] = [{"name": "gcs", "containerPort": 7000}]
    with pytest.raises(PluginError, match=r"plugin ray: spec.containers\[0\].ports: .*'gcs' \(containerPort 7000\)"):
        Chain().mutate(job, pod)


def test_same_port_number_is_still_skipped_as_in_volcano() -> None:
    """Volcano adds no port whose number the container has, whatever its name: a valid Pod, kept."""
    job = make_job({"mpi": [], "pytorch": ["--port=22"]}, [("master", 1), ("worker", 2)])
    pod = make_pod(job, "worker", 0)
    pod["spec"]["containers"][0]["ports"] = [{"name": "ssh", "containerPort": 22, "protocol": "TCP"}]
    result = Chain().mutate(job, pod)
    assert result.pod["spec"]["containers"][0]["ports"] == [{"name": "ssh", "containerPort": 22, "protocol": "TCP"}]
    validate_pod(result.pod)


def test_wait_container_name_taken_in_the_pod() -> None:
    job = make_job({"pytorch": ["--wait-master-enabled"]}, [("master", 1), ("worker", 2)])
    pod = sidecar_pod(job, "worker", {"name": "wait-for-master", "image": "x:1"})
    with pytest.raises(PluginError, match=r"plugin pytorch: spec.containers\[1\].name: a container is already named 'wait-for-master'"):
        Chain().mutate(job, pod)


def test_waitfor_container_name_taken() -> None:
    job = make_job({"waitfor": ["--tasks=worker"]}, [("master", 1), ("worker", 2)])
    pod = sidecar_pod(job, "master", {"name": "wait-for-tasks", "image": "x:1"})
    with pytest.raises(PluginError, match=r"plugin waitfor: spec.containers\[1\].name: a container is already named 'wait-for-tasks'"):
        Chain().mutate(job, pod)
    template = make_job({"waitfor": ["--tasks=worker"]}, [("master", 1), ("worker", 2)],
                        containers=[{"name": "wait-for-tasks", "image": "x:1"}])
    with pytest.raises(PluginError, match=r"spec.tasks\[0\].template.spec.containers\[0\].name: a container is already named"):
        Chain().check(template)


def test_waitfor_script_over_one_argument_refused() -> None:
    """The script names each waited task: past what Linux passes in one argument, sh -c would not
    start. Five thousand tasks do that (about 33 bytes each); two thousand do not."""
    tasks = [(f"t{i}", 1) for i in range(5_000)] + [("main", 1)]
    job = make_job({"waitfor": ["--tasks=" + ",".join(t for t, _ in tasks[:-1]), "--waiters=main"]}, tasks)
    with pytest.raises(PluginError) as info:
        Chain().check(job)
    assert str(info.value).startswith("job default/big: plugin waitfor: --tasks: the wait script for 5000 tasks would be ")
    assert "over 131071 bytes, the most Linux passes in one command-line argument" in str(info.value)
    fewer = make_job({"waitfor": ["--tasks=" + ",".join(f"t{i}" for i in range(2_000)), "--waiters=main"]},
                     [(f"t{i}", 1) for i in range(2_000)] + [("main", 1)])
    pod = Chain().mutate(fewer, make_pod(fewer, "main", 0)).pod
    assert len(pod["spec"]["initContainers"][0]["command"][2]) < ENV_STRING_LIMIT


def test_env_names_are_never_repeated() -> None:
    """The API server accepts a repeated env name (with a warning); the chain never makes one: an
    existing entry of the same name is replaced in place."""
    job = make_job({"env": [], "svc": [], "pytorch": []}, [("master", 1), ("worker", 2)])
    pod = make_pod(job, "worker", 1)
    pod["spec"]["containers"][0]["env"] = [{"name": "RANK", "value": "7"}, {"name": "VC_TASK_INDEX", "value": "x"}]
    env = Chain().mutate(job, pod).pod["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)) and env[:2] == [{"name": "RANK", "value": "2"}, {"name": "VC_TASK_INDEX", "value": "1"}]


def test_same_volume_at_the_same_path_is_no_conflict() -> None:
    job = make_job({"svc": []}, [("worker", 2)])
    pod = make_pod(job, "worker", 0)
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "big-svc", "mountPath": "/etc/volcano", "readOnly": True}]
    result = Chain().mutate(job, pod)
    assert result.pod["spec"]["containers"][0]["volumeMounts"] == [{"name": "big-svc", "mountPath": "/etc/volcano", "readOnly": True}]


def test_hostfile_path_equal_to_ssh_path_is_refused_at_validate_and_by_the_reconciler() -> None:
    job = make_job({"ssh": [], "hostfile": ["--path=/root/.ssh"]}, [("master", 1), ("worker", 2)])
    refusal = (
        "job default/big: plugin hostfile: --path: mounts volume 'big-hostfile' at '/root/.ssh', where plugin ssh mounts "
        "volume 'big-ssh'; the API server requires a container's mount paths to be unique"
    )
    for call in (Chain().check, Chain().resources):
        with pytest.raises(PluginError) as info:
            call(job)
        assert str(info.value) == refusal


# ---------------------------------------------------------------------------------------------
# Through the webhook: /validate and /mutate answer with the refusal


@pytest.mark.anyio
async def test_webhook_validate_and_mutate_billion_replicas(client: Any, jobs_dir: Any) -> None:
    raw = job_object({"mpi": []}, [("master", 1), ("worker", BILLION)])
    (jobs_dir / "big.yaml").write_text(yaml.safe_dump(raw))
    with bounded_memory(16 * 1024 * 1024):
        validate = (await client.post("/validate", json=admission_review(raw, uid="v-1"))).json()["response"]
        pod = make_pod(Job.from_object(raw), "master", 0)
        mutate = (await client.post("/mutate", json=admission_review(pod, uid="m-1"))).json()["response"]
    for answer in (validate, mutate):
        assert answer["allowed"] is False
        assert answer["status"]["message"].startswith("job default/big: plugin svc: spec.tasks[1].replicas: the host files ")
    assert json.dumps(validate["status"]) == json.dumps(mutate["status"])
