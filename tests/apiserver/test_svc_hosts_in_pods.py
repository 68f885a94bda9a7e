"""svc past the ConfigMap's 1 MiB: jobs of up to 100,000 Pods and more, every Pod's
``/etc/volcano`` holding the files Volcano's ConfigMap would hold (``plugins/builtin/svc.py``).

The init container's script runs for real, under ``/bin/sh`` with this machine's tools and under
busybox's ``sh`` with nothing but busybox's applets on ``PATH`` (as in the ``busybox`` image), on a
directory laid out as the kubelet lays out a ConfigMap volume (keys as links through ``..data``).
What it leaves is compared byte for byte with the host lists computed here, independently of the
plugin, and, with ``VOLCANO_REF`` set, with the ConfigMap Volcano's own svc code builds for the same
job (vcref's fake API server has no size limit). Without busybox the busybox runs skip.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from kubernetes import client as kube_client
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import create as create_object
from tests.helpers.envtest import delete, status_message
from tests.helpers.jobs import volcano_job
from tests.helpers.schema import validate_object, validate_pod
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.budget import DATA_LIMIT, GENERATED_LIMIT, STORE_LIMIT, task_hosts
from volcano_job_webhook.plugins.podgen import make_pod

BUSYBOX = shutil.which("busybox")
INIT = "volcano-svc-hosts"
Obj = dict[str, Any]


def job_object(name: str, tasks: list[tuple[str, int, Obj]], plugins: Obj | None = None) -> Obj:
    return volcano_job(name, tasks=tasks, plugins=plugins or {"svc": []}, uid="e0000000-0000-4000-8000-00000000b16", image="x:1",
                       minAvailable=1)


def volcano_files(job_obj: Obj) -> dict[str, str]:
    """Every key of Volcano's ``<job>-svc`` ConfigMap (``GenerateHosts``), written out here from the
    job alone: ``<hostname or job-task-i>.<subdomain or job>``, one per replica, or one when the
    template fixes the hostname; ``-`` in the task name becomes ``_``."""
    name = job_obj["metadata"]["name"]
    files: dict[str, str] = {}
    for task in job_obj["spec"]["tasks"]:
        spec = task["template"]["spec"]
        subdomain = spec.get("subdomain") or name
        if spec.get("hostname"):
            hosts = [f"{spec['hostname']}.{subdomain}"] if task["replicas"] else []
        else:
            hosts = [f"{name}-{task['name']}-{i}.{subdomain}" for i in range(task["replicas"])]
        stem = task["name"].replace("-", "_")
        files[f"{stem}.host"] = "\n".join(hosts)
        files[f"VC_{stem.upper()}_HOSTS"] = ",".join(hosts)
        files[f"VC_{stem.upper()}_NUM"] = str(len(hosts))
    return files


@dataclass(frozen=True)
class Case:
    id: str
    job: Obj
    written: tuple[str, ...]  # host files the init container writes
    left_out: tuple[str, ...]  # VC_<TASK>_HOSTS keys, and files, no Pod gets

    @property
    def volcano_pods(self) -> int:
        return sum(t["replicas"] for t in self.job["spec"]["tasks"])


CASES = [
    # 40,000 workers whose names (43 bytes each) make a 1.7 MB host file.
    Case("40k-workers", job_object("training-run-a", [("worker", 40_000, {})]), ("worker.host",), ("VC_WORKER_HOSTS",)),
    Case(
        "100k-master-and-workers",
        job_object("big", [("master", 1, {}), ("worker", 99_999, {})]),
        ("worker.host",),
        ("VC_WORKER_HOSTS",),
    ),
    # Two tasks of 50,000: the larger host file is written in the Pods, the other fits the ConfigMap
    # (without its comma-joined copy), under the template's subdomain.
    Case(
        "100k-two-tasks-one-written",
        job_object("big", [("alpha", 50_000, {}), ("beta", 50_000, {"subdomain": "grp"})]),
        ("alpha.host",),
        ("VC_ALPHA_HOSTS", "VC_BETA_HOSTS"),
    ),
    Case(
        "100k-two-tasks-both-written",
        job_object("distributed-training", [("alpha", 50_000, {}), ("beta-x", 50_000, {"subdomain": "grp"})]),
        ("alpha.host", "beta_x.host"),
        ("VC_ALPHA_HOSTS", "VC_BETA_X_HOSTS"),
    ),
]


def pods(job: Job) -> list[Obj]:
    """The first and the last Pod of every task."""
    return [make_pod(job, t.name, i) for t in job.tasks for i in sorted({0, t.replicas - 1}) if t.replicas]


def kubelet_config_map(root: Path, data: dict[str, str]) -> Path:
    """``data`` as the kubelet's atomic writer lays out a ConfigMap volume: the files in a
    timestamped directory, ``..data`` linking to it, and each key a link through ``..data``."""
    root.mkdir(parents=True)
    stamp = root / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir()
    for key, value in data.items():
        (stamp / key).write_bytes(value.encode())
        (stamp / key).chmod(0o644)
    (root / "..data").symlink_to(stamp.name)
    for key in data:
        (root / key).symlink_to(f"..data/{key}")
    return root


@dataclass
class Shell:
    name: str
    argv: list[str]  # replaces the container command's "sh"
    path: str


@pytest.fixture(scope="module")
def busybox_applets(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """A directory of busybox's applets, as the busybox image's /bin."""
    if BUSYBOX is None:
        return None
    applets = tmp_path_factory.mktemp("busybox-bin")
    for name in subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split():
        (applets / name).symlink_to(BUSYBOX)
    return applets


@pytest.fixture(params=["sh", "busybox"])
def shell(request: pytest.FixtureRequest, busybox_applets: Path | None) -> Shell:
    if request.param == "sh":
        return Shell("sh", ["/bin/sh"], os.pathsep.join(["/usr/local/bin", "/usr/bin", "/bin"]))
    if busybox_applets is None:
        pytest.skip("busybox is not installed (apt-get install busybox)")
    return Shell("busybox", [str(BUSYBOX), "sh"], str(busybox_applets))


@dataclass
class Written:
    files: dict[str, str]
    modes: set[int]
    out: str


def run_init_container(shell: Shell, container: Obj, config_map: Obj, work: Path, *, into: Path | None = None) -> Written:
    """The init container's command under ``shell``: the ConfigMap at a kubelet-style directory,
    an empty directory (or ``into``) for ``/etc/volcano``. The command's two directory arguments
    are the only change."""
    command = container["command"]
    assert command[:2] == ["sh", "-c"] and command[3:] == [INIT, "/etc/volcano-configmap", "/etc/volcano"]
    assert [(m["name"], m["mountPath"]) for m in container["volumeMounts"]] == [
        (config_map["metadata"]["name"], "/etc/volcano-configmap"),
        (config_map["metadata"]["name"] + "-hosts", "/etc/volcano"),
    ]
    source = kubelet_config_map(work / "configmap", config_map["data"]) if into is None else work / "configmap"
    target = into or work / "etc-volcano"
    target.mkdir(exist_ok=True)
    done = subprocess.run(
        [*shell.argv, "-c", command[2], INIT, str(source), str(target)],
        env={"PATH": shell.path, "LC_ALL": "C"}, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0 and not done.stderr, done
    files = {p.name: p.read_bytes().decode() for p in sorted(target.iterdir())}
    modes = {stat.S_IMODE(p.lstat().st_mode) for p in target.iterdir()}
    assert not any(p.is_symlink() for p in target.iterdir())
    return Written(files, modes, done.stdout)


def wired(case: Case) -> tuple[Job, Chain, Obj, Obj]:
    job = Job.from_object(case.job)
    chain = Chain()
    pod = chain.mutate(job, make_pod(job, job.tasks[-1].name, job.tasks[-1].replicas - 1)).pod
    config_map = next(o for o in chain.resources(job) if o["kind"] == "ConfigMap")
    return job, chain, pod, config_map


# ---------------------------------------------------------------------------------------------
# The script, run


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_init_container_writes_volcanos_files(shell: Shell, case: Case, tmp_path: Path) -> None:
    job, _, pod, config_map = wired(case)
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == INIT and init["image"] == "busybox:1.36.1"
    written = run_init_container(shell, init, config_map, tmp_path)
    expected = {k: v for k, v in volcano_files(case.job).items() if k not in case.left_out}
    assert sorted(written.files) == sorted(expected)
    for key, value in expected.items():  # one by one: a mismatch shows the file, not 4 MB of diff
        assert written.files[key] == value, key
    assert written.modes == {0o644}  # as the ConfigMap volume's files (defaultMode 420)
    assert set(case.written) == set(expected) - set(config_map["data"])
    assert written.out == (
        f"{INIT}: job default/{job.name}: {tmp_path / 'etc-volcano'} holds the keys of ConfigMap {job.name}-svc and "
        + ", ".join(f"{f} ({volcano_files(case.job)[f].count(chr(10)) + 1} hosts)" for f in case.written)
        + "\n"
    )
    # A restarted init container (same emptyDir) leaves the same files.
    again = run_init_container(shell, init, config_map, tmp_path, into=tmp_path / "etc-volcano")
    assert again.files == written.files


needs_vcref = pytest.mark.skipif(not os.environ.get("VOLCANO_REF"), reason="VOLCANO_REF is not set (Volcano's own plugin code)")


def volcano(job_obj: Obj, build: list[Obj]) -> tuple[Obj, list[Obj]]:
    """Volcano's svc ConfigMap data and built Pods for the job (vcref)."""
    done = subprocess.run(
        [os.environ["VOLCANO_REF"]], input=json.dumps({"job": job_obj, "build": build}).encode(),
        capture_output=True, timeout=120, check=True,
    )
    result = json.loads(done.stdout)
    assert not result.get("error") and not result.get("pod_errors"), result
    return next(o for o in result["resources"] if o["kind"] == "ConfigMap")["data"], result["pods"]


@needs_vcref
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_files_equal_volcanos_own_config_map(case: Case, tmp_path: Path) -> None:
    """Volcano's svc code on the same job (its ConfigMap could never be stored: vcref's fake API
    server has no limit): every file a Pod sees is that ConfigMap's key, byte for byte."""
    volcano_data, _ = volcano(case.job, [])
    assert len(orjson.dumps(volcano_data)) > DATA_LIMIT  # what the API server refuses
    assert volcano_data == volcano_files(case.job)  # the independent host lists are Volcano's
    _, _, pod, config_map = wired(case)
    sh = Shell("sh", ["/bin/sh"], os.pathsep.join(["/usr/bin", "/bin"]))
    written = run_init_container(sh, pod["spec"]["initContainers"][0], config_map, tmp_path)
    assert written.files == {k: v for k, v in volcano_data.items() if k not in case.left_out}


@needs_vcref
@pytest.mark.parametrize("workers", [5_000, 20_000])
def test_under_the_limit_volcanos_objects(workers: int) -> None:
    """Large jobs whose host files fit: Volcano's ConfigMap and Pod wiring, unchanged (at 20,000
    workers VC_WORKER_HOSTS, 339 KB, is over hosts_env_limit and left out of the containers only,
    as before)."""
    job_obj = job_object("big", [("master", 1, {}), ("worker", workers, {})])
    volcano_data, (volcano_pod,) = volcano(job_obj, [{"task": "worker", "index": workers - 1}])
    job = Job.from_object(job_obj)
    chain = Chain()
    assert next(o for o in chain.resources(job) if o["kind"] == "ConfigMap")["data"] == volcano_data
    ours = chain.mutate(job, make_pod(job, "worker", workers - 1)).pod["spec"]
    theirs = volcano_pod["spec"]
    assert "initContainers" not in ours
    assert ours["volumes"] == theirs["volumes"] == [{"name": "big-svc", "configMap": {"name": "big-svc"}}]
    assert (ours["hostname"], ours["subdomain"]) == (theirs["hostname"], theirs["subdomain"])
    (main,), (reference,) = ours["containers"], theirs["containers"]
    assert main["volumeMounts"] == reference["volumeMounts"] == [{"name": "big-svc", "mountPath": "/etc/volcano"}]
    left_out = {"VC_WORKER_HOSTS"} if workers == 20_000 else set()
    assert main["env"] == [e for e in reference["env"] if e["name"] not in left_out]


def test_template_hostnames_written_and_thousands_of_keys_copied(shell: Shell, tmp_path: Path) -> None:
    """8,500 tasks whose templates fix hostname and subdomain (one 127-byte host each): the
    ConfigMap's 1 MiB holds about 8,200 of their host files; the rest are written one line each,
    and the ConfigMap's 16,000-odd keys are copied in xargs batches."""
    tasks = [(f"t{i}", 2, {"hostname": f"h{i}-" + "a" * (60 - len(str(i))), "subdomain": "s" * 63}) for i in range(8_500)]
    case_job = job_object("many", tasks)
    job = Job.from_object(case_job)
    chain = Chain()
    warnings = chain.check(job)
    result = chain.mutate(job, make_pod(job, "t0", 1))
    config_map = next(o for o in chain.resources(job) if o["kind"] == "ConfigMap")
    written_keys = {f"t{i}.host" for i in range(8_500)} - set(config_map["data"])
    assert 100 < len(written_keys) < 1_000
    assert sum("/etc/volcano/t" in w and "left out of the ConfigMap 'many-svc', which cannot hold it" in w for w in warnings) == len(written_keys)
    script = result.pod["spec"]["initContainers"][0]["command"][2]
    assert script.count("\nwrite_one t") == len(written_keys)
    written = run_init_container(shell, result.pod["spec"]["initContainers"][0], config_map, tmp_path)
    expected = volcano_files(case_job)
    assert sorted(written.files) == sorted(k for k in expected if not k.endswith("_HOSTS"))
    assert all(written.files[k] == expected[k] for k in written.files)


# ---------------------------------------------------------------------------------------------
# The objects


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_object_under_its_limit(case: Case) -> None:
    job = Job.from_object(case.job)
    chain = Chain()
    warnings = chain.check(job)
    assert len(warnings) == len(case.written) + (case.id == "100k-two-tasks-one-written")
    objects = chain.resources(job)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "NetworkPolicy"]
    config_map = objects[0]
    expected = volcano_files(case.job)
    # What fits stays, as Volcano has it; the rest is what every Pod writes or never gets.
    assert config_map["data"] == {k: v for k, v in expected.items() if k not in case.written + case.left_out}
    assert sum(map(len, config_map["data"].values())) <= DATA_LIMIT
    for obj in objects:
        validate_object(obj)
        assert len(orjson.dumps(obj)) < STORE_LIMIT, obj["kind"]
    for pod in pods(job):
        result = chain.mutate(job, pod)
        assert result.warnings == warnings
        validate_pod(result.pod)
        assert len(orjson.dumps(result.pod)) < 64 * 1024
        spec = result.pod["spec"]
        assert [c["name"] for c in spec["initContainers"]] == [INIT]
        assert spec["volumes"] == [
            {"name": f"{job.name}-svc", "configMap": {"name": f"{job.name}-svc"}},
            {"name": f"{job.name}-svc-hosts", "emptyDir": {}},
        ]
        (main,) = spec["containers"]
        assert main["volumeMounts"] == [{"name": f"{job.name}-svc-hosts", "mountPath": "/etc/volcano", "readOnly": True}]
        # Every variable refers to a key the ConfigMap has: a missing one would stop the container.
        refs = [e["valueFrom"]["configMapKeyRef"]["key"] for e in main["env"]]
        assert refs and set(refs) <= set(config_map["data"])
        assert {f"VC_{t.name.replace('-', '_').upper()}_NUM" for t in job.tasks} <= set(refs)
        assert chain.mutate(job, result.pod).pod == result.pod  # idempotent


def test_wiring_a_pod_builds_no_host_list() -> None:
    """Sizes only: a Pod of a 262,144-Pod job (the most whatever the names) is wired in small
    memory; only the reconciler's ConfigMap holds host lists, and only those that fit."""
    job = Job.from_object(job_object("big", [("master", 1, {}), ("worker", 262_143, {})]))
    tracemalloc.start()
    try:
        Chain().mutate(job, make_pod(job, "worker", 262_142))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024


def test_generated_limit_is_exact() -> None:
    """The largest replica count whose host file fits GENERATED_LIMIT is served, one more refused."""
    def job_of(replicas: int) -> Job:
        return Job.from_object(job_object("big", [("worker", replicas, {})]))

    low, high = 1, 10**7
    while low < high:  # the largest count whose host file is at most the limit
        mid = (low + high + 1) // 2
        low, high = (mid, high) if task_hosts(job_of(mid), job_of(mid).tasks[0]).joined() <= GENERATED_LIMIT else (low, mid - 1)
    assert 1_000_000 < low < 2_000_000
    assert Chain().check(job_of(low))
    with pytest.raises(PluginError, match=rf"would be {task_hosts(job_of(low + 1), job_of(low + 1).tasks[0]).joined()} bytes; .* over 33554432 bytes"):
        Chain().check(job_of(low + 1))


def test_any_job_of_262144_pods_fits_whatever_its_names() -> None:
    """Names at their longest: 63-character hostnames (job and task names filling the label) and a
    63-character subdomain."""
    name, task = "j" * 50, "t" * 6  # big-...-262143: 50 + 1 + 6 + 1 + 6 = 64 > 63, so one char less
    job = Job.from_object(job_object(name[:49], [(task, 262_144, {"subdomain": "s" * 63})]))
    assert len(job.pod_name(task, 262_143)) == 63
    assert Chain().check(job)


def test_script_over_one_argument_refused() -> None:
    """One line per host file written: 4,000 tasks of 300 replicas leave about 3,800 host files to
    write, a script over what Linux passes in one argument."""
    job = Job.from_object(job_object("big", [(f"t{i}", 300, {}) for i in range(4_000)]))
    with pytest.raises(PluginError) as info:
        Chain().check(job)
    assert str(info.value).startswith("job default/big: plugin svc: spec.tasks: the script of the init container 'volcano-svc-hosts', writing ")
    assert "over 131071 bytes, the most Linux passes in one command-line argument" in str(info.value)


def test_image_is_pytorchs_wait_master_image() -> None:
    tasks = [("master", 1, {}), ("worker", 99_999, {})]
    job = Job.from_object(job_object("big", tasks, {"pytorch": ["--wait-master-image=registry.local/tools:1"]}))
    pod = Chain().mutate(job, make_pod(job, "worker", 0)).pod
    assert [(c["name"], c["image"]) for c in pod["spec"]["initContainers"]] == [(INIT, "registry.local/tools:1")]
    empty = Job.from_object(job_object("big", tasks, {"pytorch": ["--wait-master-image="]}))
    with pytest.raises(PluginError, match="plugin svc: image: the pytorch plugin's --wait-master-image, which svc's init container"):
        Chain().check(empty)


def test_first_of_the_init_containers_and_kept_apart_from_other_plugins() -> None:
    """Before the template's own init containers (they see /etc/volcano filled) and pytorch's
    wait-for-master; env, ssh and the other plugins leave it alone."""
    tasks = [("master", 1, {}), ("worker", 99_999, {"initContainers": [{"name": "prepare", "image": "x:1"}]})]
    job = Job.from_object(job_object("big", tasks, {"pytorch": ["--wait-master-enabled"], "mpi": [], "env": []}))
    chain = Chain()
    pod = chain.mutate(job, make_pod(job, "worker", 7)).pod
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == [INIT, "prepare", "wait-for-master"]
    assert set(init[0]) == {"name", "image", "command", "volumeMounts"}
    assert {m["mountPath"] for m in init[1]["volumeMounts"]} == {"/etc/volcano", "/root/.ssh"}
    validate_pod(pod)
    assert chain.mutate(job, pod).pod == pod


def test_defaulted_init_container_is_left_alone_a_stale_one_replaced() -> None:
    job = Job.from_object(job_object("big", [("worker", 99_999, {})]))
    chain = Chain()
    pod = chain.mutate(job, make_pod(job, "worker", 0)).pod
    init = pod["spec"]["initContainers"][0]
    init.update({"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"})
    for mount in init["volumeMounts"]:
        mount["mountPropagation"] = "None"
    assert chain.mutate(job, pod).pod == pod
    smaller = Job.from_object(job_object("big", [("worker", 99_998, {})]))
    rewired = chain.mutate(smaller, pod).pod["spec"]["initContainers"]
    assert len(rewired) == 1 and "write_hosts worker.host big-worker 99998 big" in rewired[0]["command"][2]


def test_name_and_mount_conflicts_refused() -> None:
    tasks: list[tuple[str, int, Obj]] = [("worker", 99_999, {"initContainers": [{"name": INIT, "image": "x:1"}]})]
    with pytest.raises(PluginError, match=r"spec.tasks\[0\].template.spec.initContainers\[0\].name: a container is already named 'volcano-svc-hosts'"):
        Chain().check(Job.from_object(job_object("big", tasks)))
    # Under the limit nothing is injected, so the name is the template's to use.
    small = Job.from_object(job_object("big", [("worker", 3, {"initContainers": [{"name": INIT, "image": "x:1"}]})]))
    assert Chain().check(small) == []
    mounted = [("worker", 99_999, {
        "containers": [{"name": "main", "image": "x:1", "volumeMounts": [{"name": "conf", "mountPath": "/etc/volcano"}]}],
        "volumes": [{"name": "conf", "emptyDir": {}}],
    })]
    with pytest.raises(PluginError, match="volume 'big-svc-hosts' cannot be mounted there too"):
        Chain().check(Job.from_object(job_object("big", mounted)))
    long_name = Job.from_object(job_object("a" * 54, [("w", 60_000, {})]))
    with pytest.raises(PluginError, match=r"plugin svc: volume name: '(a){54}-svc-hosts' is 64 characters"):
        Chain().check(long_name)


# ---------------------------------------------------------------------------------------------
# Through a real API server


Api = tuple[kube_client.ApiClient, str]


def create(api: Api, obj: Obj) -> tuple[int, str]:
    """Create ``obj`` in the test's namespace (stored in etcd, so etcd's limit applies) and delete it
    again: the status code and, for a refusal, its message."""
    client, namespace = api
    body = json.loads(json.dumps(obj))
    body["metadata"]["namespace"] = namespace
    body["metadata"].pop("ownerReferences", None)  # no Job here to own it
    try:
        create_object(client, body)
    except ApiException as exc:
        return int(exc.status), status_message(exc)
    delete(client, body["apiVersion"], body["kind"], body["metadata"]["name"], namespace)
    return 201, ""


@pytest.fixture
def api(kube_admin: kube_client.ApiClient, kube_namespace: str) -> tuple[kube_client.ApiClient, str]:
    return kube_admin, kube_namespace


@pytest.mark.parametrize("case", CASES[1:2], ids=lambda c: c.id)
def test_hundred_thousand_pod_job_accepted(api: Api, case: Case) -> None:
    """The side objects and the first and last wired Pods of each task of the 100,000-Pod job are
    stored; Volcano's ConfigMap for the same job (4.2 MB) does not even pass the 3 MiB request limit."""
    job = Job.from_object(case.job)
    chain = Chain()
    for obj in chain.resources(job):
        assert create(api, obj) == (201, ""), obj["kind"]
    for pod in pods(job):
        assert create(api, chain.mutate(job, pod).pod) == (201, "")
    volcano = {**chain.resources(job)[0], "data": volcano_files(case.job)}
    code, message = create(api, volcano)
    assert code == 413, message
