"""The ``cluster_domain`` setting (docs/plugins.md#fully-qualified-host-names): every host name the
plugins this project runs write is ``<host>.<subdomain>.<namespace>.svc.<domain>``, none of what
Volcano's controller runs is, the sizes the plugins weigh are those of the longer names, the scripts
that count names write and wait for the same ones, host-network Pods resolve them, and the setting
comes from config.yaml, the environment and the CLI's ``--config``."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.jobs import task as job_task
from tests.helpers.jobs import volcano_job
from volcano_job_webhook.cli import main
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.plugins import Chain, ChainConfig, Job, PluginError, Settings
from volcano_job_webhook.plugins.budget import task_hosts
from volcano_job_webhook.plugins.builtin import svc as svc_module
from volcano_job_webhook.plugins.keys import VOLCANO_PLUGINS
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.workloads import read_workload

DOMAIN = "cluster.local"
FQDN = Chain(config=ChainConfig(settings=Settings(cluster_domain=DOMAIN)))


def _job(plugins: dict[str, list[str]] | None, annotated: dict[str, list[str]] | None = None, *,
         tasks: tuple[tuple[str, int], ...] = (("master", 1), ("worker", 3))) -> dict[str, Any]:
    return volcano_job("fq", namespace="ml", uid="e0000000-0000-4000-8000-000000002790", plugins=plugins, annotation=annotated or None,
                       tasks=[job_task(name, replicas, pod={"restartPolicy": "OnFailure", "containers": [
                           {"name": name, "image": "busybox:1.36.1", "resources": {"limits": {"cpu": "1"}}}]}) for name, replicas in tasks])


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value, Secret data decoded."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


# A host name of job fq wherever it is written, and what follows it.
NAME = re.compile(r"fq-(?:master|worker|head)-\d+\.fq((?:\.[a-z0-9-]+)*)")


def _names_written(chain: Chain, job_obj: dict[str, Any]) -> dict[str, set[str]]:
    """The suffix after ``<pod>.fq`` of every host name in every Pod of the job and in its objects."""
    job = Job.from_object(job_obj)
    texts: list[str] = []
    for task in job.tasks:
        for index in range(task.replicas):
            texts += _strings(chain.mutate(job, make_pod(job, task.name, index)).pod["spec"])
    for obj in chain.resources(job):
        data = obj.get("data") or {}
        if obj["kind"] == "Secret":
            data = {k: __import__("base64").b64decode(v).decode() for k, v in data.items() if k == "config"}
        texts += _strings(data)
    found: dict[str, set[str]] = {}
    for text in texts:
        for match in NAME.finditer(text):
            found.setdefault(match.group(1), set()).add(match.group(0))
    return found


EVERY_WRITER = {  # every plugin that writes host names, all this project's
    "svc": ["--publish-not-ready-addresses"], "ssh": [], "pytorch": ["--wait-master-enabled"], "tensorflow": ["--ps=master"], "mpi": [],
    "hostfile": ["--include-master"], "jax": [], "xgboost": [], "paddle": [], "torchrun": [], "waitfor": ["--tasks=worker"],
}


def test_every_host_name_this_project_writes_is_fully_qualified() -> None:
    found = _names_written(FQDN, _job(EVERY_WRITER))
    assert set(found) == {f".ml.svc.{DOMAIN}"}, found
    # And the Ray worker's --address (ray wants a head task of its own).
    ray = _names_written(FQDN, _job({"ray": []}, tasks=(("head", 1), ("worker", 2))))
    assert set(ray) == {f".ml.svc.{DOMAIN}"}, ray


def test_without_the_setting_names_are_short_as_volcano_writes_them() -> None:
    assert set(_names_written(Chain(), _job(EVERY_WRITER))) == {""}


def test_what_volcanos_controller_runs_keeps_short_names() -> None:
    """The cluster view: spec.plugins' svc, ssh, pytorch, tensorflow and mpi are Volcano's (short, its
    own objects); the annotation's six are ours (fully qualified)."""
    volcano = {k: v for k, v in EVERY_WRITER.items() if k in VOLCANO_PLUGINS}
    ours = {k: v for k, v in EVERY_WRITER.items() if k not in VOLCANO_PLUGINS}
    cluster = Chain(config=ChainConfig(settings=Settings(cluster_domain=DOMAIN), volcano_plugins=frozenset(VOLCANO_PLUGINS)))
    job_obj = _job(volcano, ours)
    job = Job.from_object(job_obj)
    pod = cluster.mutate(job, make_pod(job, "master", 0)).pod
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "fq-master-0.fq"  # pytorch: Volcano's
    assert env["MPI_HOST"].split(",")[0] == "fq-worker-0.fq"  # mpi: Volcano's
    assert json.loads(env["TF_CONFIG"])["cluster"]["ps"] == ["fq-master-0.fq:2222"]  # tensorflow: Volcano's
    assert env["PET_MASTER_ADDR"] == f"fq-master-0.fq.ml.svc.{DOMAIN}"  # torchrun: ours
    assert env["JAX_COORDINATOR_ADDRESS"] == f"fq-master-0.fq.ml.svc.{DOMAIN}:6666"
    objects = {o["metadata"]["name"]: o for o in cluster.resources(job)}
    assert set(objects) == {"fq-hostfile"}  # svc's and ssh's are Volcano's to make
    assert objects["fq-hostfile"]["data"]["hostfile"].startswith(f"fq-master-0.fq.ml.svc.{DOMAIN} slots=1\n")


def test_sizes_are_those_of_the_fully_qualified_names() -> None:
    """Every plugin weighs its lists before building them: the sizes must be the longer names'."""
    job = Job.from_object(_job({"svc": []}, tasks=(("master", 1), ("worker", 1234))))
    fixed = Job.from_object({**_job(None), "spec": {"tasks": [job_task("w", 5, pod={"hostname": "fixed", "subdomain": "other", "containers": []})]}})
    indexed = read_workload({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ij", "namespace": "ml"},
                             "spec": {"completionMode": "Indexed", "completions": 120, "parallelism": 120,
                                      "template": {"spec": {"containers": [], "restartPolicy": "Never"}}}})
    for view in (job, fixed, indexed):
        for task in view.tasks:
            names = view.host_names(task, DOMAIN)
            sized = task_hosts(view, task, cluster_domain=DOMAIN)
            assert sized.joined() == len(",".join(names)) and sized.count == len(names)
            assert all(name.endswith(f".{view.namespace}.svc.{DOMAIN}") for name in names)
            every = task_hosts(view, task, every_replica=True, cluster_domain=DOMAIN)
            assert every.joined() == len(",".join(view.domain_name(task, i, DOMAIN) for i in range(task.replicas)))
    assert indexed.host_names(indexed.tasks[0], DOMAIN)[7] == f"ij-7.ij.ml.svc.{DOMAIN}"


def test_a_name_past_what_dns_allows_is_refused_only_when_qualified() -> None:
    job = Job.from_object({**_job({"svc": []}, tasks=(("w" * 18, 3),)), "metadata": {"name": "j" * 40, "namespace": "n" * 63}})
    Chain().check(job)
    long_domain = "a" * 60 + "." + "b" * 20 + ".example"  # 61 + 1 + 40 + 1 + 63 + 5 + 89: 260 characters
    with pytest.raises(PluginError, match=r"'j+-w+-2\.j+\.n+\.svc\.a+\.b+\.example' is 260 characters, over the 253 of a DNS name"):
        Chain(config=ChainConfig(settings=Settings(cluster_domain=long_domain))).check(job)


def _shell() -> list[str]:
    return ["/bin/sh"]


def test_svc_init_container_writes_the_fully_qualified_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Past the ConfigMap's limit (lowered here) each Pod's init container counts the names itself:
    the same bytes the ConfigMap would hold."""
    monkeypatch.setattr(svc_module, "DATA_LIMIT", 2000)
    job = Job.from_object(_job({"svc": []}, tasks=(("master", 1), ("worker", 60))))
    pod = FQDN.mutate(job, make_pod(job, "worker", 0)).pod
    [init] = [c for c in pod["spec"]["initContainers"] if c["name"] == svc_module.INIT_CONTAINER]
    config_map = next(o for o in FQDN.resources(job) if o["kind"] == "ConfigMap")
    assert "worker.host" not in config_map["data"]  # left out, to be written in the Pod
    source, target = tmp_path / "cm", tmp_path / "etc-volcano"
    source.mkdir()
    target.mkdir()
    for key, value in config_map["data"].items():
        (source / key).write_text(value)
    command = init["command"]
    done = subprocess.run([*_shell(), "-c", command[2], command[3], str(source), str(target)],
                          capture_output=True, text=True, timeout=60, check=False, env={"PATH": os.environ["PATH"], "LC_ALL": "C"})
    assert done.returncode == 0, done.stderr
    worker = job.task("worker")
    assert worker is not None
    assert (target / "worker.host").read_text() == "\n".join(job.host_names(worker, DOMAIN))


NSLOOKUP = """#!/bin/sh
echo "$1" >> {log}
exit 0
"""


def test_waitfor_looks_each_fully_qualified_name_up_as_it_is(tmp_path: Path) -> None:
    job = Job.from_object(_job(None, {"waitfor": ["--tasks=worker", "--timeout=0"]}))
    pod = FQDN.mutate(job, make_pod(job, "master", 0)).pod
    [init] = [c for c in pod["spec"]["initContainers"] if c["name"] == "wait-for-tasks"]
    stubs, log = tmp_path / "bin", tmp_path / "asked.log"
    stubs.mkdir()
    (stubs / "nslookup").write_text(NSLOOKUP.format(log=log))
    (stubs / "nslookup").chmod(0o755)
    log.touch()
    done = subprocess.run([*_shell(), "-c", init["command"][2]], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": os.pathsep.join([str(stubs), os.environ["PATH"]]), "LC_ALL": "C"})
    assert done.returncode == 0, done
    worker = job.task("worker")
    assert worker is not None
    # No search domain tried: one question per Pod, its whole name with the root's dot.
    assert log.read_text().split() == [f"{name}." for name in job.host_names(worker, DOMAIN)]


def test_the_setting_from_the_file_the_environment_and_its_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("cluster_domain: corp.example\n")
    assert load_settings(str(config)).chain_config().settings.cluster_domain == "corp.example"
    monkeypatch.setenv("VOLCANO_WEBHOOK_CLUSTER_DOMAIN", "k8s.internal")
    assert load_settings().chain().config.settings.cluster_domain == "k8s.internal"
    for bad in ("cluster.local.", "Cluster.Local", "-x.local"):
        monkeypatch.setenv("VOLCANO_WEBHOOK_CLUSTER_DOMAIN", bad)
        with pytest.raises(ValueError, match=r"DNS domain such as cluster\.local"):
            load_settings()
    monkeypatch.delenv("VOLCANO_WEBHOOK_CLUSTER_DOMAIN")
    assert load_settings().chain_config().settings.cluster_domain is None


def test_mutate_shows_them(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(f"cluster_domain: {DOMAIN}\n")
    job = _job({"svc": []}, {"torchrun": []}, tasks=(("master", 1), ("worker", 2)))
    job["spec"]["tasks"][1]["template"]["spec"]["hostNetwork"] = True
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    args = ["mutate", "--job", str(tmp_path / "job.yaml"), "--task", "worker", "--index", "1", "--config", str(tmp_path / "config.yaml")]
    for view in ([], ["--cluster"]):
        code = main([*args, *view])
        out, err = capsys.readouterr()
        assert code == 0, err
        pod = json.loads(out)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["PET_MASTER_ADDR"] == f"fq-master-0.fq.ml.svc.{DOMAIN}"
        assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    code = main(["resources", "--job", str(tmp_path / "job.yaml"), "--config", str(tmp_path / "config.yaml"), "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    [config_map] = [o for o in json.loads(out) if o["metadata"]["name"] == "fq-svc"]
    assert config_map["data"]["VC_WORKER_HOSTS"] == f"fq-worker-0.fq.ml.svc.{DOMAIN},fq-worker-1.fq.ml.svc.{DOMAIN}"
