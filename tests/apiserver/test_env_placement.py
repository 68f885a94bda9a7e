"""``$(NAME)`` references to the variables the plugins inject, under Kubernetes' own expansion rule
(docs/plugins.md#variables-first-name-references-that-expand).

The kubelet expands ``$(NAME)`` in a container's ``env`` only from entries before it
(tests/helpers/expansion.py, Kubernetes' expand.go ported with its own test cases here), and every plugin
appends after the container's own variables, so ``NODE_RANK=$(RANK)`` stays ``$(RANK)``. With
placement ``first`` (the job's annotation ``volcano-job-webhook/env-placement`` or the setting
``env_placement``) the variables of the plugins we run go before the container's own and every
reference to one expands, for every example job; those of the plugins Volcano's controller runs
stay where it writes them. The patch inserts rather than rewrites, a wired Pod gives an empty patch,
and the API server stores the Pods as the chain makes them: on an API server with the webhook
(envtest), and beside Volcano's controller. What a real kubelet starts the container with:
tests/on_node/test_kubelet_expansion.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from kubernetes import client as kube_client
from pydantic import ValidationError

from tests.apiserver.test_envtest_admission import (  # noqa: F401 (webhook, registered: that module's fixtures, used here)
    Registered,
    comparable,
    expected_pod,
    registered,
    webhook,
)
from tests.helpers.cluster import VolcanoCluster, product_webhook
from tests.helpers.envtest import create, read
from tests.helpers.expansion import container_env, expand, mapping_func_for
from tests.helpers.jobs import EXAMPLES, scheduled_job
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.plugins import Chain, ChainConfig, Job, PluginError, Settings
from volcano_job_webhook.plugins.keys import ENV_PLACEMENT_ANNOTATION, VOLCANO_PLUGINS
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.patch import make_patch

Obj = dict[str, Any]

# ---------------------------------------------------------------------------------------------------
# Kubernetes' expansion: expand_test.go's cases


# Context of TestMapping, and the same split in two for TestMappingDual.
CONTEXT = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}
DUAL = ({"VAR_A": "A", "VAR_EMPTY": ""}, {"VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)"})

# doExpansionTest's cases: (name, input, expected).
EXPANSION_CASES = [
    ("whole string", "$(VAR_A)", "A"),
    ("repeat", "$(VAR_A)-$(VAR_A)", "A-A"),
    ("beginning", "$(VAR_A)-1", "A-1"),
    ("middle", "___$(VAR_B)___", "___B___"),
    ("end", "___$(VAR_C)", "___C"),
    ("compound", "$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
    ("escape & expand", "$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
    ("compound escape", "$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"),
    ("mixed in escapes", "f000-$$VAR_A", "f000-$VAR_A"),
    ("backslash escape ignored", "foo\\$(VAR_C)bar", "foo\\Cbar"),
    ("backslash escape ignored, two", "foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
    ("lots of backslashes", "foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
    ("nested var references", "$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
    ("nested var references second type", "$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
    ("value is a reference", "$(VAR_REF)", "$(VAR_A)"),
    ("value is a reference x 2", "%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"),
    ("empty var", "foo$(VAR_EMPTY)bar", "foobar"),
    ("unterminated expression", "foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"),
    ("expression without operator", "f00__(VAR_A)__", "f00__(VAR_A)__"),
    ("shell special vars pass through", "$?_boo_$!", "$?_boo_$!"),
    ("bare operators are ignored", "$VAR_A", "$VAR_A"),
    ("undefined vars are passed through", "$(VAR_DNE)", "$(VAR_DNE)"),
    ("multiple (even) operators, var undefined", "$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
    ("multiple (even) operators, var defined", "$$$$$$(VAR_A)", "$$$(VAR_A)"),
    ("multiple (odd) operators, var undefined", "$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"),
    ("multiple (odd) operators, var defined", "$$$$$$$(VAR_A)", "$$$A"),
    ("missing open expression", "$VAR_A)", "$VAR_A)"),
    ("shell syntax ignored", "${VAR_A}", "${VAR_A}"),
    ("trailing incomplete expression not consumed", "$(VAR_B)_______$(A", "B_______$(A"),
    ("trailing incomplete expression, no content, is not consumed", "$(VAR_C)_______$(", "C_______$("),
    ("operator at end of input string is preserved", "$(VAR_A)foobarzab$", "Afoobarzab$"),
    ("shell escaped incomplete expr", "foo-\\$(VAR_A", "foo-\\$(VAR_A"),
    ("lots of $( in middle", "--$($($($($--", "--$($($($($--"),
    ("lots of $( in beginning", "$($($($($--foo$(", "$($($($($--foo$("),
    ("lots of $( at end", "foo0--$($($($(", "foo0--$($($($("),
    ("escaped operators in variable names are not escaped", "$(foo$$var)", "$(foo$$var)"),
    ("newline not expanded", "\n", "\n"),
]


@pytest.mark.parametrize("contexts", [(CONTEXT,), DUAL], ids=["TestMapping", "TestMappingDual"])
@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in EXPANSION_CASES], ids=[c[0] for c in EXPANSION_CASES])
def test_expand_as_kubernetes_does(text: str, expected: str, contexts: tuple[dict[str, str], ...]) -> None:
    assert expand(text, mapping_func_for(*contexts)) == expected


def test_map_reference() -> None:
    """TestMapReference: each variable expanded in turn, against a context it updates."""
    envs = [("FOO", "bar"), ("ZOO", "$(FOO)-1"), ("BLU", "$(ZOO)-2")]
    declared = {"FOO": "bar", "ZOO": "$(FOO)-1", "BLU": "$(ZOO)-2"}
    mapping = mapping_func_for(declared, {})
    for name, value in envs:
        declared[name] = expand(value, mapping)
    assert declared == {"FOO": "bar", "ZOO": "bar-1", "BLU": "bar-1-2"}


def test_the_kubelet_expands_a_variable_only_from_those_before_it() -> None:
    pod = {"metadata": {"name": "p-0", "namespace": "ns", "labels": {"app": "x"}}}
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "EARLY", "value": "$(LATER)-$(CM_KEY)-$(SERVICE_HOST)"},
            {"name": "LATER", "value": "later"},
            {"name": "AFTER", "value": "$(LATER)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "FROM_MAP", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "REF"}}},
            {"name": "LATER", "value": "again $(LATER) $(POD)"},
            {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "NONE", "optional": True}}},
        ],
    }
    env = container_env(pod, container, config_maps={"cm": {"KEY": "k", "REF": "$(LATER)"}},
                        service_env={"SERVICE_HOST": "10.0.0.1"})
    assert env == {
        "CM_KEY": "k", "CM_REF": "$(LATER)", "SERVICE_HOST": "10.0.0.1",
        "EARLY": "$(LATER)-k-10.0.0.1",  # LATER is not defined yet: left as written
        "LATER": "again later p-0", "AFTER": "later", "POD": "p-0",
        "FROM_MAP": "$(LATER)",  # a valueFrom is never expanded
    }


def test_the_service_variable_fills_a_reference_the_container_has_not_defined_yet() -> None:
    env = container_env({}, {"env": [{"name": "A", "value": "$(B)"}, {"name": "B", "value": "b"}]}, service_env={"B": "svc"})
    assert env == {"A": "svc", "B": "b"}


# ---------------------------------------------------------------------------------------------------
# The chain: every injected variable referred to by a variable of the container's own

EXAMPLE_JOBS = sorted(EXAMPLES.glob("*-job.yaml"))
FIRST = Chain(config=ChainConfig(settings=Settings(env_placement="first")))


def example(path: Path) -> Obj:
    obj: Obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    return obj


def with_placement(obj: Obj, placement: str | None) -> Obj:
    out = copy.deepcopy(obj)
    annotations = out["metadata"].setdefault("annotations", {})
    if placement is None:
        annotations.pop(ENV_PLACEMENT_ANNOTATION, None)
    else:
        annotations[ENV_PLACEMENT_ANNOTATION] = placement
    return out


def injected_names(obj: Obj, task: str, index: int) -> dict[str, list[str]]:
    """The variables the chain adds to each container the template has (by container name)."""
    job = Job.from_object(obj)
    pod = make_pod(job, task, index)
    before = {c["name"]: {e["name"] for e in c.get("env") or []} for c in all_containers(pod)}
    wired = Chain().mutate(job, pod).pod
    return {c["name"]: [e["name"] for e in c.get("env") or [] if e["name"] not in before[c["name"]]]
            for c in all_containers(wired) if c["name"] in before}


def all_containers(pod: Obj) -> list[Obj]:
    return [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]


def refer_to(obj: Obj, names: dict[str, list[str]]) -> Obj:
    """``obj`` whose every template container named in ``names`` has, after its own variables,
    ``REF_<NAME>=$(<NAME>)`` for each of its names."""
    out = copy.deepcopy(obj)
    for task in out["spec"]["tasks"]:
        spec = task["template"]["spec"]
        for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
            refs = [{"name": f"REF_{n}", "value": f"$({n})"} for n in names.get(container["name"], [])]
            container["env"] = [*(container.get("env") or []), *refs]
    return out


def objects_data(job: Job, kind: str) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o.get("data") or {} for o in Chain().resources(job) if o["kind"] == kind}


def started_env(job: Job, pod: Obj, container: Obj) -> dict[str, str]:
    """What the kubelet starts ``container`` with, the job's side objects as the reconciler makes them."""
    return container_env(pod, container, config_maps=objects_data(job, "ConfigMap"), secrets=objects_data(job, "Secret"))


def pods_of(obj: Obj) -> Iterator[tuple[str, int]]:
    for task in obj["spec"]["tasks"]:
        yield from ((task["name"], i) for i in sorted({0, task["replicas"] - 1}))


# (the chain, the job's annotation, whether references expand)
PLACEMENTS = {
    "annotation first": (Chain(), "first", True),
    "setting first": (FIRST, None, True),
    "annotation last over setting first": (FIRST, "last", False),
    "default": (Chain(), None, False),
}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("path", EXAMPLE_JOBS, ids=lambda p: p.stem)
def test_every_injected_variable_expands_in_the_containers_own_when_placed_first(path: Path, placement: str) -> None:
    chain, annotation, expands = PLACEMENTS[placement]
    base = example(path)
    checked = 0
    for task, index in pods_of(base):
        names = injected_names(base, task, index)
        job = Job.from_object(with_placement(refer_to(base, names), annotation))
        wired = chain.mutate(job, make_pod(job, task, index)).pod
        for container in all_containers(wired):
            env = started_env(job, wired, container)
            for name in names.get(container["name"], []):
                assert env[f"REF_{name}"] == (env[name] if expands else f"$({name})"), (task, index, container["name"], name)
                checked += 1
    if path.stem == "ssh":
        assert checked == 0, "ssh injects no variable"
    else:
        assert checked >= 4, f"{path.stem}: only {checked} references checked"


# What users write (kubernetes#121523, jobset#592, volcano#868), and what it becomes on worker 1.
USER_VARIABLES = [
    ("pytorch", "worker", 1, {"NODE_RANK": "$(RANK)", "DIST_URL": "tcp://$(MASTER_ADDR):$(MASTER_PORT)"},
     {"NODE_RANK": "2", "DIST_URL": "tcp://pytorch-demo-master-0.pytorch-demo:23456"}),
    ("env", "worker", 1, {"MY_HOST": "worker-$(VC_TASK_INDEX)"}, {"MY_HOST": "worker-1"}),
    ("torchrun", "worker", 1, {"NODE_RANK": "$(PET_NODE_RANK)", "LOG_DIR": "/logs/rank-$(PET_NODE_RANK)"},
     {"NODE_RANK": "2", "LOG_DIR": "/logs/rank-2"}),
    ("svc", "worker", 1, {"PEERS": "$(VC_WORKER_HOSTS)"}, {"PEERS": "svc-demo-worker-0.svc-demo,svc-demo-worker-1.svc-demo"}),
]


@pytest.mark.parametrize(("name", "task", "index", "variables", "expanded"), USER_VARIABLES, ids=[u[0] for u in USER_VARIABLES])
def test_what_users_write_expands_with_placement_first_and_not_by_default(
        name: str, task: str, index: int, variables: dict[str, str], expanded: dict[str, str]) -> None:
    obj = example(EXAMPLES / f"{name}-job.yaml")
    for t in obj["spec"]["tasks"]:
        t["template"]["spec"]["containers"][0]["env"] = [{"name": k, "value": v} for k, v in variables.items()]
    for placement, want in (("first", expanded), (None, variables)):
        job = Job.from_object(with_placement(obj, placement))
        wired = Chain().mutate(job, make_pod(job, task, index)).pod
        env = started_env(job, wired, wired["spec"]["containers"][0])
        assert {k: env[k] for k in variables} == want, placement


# ---------------------------------------------------------------------------------------------------
# The patch, idempotency, and what the placement does not move


def torchrun_job(placement: str | None = "first") -> Obj:
    obj = example(EXAMPLES / "torchrun-job.yaml")
    for t in obj["spec"]["tasks"]:
        t["template"]["spec"]["containers"][0]["env"] = [{"name": "NODE_RANK", "value": "$(PET_NODE_RANK)"}]
    return with_placement(obj, placement)


def test_the_patch_inserts_in_front_and_a_wired_pod_gives_an_empty_one() -> None:
    job = Job.from_object(torchrun_job())
    pod = make_pod(job, "worker", 0)
    wired = Chain().mutate(job, pod).pod
    env = wired["spec"]["containers"][0]["env"]
    assert env[-1] == {"name": "NODE_RANK", "value": "$(PET_NODE_RANK)"}
    assert [e["name"] for e in env[:-1]] == ["VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_HOSTS", "VC_WORKER_NUM",
                                              "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE"]
    patch = make_patch(pod, wired)
    env_ops = [op for op in patch if op["path"].startswith("/spec/containers/0/env")]
    assert env_ops == [{"op": "add", "path": f"/spec/containers/0/env/{i}", "value": e} for i, e in enumerate(env[:-1])]
    assert jsonpatch.apply_patch(pod, patch) == wired

    again = Chain().mutate(job, wired)
    assert again.pod == wired and make_patch(wired, again.pod) == []

    # Re-invoked after another webhook appended a variable: nothing of ours moves again.
    other = copy.deepcopy(wired)
    other["spec"]["containers"][0]["env"].append({"name": "SIDECAR", "value": "$(NODE_RANK)"})
    assert make_patch(other, Chain().mutate(job, other).pod) == []


def test_a_pod_wired_with_the_default_keeps_its_order_under_placement_first() -> None:
    """Placement applies to what the chain adds; a Pod already wired has nothing added, and is left
    as it is (an empty patch), whichever placement wired it."""
    last = Job.from_object(torchrun_job(None))
    wired_last = Chain().mutate(last, make_pod(last, "master", 0)).pod
    first = Job.from_object(torchrun_job("first"))
    assert make_patch(wired_last, Chain().mutate(first, wired_last).pod) == []


def test_a_user_variable_of_an_injected_name_stays_where_the_user_put_it() -> None:
    """A variable the plugin sets that the container already has is given the plugin's value in
    place (as by default): its position is the user's."""
    obj = torchrun_job()
    del obj["metadata"]["annotations"]["volcano-job-webhook/plugins"]
    obj["spec"]["plugins"] = {"env": []}
    for t in obj["spec"]["tasks"]:
        t["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "a"}, {"name": "VC_TASK_INDEX", "value": "9"},
                                                          {"name": "B", "value": "$(VC_TASK_INDEX)"}]
    job = Job.from_object(obj)
    wired = Chain().mutate(job, make_pod(job, "worker", 1)).pod
    env = wired["spec"]["containers"][0]["env"]
    assert env == [{"name": "VK_TASK_INDEX", "value": "1"}, {"name": "A", "value": "a"},
                   {"name": "VC_TASK_INDEX", "value": "1"}, {"name": "B", "value": "$(VC_TASK_INDEX)"}]
    assert started_env(job, wired, wired["spec"]["containers"][0])["B"] == "1"


BESIDE = Chain(config=ChainConfig(volcano_plugins=frozenset(VOLCANO_PLUGINS), settings=Settings(env_placement="first")))


def beside_job() -> Obj:
    """env and pytorch in spec.plugins (Volcano's controller runs them); torchrun in our annotation,
    and svc, which neither names, brought in: ours. Volcano's plugins run between ours in the chain's order."""
    obj = torchrun_job(None)
    obj["spec"]["plugins"] = {"env": [], "pytorch": ["--master=master", "--worker=worker"]}
    for t in obj["spec"]["tasks"]:
        t["template"]["spec"]["containers"][0]["env"] = [
            {"name": "NODE_RANK", "value": "$(PET_NODE_RANK)"}, {"name": "TORCH_RANK", "value": "$(RANK)"},
            {"name": "INDEX", "value": "$(VC_TASK_INDEX)"}, {"name": "HOSTS", "value": "$(VC_WORKER_HOSTS)"}]
    return obj


def test_beside_volcano_its_variables_stay_where_its_controller_writes_them() -> None:
    job = Job.from_object(beside_job())
    prepared = BESIDE.prepare(job)
    assert prepared.volcano == {"env", "pytorch"} and {p.name for p in prepared.ours} == {"svc", "torchrun"}
    pod = make_pod(job, "worker", 1)
    sent = prepared.volcano_part(pod).pod  # as Volcano's controller creates it: appended, as always
    sent_env = sent["spec"]["containers"][0]["env"]
    assert [e["name"] for e in sent_env[:4]] == ["NODE_RANK", "TORCH_RANK", "INDEX", "HOSTS"]
    wired = prepared.mutate(sent, volcano_wired=True).pod  # the webhook's part
    env = wired["spec"]["containers"][0]["env"]
    ours = len(env) - len(sent_env)
    assert env[ours:] == sent_env, "Volcano's entries, and the container's own, exactly as they came"
    assert {e["name"] for e in env[:ours]} == {"VC_MASTER_HOSTS", "VC_MASTER_NUM", "VC_WORKER_HOSTS", "VC_WORKER_NUM",
                                               "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE"}
    assert prepared.mutate(pod).pod == wired, "one run of every plugin wires the Pod as the two makers do"
    assert make_patch(wired, prepared.mutate(wired, volcano_wired=True).pod) == []
    started = started_env(job, wired, wired["spec"]["containers"][0])
    assert started["NODE_RANK"] == "2" and started["HOSTS"] == "torchrun-demo-worker-0.torchrun-demo,torchrun-demo-worker-1.torchrun-demo"
    assert (started["TORCH_RANK"], started["INDEX"]) == ("$(RANK)", "$(VC_TASK_INDEX)"), "Volcano's come after: not expanded"


def test_a_bad_placement_names_the_job_and_the_annotation() -> None:
    job = Job.from_object(torchrun_job("middle"))
    message = "job default/torchrun-demo: metadata.annotations[volcano-job-webhook/env-placement]: must be first or last, got 'middle'"
    for call in (lambda: Chain().check(job), lambda: Chain().mutate(job, make_pod(job, "master", 0)), lambda: Chain().resources(job)):
        with pytest.raises(PluginError) as info:
            call()
        assert str(info.value) == message


def test_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert load_settings().chain_config().settings.env_placement == "last"
    monkeypatch.setenv("VOLCANO_WEBHOOK_ENV_PLACEMENT", "first")
    assert load_settings().chain_config().settings.env_placement == "first"
    monkeypatch.delenv("VOLCANO_WEBHOOK_ENV_PLACEMENT")
    config = tmp_path / "config.yaml"
    config.write_text("env_placement: middle\n", encoding="utf-8")
    with pytest.raises(ValidationError, match="env_placement"):
        load_settings(str(config))


# ---------------------------------------------------------------------------------------------------
# A real API server


def test_the_api_server_stores_the_pods_the_webhook_wires_first(
        registered: Registered, kube_admin: kube_client.ApiClient, kube_namespace: str) -> None:  # noqa: F811
    """Through the webhook (every plugin ours here, docs/install.md#who-runs-what): the Pod stored is
    the offline chain's, its insertions accepted, and the references expand."""
    for name in ("torchrun", "pytorch", "jax"):
        obj = with_placement(example(EXAMPLES / f"{name}-job.yaml"), "first")
        task, index = obj["spec"]["tasks"][-1]["name"], obj["spec"]["tasks"][-1]["replicas"] - 1
        obj = refer_to(obj, injected_names(obj, task, index))
        obj["metadata"]["namespace"] = kube_namespace
        job = Job.from_object(create(kube_admin, obj))
        pod = make_pod(job, task, index)
        expected = expected_pod(kube_admin, job, pod)
        created = create(kube_admin, pod)
        stored = read(kube_admin, "v1", "Pod", created["metadata"]["name"], kube_namespace)
        assert stored is not None
        assert comparable(stored) == comparable(expected.after), name
        container = stored["spec"]["containers"][0]
        env = started_env(job, stored, container)
        refs = [e["name"] for e in container["env"] if e["name"].startswith("REF_")]
        assert len(refs) >= 7 and all(env[r] == env[r.removeprefix("REF_")] for r in refs), (name, env)


@pytest.fixture
def beside(cluster: VolcanoCluster, tmp_path: Path) -> Iterator[VolcanoCluster]:
    """The webhook (``serve --job-source kube``, Volcano's eight left to its controller) registered."""
    with ExitStack() as stack:
        served = stack.enter_context(product_webhook(cluster, tmp_path))
        cluster.register_webhooks(served.base_url, served.ca_bundle)
        yield cluster


def test_beside_volcanos_controller_ours_go_first_and_its_stay_where_it_writes_them(beside: VolcanoCluster) -> None:
    """Volcano's controller wires env and svc (spec.plugins), the webhook torchrun (our annotation)
    with placement first: what the API server stores is what ``volcano-webhook mutate --cluster``
    shows (Volcano's part in the order its controller ran its plugins), the container's own
    variables then Volcano's after ours."""
    c = beside
    template = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"], "env": [
        {"name": "NODE_RANK", "value": "$(PET_NODE_RANK)"}, {"name": "INDEX", "value": "$(VC_TASK_INDEX)"}]}]}
    obj = scheduled_job("pj", plugins={"svc": [], "env": []}, annotation={"torchrun": []}, pod=template)
    obj["metadata"]["annotations"][ENV_PLACEMENT_ANNOTATION] = "first"
    made = c.create(obj)
    c.inqueue("pj")
    pods = c.wait(lambda: len(found := c.pods("pj")) == 3 and found, "the Pods of pj")
    job = Job.from_object(made)
    prepared = Chain(config=ChainConfig(volcano_plugins=frozenset(VOLCANO_PLUGINS))).prepare(job)
    svc = c.get("ConfigMap", "pj-svc")
    assert svc is not None
    for pod in pods:
        task, index = job.task_of(pod), int(job.index_of(pod) or 0)
        offline = prepared.mutate(prepared.volcano_part(make_pod(job, task, index)).pod, volcano_wired=True).pod
        env, want = pod["spec"]["containers"][0]["env"], offline["spec"]["containers"][0]["env"]
        assert env[:7] == want[:7], json.dumps(env)
        # Volcano's controller runs its plugins in its map's order (docs/volcano-behaviour.md#plugin-order).
        assert sorted(json.dumps(e, sort_keys=True) for e in env[7:]) == sorted(json.dumps(e, sort_keys=True) for e in want[7:])
        names = [e["name"] for e in env]
        assert names[:5] == ["PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE"]
        assert names[5:7] == ["NODE_RANK", "INDEX"] and "VC_TASK_INDEX" in names[7:], names
        started = container_env(pod, pod["spec"]["containers"][0], config_maps={"pj-svc": svc["data"]})
        rank = 0 if task == "master" else index + 1
        assert (started["NODE_RANK"], started["INDEX"]) == (str(rank), "$(VC_TASK_INDEX)")
