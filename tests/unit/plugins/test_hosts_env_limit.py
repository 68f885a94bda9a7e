"""Host lists that scale: a task whose VC_<TASK>_HOSTS would pass ``hosts_env_limit`` gets no such
variable (one environment string over 128 KiB stops a container), with a warning; below the limit
nothing changes from Volcano's behaviour."""

from tests.helpers.jobs import task, volcano_job
from tests.helpers.schema import validate_pod
from volcano_job_webhook.plugins import Chain, ChainConfig, Job, Settings
from volcano_job_webhook.plugins.podgen import make_pod


def big_job(replicas: int) -> Job:
    return Job.from_object(volcano_job("large-training-run", plugins={"svc": []}, uid="u", tasks=[
        task("master", 1, container="m", image="x"), task("worker", replicas, container="w", image="x"),
    ]))


def env_names(pod: dict) -> list[str]:
    return [e["name"] for e in pod["spec"]["containers"][0]["env"]]


def test_5000_replicas_wired_within_the_limit_with_a_warning():
    job = big_job(5000)
    hosts_len = len(",".join(job.host_names(job.task("worker"))))
    assert hosts_len > 100_000
    result = Chain().mutate(job, make_pod(job, "worker", 4999))
    validate_pod(result.pod)
    assert env_names(result.pod) == ["VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_NUM"]
    assert result.warnings == [
        (f"job default/large-training-run: plugin svc: task 'worker': VC_WORKER_HOSTS left out: its host list is "
        f"{hosts_len} bytes, over the hosts_env_limit of 100000; read /etc/volcano/worker.host instead")
    ]
    # The ConfigMap still carries every host, for the mounted files.
    data = Chain().resources(job)[0]["data"]
    assert data["VC_WORKER_NUM"] == "5000" and len(data["worker.host"].splitlines()) == 5000


def test_below_the_limit_and_without_a_limit_nothing_changes():
    small = big_job(100)
    assert env_names(Chain().mutate(small, make_pod(small, "worker", 0)).pod) == [
        "VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_HOSTS", "VC_WORKER_NUM"]
    unlimited = Chain(config=ChainConfig(settings=Settings(hosts_env_limit=None)))
    job = big_job(2500)
    assert 100_000 < len(",".join(job.host_names(job.task("worker")))) < 131_000
    result = unlimited.mutate(job, make_pod(job, "worker", 0))
    assert "VC_WORKER_HOSTS" in env_names(result.pod) and result.warnings == []


def test_without_a_limit_the_kernel_limit_still_holds():
    """hosts_env_limit=None lifts our limit, not Linux's: a 245 KB NAME=value string (over
    MAX_ARG_STRLEN, 131,072 bytes) would stop the container, so it is left out all the same."""
    unlimited = Chain(config=ChainConfig(settings=Settings(hosts_env_limit=None)))
    job = big_job(5000)
    result = unlimited.mutate(job, make_pod(job, "worker", 0))
    assert env_names(result.pod) == ["VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_NUM"]
    size = len(",".join(job.host_names(job.task("worker"))))
    assert size > 131_072
    assert result.warnings == [
        (f"job default/large-training-run: plugin svc: task 'worker': VC_WORKER_HOSTS left out: its host list is {size} "
        "bytes, over 131072 bytes for NAME=value, the most Linux passes in one environment string (MAX_ARG_STRLEN); "
        "read /etc/volcano/worker.host instead")
    ]
