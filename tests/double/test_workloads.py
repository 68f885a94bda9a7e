"""Indexed Jobs and JobSets (docs/workloads.md): their views, every built-in plugin on each, the
webhook's lookup and /validate, the offline CLI, and the reconciler's objects owned by the workload.

The Pods here are built as the Job controller and JobSet build them (plugins/podgen.py, from
../shared/real-kubernetes.md and JobSet's ``labelAndAnnotateObject``); the real Job controller's own
Pods are in tests/apiserver/test_envtest_workloads.py, where a kube-controller-manager is at hand. Why the API
double: the workloads' admission and reconciliation through an API server on a machine without
kube-apiserver (coverage without the real parts), and discovery failing on cue (fault injection).
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.jobs import loaded
from volcano_job_webhook.plugins import Chain, IndexedJob, Job, JobSet, PluginError, read_workload
from volcano_job_webhook.plugins.kinds import BATCH_JOB, JOBSET
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.workloads import opted_in, require_opt_in
from volcano_job_webhook.server.admission import AdmissionRequest, read_review
from volcano_job_webhook.server.handlers import JobCache, JobValidator, PodMutator, workload_of
from volcano_job_webhook.server.jobs import DirectoryJobSource
from volcano_job_webhook.server.metrics import WebhookMetrics

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workloads"
ANNOTATION = "volcano-job-webhook/plugins"
OPT_IN = "volcano-job-webhook/enabled"


def indexed_job(name: str = "idx", completions: int = 3, plugins: dict[str, list[str]] | None = None,
                **spec: Any) -> dict[str, Any]:
    obj = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": {ANNOTATION: json.dumps(plugins if plugins is not None else {"env": []})}},
        "spec": {"completionMode": "Indexed", "completions": completions, "parallelism": completions,
                 "template": {"metadata": {"labels": {OPT_IN: "true"}},
                              "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    obj["spec"].update(spec)
    return obj


def jobset(name: str = "js", plugins: dict[str, list[str]] | None = None, **network: Any) -> dict[str, Any]:
    def replicated(rj: str, replicas: int, completions: int) -> dict[str, Any]:
        return {"name": rj, "replicas": replicas, "template": {"spec": {
            "completions": completions, "parallelism": completions,
            "template": {"metadata": {"labels": {OPT_IN: "true"}},
                         "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}

    obj: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": {ANNOTATION: json.dumps(plugins if plugins is not None else {"env": []})}},
        "spec": {"replicatedJobs": [replicated("leader", 1, 1), replicated("workers", 2, 3)]},
    }
    if network:
        obj["spec"]["network"] = network
    return obj


def wire(obj: dict[str, Any], task: str, index: int) -> dict[str, Any]:
    job = read_workload(obj)
    return Chain().mutate(job, make_pod(job, task, index)).pod


def env(pod: dict[str, Any], container: int = 0) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][container].get("env", [])}


# The views ------------------------------------------------------------------------------------------


def test_indexed_job_is_one_task_of_its_completions():
    job = read_workload(indexed_job())
    assert isinstance(job, IndexedJob)
    (task,) = job.tasks
    assert (task.name, task.replicas) == ("idx", 3)
    assert job.host_names(task) == ["idx-0.idx", "idx-1.idx", "idx-2.idx"]
    assert job.pod_selector() == {"batch.kubernetes.io/job-name": "idx"}
    assert job.owner_reference()["apiVersion"] == "batch/v1" and job.owner_reference()["kind"] == "Job"


def test_indexed_job_task_name_and_subdomain_come_from_the_job():
    obj = indexed_job()
    obj["metadata"]["annotations"]["volcano-job-webhook/task"] = "trainer"
    obj["spec"]["template"]["spec"]["subdomain"] = "net"
    obj["spec"]["template"]["spec"]["hostname"] = "ignored"  # the Job controller sets <job>-<index>
    job = read_workload(obj)
    assert job.tasks[0].name == "trainer"
    assert job.host_names(job.tasks[0]) == ["idx-0.net", "idx-1.net", "idx-2.net"]


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"completionMode": "NonIndexed"}, "spec.completionMode", "only Indexed Jobs"),
    ({"completions": None, "parallelism": 2}, "spec.completions", "needs spec.completions"),
    ({"completions": -1}, "spec.completions", "non-negative"),
])
def test_indexed_job_problems_name_the_field(change, field, words):
    obj = indexed_job(**change)
    with pytest.raises(PluginError) as caught:
        read_workload(obj)
    assert caught.value.field == field and words in str(caught.value) and "ml/idx" in str(caught.value)


def test_jobset_tasks_are_replicated_jobs_of_replicas_times_completions():
    job = read_workload(jobset())
    assert isinstance(job, JobSet)
    assert [(t.name, t.replicas) for t in job.tasks] == [("leader", 1), ("workers", 6)]
    workers = job.task("workers")
    assert job.host_labels(workers) == [f"js-workers-{j}-{c}" for j in range(2) for c in range(3)]
    assert job.host_names(workers)[0] == "js-workers-0-0.js"
    assert job.own_service
    assert job.pod_selector() == {"jobset.sigs.k8s.io/jobset-name": "js"}


def test_jobset_subdomain_and_dns_switch():
    named = read_workload(jobset(subdomain="net"))
    assert named.host_names(named.task("leader")) == ["js-leader-0-0.net"]
    off = read_workload(jobset(enableDNSHostnames=False))
    assert not off.own_service  # JobSet makes no Service: svc makes one, named after the JobSet
    assert off.host_names(off.task("leader")) == ["js-leader-0-0.js"]


def test_host_label_sizes_match_the_names():
    """budget sizes names from counts: the count must be the names' real length."""
    for obj in (indexed_job(completions=1234), jobset()):
        job = read_workload(obj)
        for task in job.tasks:
            assert job.host_label_chars(task) == sum(map(len, job.host_labels(task))), task.name
    big = jobset()
    big["spec"]["replicatedJobs"][1]["replicas"] = 12
    big["spec"]["replicatedJobs"][1]["template"]["spec"]["completions"] = 11
    job = read_workload(big)
    task = job.task("workers")
    assert job.host_label_chars(task) == sum(map(len, job.host_labels(task)))


def test_index_of_a_pod():
    job = read_workload(jobset())
    pod = make_pod(job, "workers", 4)
    assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] == "1"
    assert pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert pod["spec"]["hostname"] == "js-workers-1-1" == job.pod_name("workers", 4)
    assert (job.task_of(pod), job.index_of(pod)) == ("workers", "4")


# Every built-in plugin that fits, on each kind ------------------------------------------------------


def test_env_and_svc_on_an_indexed_job():
    obj = indexed_job(plugins={"env": [], "svc": []})
    pod = wire(obj, "idx", 2)
    variables = env(pod)
    assert variables["VC_TASK_INDEX"] == variables["VK_TASK_INDEX"] == "2"
    assert variables["VC_IDX_HOSTS"] == {"configMapKeyRef": {"name": "idx-svc", "key": "VC_IDX_HOSTS"}}
    assert pod["spec"]["hostname"] == "idx-2" and pod["spec"]["subdomain"] == "idx"
    objects = {(o["kind"], o["metadata"]["name"]): o for o in Chain().resources(read_workload(obj))}
    assert set(objects) == {("ConfigMap", "idx-svc"), ("Service", "idx"), ("NetworkPolicy", "idx")}
    assert objects[("ConfigMap", "idx-svc")]["data"]["idx.host"] == "idx-0.idx\nidx-1.idx\nidx-2.idx"
    assert objects[("Service", "idx")]["spec"]["selector"] == {"batch.kubernetes.io/job-name": "idx"}
    for o in objects.values():
        (ref,) = o["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "batch/v1", "kind": "Job", "name": "idx", "uid": "uid-idx",
                       "controller": True, "blockOwnerDeletion": True}


def test_svc_on_a_jobset_makes_no_second_service():
    obj = jobset(plugins={"svc": []})
    kinds = sorted(o["kind"] for o in Chain().resources(read_workload(obj)))
    assert kinds == ["ConfigMap", "NetworkPolicy"]
    data = next(o for o in Chain().resources(read_workload(obj)) if o["kind"] == "ConfigMap")["data"]
    assert data["VC_WORKERS_NUM"] == "6" and data["leader.host"] == "js-leader-0-0.js"
    pod = wire(obj, "workers", 5)
    assert pod["spec"]["subdomain"] == "js" and pod["spec"]["hostname"] == "js-workers-1-2"


def test_torchrun_on_an_indexed_job_ranks_by_completion_index():
    obj = indexed_job(plugins={"torchrun": ["--nproc-per-node=1"]})
    for index in range(3):
        variables = env(wire(obj, "idx", index))
        assert variables["PET_NODE_RANK"] == str(index)
        assert variables["PET_NNODES"] == "3"
        assert variables["PET_MASTER_ADDR"] == "idx-0.idx"


def test_pytorch_tensorflow_mpi_hostfile_on_a_jobset():
    plugins = {"pytorch": ["--master=leader", "--worker=workers"], "tensorflow": ["--ps=leader", "--worker=workers"],
               "mpi": ["--master=leader", "--worker=workers"], "hostfile": ["--master=leader", "--worker=workers"]}
    obj = jobset(plugins=plugins)
    leader, worker = wire(obj, "leader", 0), wire(obj, "workers", 4)
    assert env(worker)["MASTER_ADDR"] == "js-leader-0-0.js" and env(worker)["RANK"] == "5"
    tf = json.loads(env(worker)["TF_CONFIG"])
    assert tf["cluster"]["ps"] == ["js-leader-0-0.js:2222"]
    assert tf["cluster"]["worker"][4] == "js-workers-1-1.js:2222" and tf["task"] == {"type": "worker", "index": 4}
    assert env(leader)["MPI_HOST"].split(",")[5] == "js-workers-1-2.js"
    hostfile = next(o for o in Chain().resources(read_workload(obj)) if o["metadata"]["name"] == "js-hostfile")
    lines = hostfile["data"]["hostfile"].splitlines()
    assert len(lines) == 6 and lines[0] == "js-workers-0-0.js slots=1" and lines[5] == "js-workers-1-2.js slots=1"


def test_jax_xgboost_paddle_waitfor_hcclrank_ssh_on_a_jobset():
    plugins = {"jax": ["--coordinator=leader"], "xgboost": ["--tracker=leader"], "paddle": ["--master=leader"],
               "waitfor": ["--tasks=leader"], "hcclrank": ["--master=leader", "--worker=workers"], "ssh": []}
    obj = jobset(plugins=plugins)
    pod = wire(obj, "workers", 3)
    variables = env(pod)
    assert variables["JAX_PROCESS_ID"] == "4" and variables["JAX_NUM_PROCESSES"] == "7"
    assert variables["DMLC_TRACKER_URI"] == "js-leader-0-0.js"
    assert variables["PADDLE_RANK"] == "4"
    assert pod["metadata"]["annotations"]["hccl/rankIndex"] == "4"
    (wait,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "wait-for-tasks"]
    assert "js-leader-0-0.js" in wait["command"][2]
    secret = next(o for o in Chain().resources(read_workload(obj)) if o["kind"] == "Secret")
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "JobSet"


@pytest.mark.parametrize("obj", [indexed_job(plugins={"ray": []}), jobset(plugins={"ray": []})], ids=["indexed", "jobset"])
def test_ray_is_refused_with_the_reason(obj):
    with pytest.raises(PluginError) as caught:
        Chain().check(read_workload(obj))
    assert caught.value.plugin == "ray" and "KubeRay" in str(caught.value) and "ml/" in str(caught.value)


def test_a_bad_flag_names_workload_plugin_and_argument():
    with pytest.raises(PluginError) as caught:
        Chain().check(read_workload(indexed_job(plugins={"svc": ["--no-such-flag"]})))
    text = str(caught.value)
    assert "ml/idx" in text and "svc" in text and "--no-such-flag" in text


def test_a_host_list_too_long_for_the_configmap_is_refused_on_a_jobset():
    """An Indexed Job's host names are counted, and svc writes what the ConfigMap cannot hold in the
    Pods; a JobSet's have two counters, so the job is refused instead of half-served."""
    big = jobset(plugins={"svc": []})
    big["spec"]["replicatedJobs"][1]["replicas"] = 3000
    big["spec"]["replicatedJobs"][1]["template"]["spec"]["completions"] = 20
    with pytest.raises(PluginError, match="cannot be written by counting"):
        Chain().check(read_workload(big))
    warnings = Chain().check(read_workload(indexed_job(completions=100_000, plugins={"svc": []})))
    assert any("init container" in w for w in warnings), warnings


def test_opt_in_is_required_where_plugins_are_named():
    obj = indexed_job()
    del obj["spec"]["template"]["metadata"]["labels"][OPT_IN]
    assert opted_in(obj)  # the annotation still says it wants plugins
    with pytest.raises(PluginError, match="lacks the label volcano-job-webhook/enabled"):
        require_opt_in(read_workload(obj))
    require_opt_in(read_workload(indexed_job()))
    plain = indexed_job()
    del plain["metadata"]["annotations"]
    del plain["spec"]["template"]["metadata"]
    assert not opted_in(plain)


def test_volcano_jobs_are_read_as_before():
    obj = yaml.safe_load((ROOT / "examples" / "jobs" / "pytorch-job.yaml").read_text())
    assert type(read_workload(obj)) is Job
    no_version = {k: v for k, v in obj.items() if k != "apiVersion"}
    assert type(read_workload(no_version)) is Job


# The webhook ------------------------------------------------------------------------------------


def request(obj: dict[str, Any], *, group: str, version: str, kind: str, operation: str = "CREATE",
            old: dict[str, Any] | None = None) -> AdmissionRequest:
    body = {"uid": "u", "kind": {"group": group, "version": version, "kind": kind}, "operation": operation,
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "namespace": obj["metadata"].get("namespace", "default"), "object": obj}
    if old is not None:
        body["oldObject"] = old
    request = read_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}).request
    assert request is not None
    return request


def pod_request(pod: dict[str, Any]) -> AdmissionRequest:
    return request(pod, group="", version="v1", kind="Pod")


@pytest.fixture
def source(tmp_path: Path) -> DirectoryJobSource:
    """The example workloads as the API server holds them, with a uid: the one the views give the
    example files, so that a Pod made from a file is its workload's (and one naming another uid is not)."""
    for path in EXAMPLES.glob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        obj["metadata"]["uid"] = read_workload(obj).uid
        (tmp_path / path.name).write_text(yaml.safe_dump(obj))
    src = DirectoryJobSource(tmp_path)
    src.start()
    yield src
    src.stop()


def mutator(source: DirectoryJobSource) -> PodMutator:
    return PodMutator(source, JobCache(Chain()), WebhookMetrics())


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_pods_of_an_indexed_job_and_a_jobset_are_wired(source):
    async def run() -> None:
        await loaded(source)
        mutate = mutator(source)
        idx = read_workload(example("torchrun-indexed-job.yaml"))
        response = await mutate(pod_request(make_pod(idx, idx.tasks[0].name, 1)))
        assert response.allowed and response.result == "patched", response
        assert any(op["path"].endswith("/env") or "PET_NODE_RANK" in json.dumps(op) for op in response.patch)
        js = read_workload(example("jax-jobset.yaml"))
        response = await mutate(pod_request(make_pod(js, "workers", 2)))
        assert response.allowed and response.result == "patched"
        assert "JAX_PROCESS_ID" in json.dumps(response.patch)
    asyncio.run(run())


def test_an_opted_in_pod_of_a_missing_or_replaced_workload_is_said(source):
    async def run() -> None:
        await loaded(source)
        mutate = mutator(source)
        idx = read_workload(example("torchrun-indexed-job.yaml"))
        pod = make_pod(idx, idx.tasks[0].name, 0)
        pod["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
        replaced = await mutate(pod_request(pod))
        assert replaced.allowed and replaced.result == "no-job"
        assert "is not the Pod's owner (uid someone-else)" in replaced.warnings[0]
        other = copy.deepcopy(pod)
        other["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "nowhere"
        response = await mutate(pod_request(other))
        assert response.allowed and response.result == "no-job"
        assert "Job ml/nowhere not found" in " ".join(response.warnings) or "not found" in " ".join(response.warnings)
        stray = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "labels": {OPT_IN: "true"}},
                 "spec": {"containers": [{"name": "c", "image": "x"}]}}
        response = await mutate(pod_request(stray))
        assert response.allowed and response.warnings and "not wired" in response.warnings[0]
    asyncio.run(run())


def test_which_workload_a_pod_belongs_to():
    idx = read_workload(indexed_job())
    assert workload_of(make_pod(idx, "idx", 0)) == (BATCH_JOB, "idx", "uid-idx")
    js = read_workload(jobset())
    pod = make_pod(js, "workers", 0)
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"], "a JobSet's Pod carries its Job's labels too"
    assert workload_of(pod) == (JOBSET, "js", "uid-js")
    not_opted = make_pod(idx, "idx", 0)
    del not_opted["metadata"]["labels"][OPT_IN]
    assert workload_of(not_opted) is None


def validate(obj: dict[str, Any], **kw: Any):
    group, _, version = obj["apiVersion"].rpartition("/")
    return asyncio.run(JobValidator(Chain())(request(obj, group=group, version=version, kind=obj["kind"], **kw)))


def test_validate_judges_opted_in_workloads():
    assert validate(indexed_job(plugins={"torchrun": []})).allowed
    denied = validate(indexed_job(plugins={"svc": ["--nope"]}))
    assert not denied.allowed and "ml/idx" in denied.message and "--nope" in denied.message
    denied = validate(jobset(plugins={"ray": []}))
    assert not denied.allowed and "ray" in denied.message
    unlabelled = indexed_job()
    del unlabelled["spec"]["template"]["metadata"]
    denied = validate(unlabelled)
    assert not denied.allowed and "spec.template.metadata.labels" in denied.message
    nonindexed = indexed_job(completionMode="NonIndexed")
    assert not validate(nonindexed).allowed
    plain = indexed_job(completionMode="NonIndexed")
    del plain["metadata"]["annotations"]
    assert validate(plain).result == "ignored"  # not ours: any batch Job of the cluster


def test_validate_update_of_an_unchanged_workload_passes():
    obj = indexed_job(plugins={"svc": ["--nope"]})
    labelled = copy.deepcopy(obj)
    labelled["metadata"]["labels"] = {"team": "a"}
    assert validate(labelled, operation="UPDATE", old=obj).allowed


# The offline CLI --------------------------------------------------------------------------------


def test_cli_mutate_builds_the_pod_of_an_indexed_job(capsys):
    from volcano_job_webhook.cli import main

    assert main(["mutate", "--job", str(EXAMPLES / "torchrun-indexed-job.yaml"), "--index", "2"]) == 0
    pod = json.loads(capsys.readouterr().out)
    variables = env(pod)
    assert variables["PET_NODE_RANK"] == "2" and variables["PET_MASTER_ADDR"] == "torchrun-indexed-0.torchrun-indexed"
    assert pod["spec"]["hostname"] == "torchrun-indexed-2"


def test_cli_review_and_resources_take_a_jobset(capsys):
    from volcano_job_webhook.cli import main

    assert main(["review", "--job", str(EXAMPLES / "jax-jobset.yaml"), "--task", "workers", "--index", "3"]) == 0
    review = json.loads(capsys.readouterr().out)
    assert review["request"]["object"]["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] == "1"
    assert main(["resources", "--job", str(EXAMPLES / "jax-jobset.yaml")]) == 0
    out = list(yaml.safe_load_all(capsys.readouterr().out))
    assert sorted(o["kind"] for o in out if o) == ["ConfigMap", "NetworkPolicy"]


# The reconciler, against the API double --------------------------------------------------------

BATCH_JOBS_TYPE = ("batch", "v1", "jobs", "Job")
JOBSETS_TYPE = ("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
OWNED = {"configmaps": "ConfigMap", "services": "Service", "secrets": "Secret", "networkpolicies.networking.k8s.io": "NetworkPolicy"}


@pytest.fixture
def workload_api(api_double):
    from tests.helpers.apiserver import ResourceType

    api_double.register_resource(ResourceType(*BATCH_JOBS_TYPE, status=True))
    api_double.register_resource(ResourceType(*JOBSETS_TYPE, custom=True, status=True))
    return api_double


def owned_objects(server) -> dict[tuple[str, str], dict[str, Any]]:
    return {(kind, o["metadata"]["name"]): o for resource, kind in OWNED.items() for o in server.objects(resource)}


def test_the_reconciler_makes_keeps_and_deletes_workload_objects(workload_api):
    from tests.helpers.envtest import wait_until
    from tests.helpers.jobs import example_job
    from volcano_job_webhook.config import WebhookSettings
    from volcano_job_webhook.reconciler import Reconciler

    server = workload_api
    reconciler = Reconciler(server.api_client(), WebhookSettings(resync_seconds=3600), Chain())  # the default workloads: both
    reconciler.start()
    try:
        wait_until(lambda: reconciler.manager.ready, 10, "caches synced")
        idx = server.put_object(indexed_job("idx", plugins={"svc": [], "ssh": []}))
        js = server.put_object(jobset("js", plugins={"svc": []}))
        plain = indexed_job("plain")
        del plain["metadata"]["annotations"]
        del plain["spec"]["template"]["metadata"]
        server.put_object(plain)
        volcano = example_job("svc")  # a Volcano Job beside them, reconciled as ever
        server.put_object(volcano)
        expected = {("ConfigMap", "idx-svc"), ("Service", "idx"), ("NetworkPolicy", "idx"), ("Secret", "idx-ssh"),
                    ("ConfigMap", "js-svc"), ("NetworkPolicy", "js")}
        wait_until(lambda: expected <= set(owned_objects(server)), 10, "the workloads' objects")
        objects = owned_objects(server)
        for (kind, name), obj in objects.items():
            (ref,) = obj["metadata"]["ownerReferences"]
            if name.startswith("idx"):
                assert (ref["apiVersion"], ref["kind"], ref["uid"]) == ("batch/v1", "Job", idx["metadata"]["uid"]), kind
            elif name.startswith("js"):
                assert (ref["apiVersion"], ref["kind"], ref["uid"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet", js["metadata"]["uid"])
            else:
                assert ref["kind"] == "Job" and ref["apiVersion"] == "batch.volcano.sh/v1alpha1"
        assert not any(name.startswith("plain") for _, name in objects), "a Job that did not opt in gets nothing"
        assert ("Service", "js") not in objects, "JobSet makes its own Service"

        # Drift is repaired; a finished Job's and a deleted JobSet's objects go; the Volcano Job's stay.
        before = owned_objects(server)[("ConfigMap", "js-svc")]["metadata"]["uid"]
        server.delete_object("configmaps", "js-svc", "ml")
        wait_until(lambda: owned_objects(server).get(("ConfigMap", "js-svc"), {}).get("metadata", {}).get("uid") not in (None, before),
                   10, "the deleted ConfigMap made again")
        done = server.get_object("jobs.batch", "idx", "ml")
        done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        server.put_object(done)
        wait_until(lambda: not any(n.startswith("idx") for _, n in owned_objects(server)), 10, "the finished Job's objects deleted")
        server.delete_object("jobsets.jobset.x-k8s.io", "js", "ml")
        wait_until(lambda: not any(n.startswith("js") for _, n in owned_objects(server)), 10, "the deleted JobSet's objects deleted")
        assert {k for k in owned_objects(server) if k[1].startswith("svc-demo")}, "the Volcano Job's objects are untouched"
    finally:
        reconciler.stop()


def test_hostfile_on_an_indexed_job_lists_its_one_task_once():
    obj = indexed_job(plugins={"hostfile": ["--format=openmpi"]})
    (cm,) = [o for o in Chain().resources(read_workload(obj)) if o["metadata"]["name"] == "idx-hostfile"]
    assert cm["data"]["hostfile"] == "idx-0.idx slots=1\nidx-1.idx slots=1\nidx-2.idx slots=1\n"
    pod = wire(obj, "idx", 1)
    assert env(pod)["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    with pytest.raises(PluginError, match="master and worker must be different tasks"):
        Chain().check(read_workload(indexed_job(plugins={"hostfile": ["--master=idx", "--worker=idx"]})))


def test_a_jobsets_own_jobs_are_not_workloads_of_their_own():
    """JobSet copies its template's labels (the opt-in one too) into the Jobs it makes: those Jobs
    are the JobSet's; the reconciler makes nothing for them and /validate leaves them alone."""
    js = read_workload(jobset(plugins={"svc": ["--nope"]}))
    task = js.task("workers")
    child = {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": "js-workers-0", "namespace": "ml", "uid": "child",
                          "labels": {"jobset.sigs.k8s.io/jobset-name": "js"},
                          "annotations": {ANNOTATION: json.dumps({"svc": ["--nope"]})}},
             "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3, "template": dict(task.template)}}
    assert not opted_in(child)
    assert validate(child).result == "ignored"
    assert not validate(jobset(plugins={"svc": ["--nope"]})).allowed  # the JobSet itself is judged


def test_a_workload_kind_not_served_leaves_the_reconciler_ready(api_double):
    """JobSet not installed: its cache is synced as empty (and looked for again), so the reconciler is
    ready and serves the other kinds."""
    from tests.helpers.apiserver import ResourceType
    from tests.helpers.envtest import wait_until
    from volcano_job_webhook.config import WebhookSettings
    from volcano_job_webhook.plugins.kinds import JOBSET
    from volcano_job_webhook.reconciler import Reconciler

    api_double.register_resource(ResourceType(*BATCH_JOBS_TYPE, status=True))
    reconciler = Reconciler(api_double.api_client(), WebhookSettings(resync_seconds=3600), Chain())
    reconciler.start()
    try:
        wait_until(lambda: reconciler.manager.ready, 10, "caches synced")
        assert reconciler.manager.caches[JOBSET].served is False
    finally:
        reconciler.stop()
