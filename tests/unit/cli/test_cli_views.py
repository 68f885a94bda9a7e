"""The offline commands as a new user meets them: the two views (offline, ``--cluster``) and the line
naming each, indexes a task has no Pod for, ``resources`` refusing what ``mutate`` refuses, ``review``
no stricter than the cluster, an AdmissionReview as ``mutate``'s POD, ``-o``, ``--version``, and
messages that say what was meant."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import EXAMPLES
from volcano_job_webhook import __version__
from volcano_job_webhook.cli import main
from volcano_job_webhook.plugins.registry import default_registry

PYTORCH = EXAMPLES / "jobs" / "pytorch-job.yaml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, argv: list[str], message: str) -> str:
    """Exit 2, nothing on stdout, and one line on stderr: the command's name, then ``message``."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert err == f"volcano-webhook {argv[0]}: {message}\n"
    return err


def write_job(tmp_path: Path, obj: dict, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def pytorch(**changes) -> dict:
    obj = yaml.safe_load(PYTORCH.read_text())
    obj["spec"].update(changes)
    return obj


# An index the task has no Pod for ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["mutate", "review"])
@pytest.mark.parametrize(
    ("replicas", "index", "words"),
    [
        (3, "99", "--index 99: the task has 3 replicas, indexes 0 to 2"),
        (3, "3", "--index 3: the task has 3 replicas, indexes 0 to 2"),
        (1, "1", "--index 1: the task has 1 replica, index 0 only"),
        (0, "7", "--index 7: the task has 0 replicas, so no Pod to build"),
        (3, "-1", "--index -1: an index is 0 or more (the task has 3 replicas)"),
    ],
)
def test_an_index_outside_the_task_is_refused(capsys, tmp_path, command, replicas, index, words):
    obj = pytorch()
    obj["spec"]["tasks"][1]["replicas"] = replicas
    job = write_job(tmp_path, obj)
    refused(capsys, [command, "--job", job, "--task", "worker", "--index", index], f"job default/pytorch-demo: task worker: {words}")


def test_the_last_index_is_built(capsys, tmp_path):
    obj = pytorch()
    obj["spec"]["tasks"][1]["replicas"] = 3
    code, out, _ = run(capsys, "mutate", "--job", write_job(tmp_path, obj), "--task", "worker", "--index", "2")
    env = {e["name"]: e.get("value") for e in json.loads(out)["spec"]["containers"][0]["env"]}
    assert code == 0 and (env["WORLD_SIZE"], env["RANK"]) == ("4", "3")


def test_an_index_outside_an_indexed_job_is_refused_the_same_way(capsys):
    job = str(EXAMPLES / "workloads" / "torchrun-indexed-job.yaml")
    refused(capsys, ["mutate", "--job", job, "--index", "3"],
            "job default/torchrun-indexed: task torchrun-indexed: --index 3: the task has 3 replicas, indexes 0 to 2")


# resources refuses what mutate refuses ----------------------------------------------------------


def bad_jobs() -> dict[str, dict]:
    flag = pytorch()
    flag["spec"]["plugins"] = {"env": ["--foo"]}
    long_name = yaml.safe_load((EXAMPLES / "jobs" / "svc-job.yaml").read_text())
    long_name["metadata"]["name"] = "j" * 70
    unknown = pytorch(plugins={"pytoch": []})
    ours = pytorch()
    ours["metadata"]["annotations"] = {"volcano-job-webhook/plugins": json.dumps({"jax": ["--coordinator=nope"]})}
    return {"unknown flag": flag, "70-character name": long_name, "unknown plugin": unknown, "our plugin's argument": ours}


@pytest.mark.parametrize("view", [[], ["--cluster"]], ids=["offline", "cluster"])
@pytest.mark.parametrize("case", sorted(bad_jobs()))
def test_resources_refuses_a_job_exactly_as_mutate_does(capsys, tmp_path, case, view):
    job = write_job(tmp_path, bad_jobs()[case])
    mutate = run(capsys, "mutate", "--job", job, "--task", "worker", *view)
    resources = run(capsys, "resources", "--job", job, *view)
    assert mutate[0] == resources[0]
    if mutate[0] == 2:
        assert resources[1] == "" and resources[2].count("\n") == 1
        assert resources[2].removeprefix("volcano-webhook resources: ") == mutate[2].removeprefix("volcano-webhook mutate: ")
    # Offline every plugin is ours to judge; in the cluster view Volcano's controller's are its own.
    assert mutate[0] == (2 if not view or case in ("unknown plugin", "our plugin's argument") else 0), mutate[2]


# The views --------------------------------------------------------------------------------------


def test_each_command_names_its_view_in_one_line(capsys):
    job = str(PYTORCH)
    for argv in (["mutate", "--task", "worker"], ["mutate", "--task", "worker", "--patch"], ["review", "--task", "worker"], ["resources"]):
        command, *rest = argv
        code, out, err = run(capsys, command, "--job", job, *rest)
        assert code == 0 and err.startswith("view: offline: ") and err.count("\n") == 1, err
        assert "as if nothing else ran" in err or "before any plugin runs" in err
        assert json.loads(out) if command != "resources" else list(yaml.safe_load_all(out)), "stdout holds the output alone"
        code, out, err = run(capsys, command, "--job", job, *rest, "--cluster")
        assert code == 0 and err.startswith("view: cluster: ") and err.count("\n") == 1, err
        assert "pytorch" in err, "names what it leaves to Volcano's controller"


def test_offline_every_plugin_runs_whatever_the_settings_and_the_status_say(capsys, tmp_path):
    """The offline view is every plugin, as if nothing else ran, even with settings of a cluster and
    a job whose status says Volcano's controller ran its plugins (as Volcano's admission stores it:
    svc and ssh added to spec.plugins); the cluster view believes the status."""
    config = tmp_path / "config.yaml"
    config.write_text("job_source: kube\nvolcano_controller_plugins: []\n")
    obj = yaml.safe_load((EXAMPLES / "jobs" / "mpi-job.yaml").read_text())
    obj["spec"]["plugins"].update(ssh=[], svc=[])
    obj["status"] = {"controlledResources": {"plugin-ssh": "ssh", "plugin-svc": "svc", "plugin-mpi": "mpi"}}
    job = write_job(tmp_path, obj)
    code, out, err = run(capsys, "resources", "--job", job, "--config", str(config))
    assert code == 0 and err.startswith("view: offline: ")
    assert [o["kind"] for o in yaml.safe_load_all(out)] == ["Secret", "ConfigMap", "Service", "NetworkPolicy"]
    code, out, err = run(capsys, "resources", "--job", job, "--config", str(config), "--cluster")
    assert code == 0 and out == ""
    assert err == "view: cluster: the objects the reconciler makes; Volcano's controller makes those of ssh, svc, mpi\n"

    code, out, _ = run(capsys, "mutate", "--job", job, "--task", "mpimaster", "--config", str(config), "--patch")
    paths = {op["path"] for op in json.loads(out)}
    assert code == 0 and "/spec/hostname" in paths, "svc's part, run offline"
    code, out, err = run(capsys, "mutate", "--job", job, "--task", "mpimaster", "--config", str(config), "--patch", "--cluster")
    assert (code, json.loads(out)) == (0, []), "Volcano's controller wired it all: the webhook has nothing to add"
    assert "Volcano's controller wired it with ssh, svc, mpi" in err


def test_a_cluster_where_volcano_runs_no_plugin_is_said_so(capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("volcano_controller_plugins: []\n")
    code, _, err = run(capsys, "resources", "--job", str(PYTORCH), "--config", str(config), "--cluster")
    assert code == 0 and err == "view: cluster: the objects the reconciler makes; Volcano's controller runs none of the job's plugins\n"
    code, _, err = run(capsys, "review", "--job", str(PYTORCH), "--task", "worker", "--config", str(config), "--cluster")
    assert code == 0 and "Volcano's controller runs none of the job's plugins" in err


# review is no stricter than the cluster ---------------------------------------------------------


def test_review_warns_of_what_volcano_tolerates_and_refuses_what_the_webhook_denies(capsys, tmp_path):
    tolerated = pytorch()
    tolerated["spec"]["plugins"]["pytorch"] = ["--port=23456", "--wait-master-enabld"]
    job = write_job(tmp_path, tolerated)
    for view in ([], ["--cluster"]):
        code, out, err = run(capsys, "review", "--job", job, "--task", "worker", "--index", "1", *view)
        assert code == 0 and json.loads(out)["kind"] == "AdmissionReview"
        lines = err.splitlines()
        assert len(lines) == 2 and lines[0].startswith("view: ") and lines[1].startswith(
            "warning: job default/pytorch-demo: plugin pytorch: --wait-master-enabld: flag provided but not defined; "
            "did you mean --wait-master-enabled?"), err
        assert "Volcano's controller only logs this and runs the plugin with the 1 argument(s) before it" in lines[1]
    # Volcano's controller runs it as it parsed it: --port=23456 kept (MASTER_PORT), the rest dropped.
    code, out, _ = run(capsys, "review", "--job", job, "--task", "worker", "--cluster")
    env = {e["name"]: e.get("value") for e in json.loads(out)["request"]["object"]["spec"]["containers"][0]["env"]}
    assert code == 0 and env["MASTER_PORT"] == "23456"
    # The webhook runs every plugin where Volcano's controller does not: offline, mutate refuses.
    refused(capsys, ["mutate", "--job", job, "--task", "worker"], "job default/pytorch-demo: plugin pytorch: --wait-master-enabld: "
            "flag provided but not defined; did you mean --wait-master-enabled? (known flags: --master, --worker, --port, "
            "--wait-master-enabled, --wait-master-timeout, --wait-master-image)")

    denied = pytorch()
    denied["metadata"]["annotations"] = {"volcano-job-webhook/plugins": json.dumps({"jax": ["--port=0"]})}
    for view in ([], ["--cluster"]):
        refused(capsys, ["review", "--job", write_job(tmp_path, denied), "--task", "worker", *view],
                "job default/pytorch-demo: plugin jax: --port: invalid value '0': 0 is outside 1..65535")


# mutate takes the AdmissionReview review prints ---------------------------------------------------


@pytest.mark.parametrize("api_version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
@pytest.mark.parametrize("output", ["json", "yaml"])
def test_mutate_takes_the_review_that_review_prints(capsys, tmp_path, api_version, output):
    job = str(PYTORCH)
    code, review, _ = run(capsys, "review", "--job", job, "--task", "worker", "--index", "1", "--api-version", api_version, "-o", output)
    assert code == 0
    (tmp_path / "review").write_text(review)
    code, from_review, _ = run(capsys, "mutate", "--job", job, str(tmp_path / "review"))
    code2, from_task, _ = run(capsys, "mutate", "--job", job, "--task", "worker", "--index", "1")
    assert code == code2 == 0 and json.loads(from_review) == json.loads(from_task)


def test_a_review_gives_its_namespace_to_a_pod_that_names_none(capsys, tmp_path):
    code, out, _ = run(capsys, "review", "--job", str(EXAMPLES / "jobs" / "env-job.yaml"), "--task", "worker")
    review = json.loads(out)
    del review["request"]["object"]["metadata"]["namespace"]
    review["request"]["namespace"] = "team-a"
    (tmp_path / "review.json").write_text(json.dumps(review))
    job = yaml.safe_load((EXAMPLES / "jobs" / "env-job.yaml").read_text())
    job["metadata"]["namespace"] = "team-a"
    code, out, _ = run(capsys, "mutate", "--job", write_job(tmp_path, job), str(tmp_path / "review.json"))
    assert code == 0 and json.loads(out)["metadata"]["namespace"] == "team-a"


# Bad input: exit 2, one line ---------------------------------------------------------------------


def test_bad_pods_and_reviews_exit_2_with_one_line(capsys, tmp_path):
    job = str(EXAMPLES / "jobs" / "env-job.yaml")
    code, out, _ = run(capsys, "review", "--job", job, "--task", "worker")
    review = json.loads(out)
    cases = {
        "configmap-review.json": ({**review, "request": {**review["request"], "kind": {"group": "", "version": "v1", "kind": "ConfigMap"}}},
                                  "the AdmissionReview is for a ConfigMap, not a Pod"),
        "no-request.json": ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request: Field required"),
        "v2.json": ({**review, "apiVersion": "admission.k8s.io/v2"}, "apiVersion: Input should be 'admission.k8s.io/v1' or"),
        "no-object.json": ({**review, "request": {**review["request"], "object": None}}, "request.object: missing or not a Pod"),
        "bad-shape.json": ({"kind": "Pod", "spec": {"containers": "main"}}, "spec.containers: must be a list of objects"),
    }
    for name, (obj, message) in cases.items():
        (tmp_path / name).write_text(json.dumps(obj))
        code, out, err = run(capsys, "mutate", "--job", job, str(tmp_path / name))
        assert (code, out) == (2, "") and err.count("\n") == 1 and message in err, (name, err)
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps(review["request"]["object"]))
    refused(capsys, ["mutate", "--job", job, str(pod), "--index", "0"], "give a POD file or --task and --index, not both")


@pytest.mark.parametrize(
    "argv",
    [
        ["mutate", "--job", str(PYTORCH), "--task", "worker", "-o", "xml"],
        ["review", "--job", str(PYTORCH), "--task", "worker", "--index", "one"],
        ["resources", "--job", str(PYTORCH), "--task", "worker"],
    ],
)
def test_bad_arguments_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and "error:" in err


# -o json|yaml -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "default"),
    [
        (["mutate", "--task", "worker"], "json"),
        (["mutate", "--task", "worker", "--patch"], "json"),
        (["review", "--task", "worker"], "json"),
        (["resources"], "yaml"),
    ],
)
def test_every_command_that_prints_objects_takes_o_json_or_yaml(capsys, argv, default):
    """The same objects either way (pytorch's, which have no SSH keys to differ); the default is
    each command's own, as it was."""
    command, *rest = argv
    outputs = {}
    for output in ("json", "yaml"):
        code, out, _ = run(capsys, command, "--job", str(PYTORCH), *rest, "-o", output)
        assert code == 0
        outputs[output] = json.loads(out) if output == "json" else (
            list(yaml.safe_load_all(out)) if command == "resources" else yaml.safe_load(out))
        assert "&id" not in out, "no YAML anchors: a Kubernetes object is JSON"
    assert outputs["json"] == outputs["yaml"]
    code, out, _ = run(capsys, command, "--job", str(PYTORCH), *rest)
    code2, chosen, _ = run(capsys, command, "--job", str(PYTORCH), *rest, "-o", default)
    assert code == code2 == 0 and out == chosen


# --version ----------------------------------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    out, _ = capsys.readouterr()
    assert exit_.value.code == 0
    assert out == f"volcano-webhook {__version__}\n"
    assert __version__ == importlib.metadata.version("volcano-job-webhook"), "the package's own version"


# Messages that say what was meant ------------------------------------------------------------------


def test_an_unknown_plugin_is_said_once_with_what_was_meant(capsys, tmp_path):
    job = write_job(tmp_path, pytorch(plugins={"pytoch": []}))
    err = refused(capsys, ["mutate", "--job", job, "--task", "worker"],
                  f"job default/pytorch-demo: plugin pytoch: unknown plugin; did you mean pytorch? (known: {', '.join(default_registry().names())})")
    assert err.count("pytoch") == 1 and err.count("unknown plugin") == 1
    job = write_job(tmp_path, pytorch(plugins={"horovod": []}))
    code, _, err = run(capsys, "resources", "--job", job)
    assert code == 2 and "plugin horovod: unknown plugin (known: " in err and "did you mean" not in err


@pytest.mark.parametrize(
    ("flag", "hint"),
    [("--prot=1", "did you mean --port?"), ("--Master=master", "did you mean --master?"), ("--mastr-port=1", "did you mean --master?"),
     ("--bogus", None)],
)
def test_an_unknown_flag_says_what_was_meant(capsys, tmp_path, flag, hint):
    job = write_job(tmp_path, pytorch(plugins={"pytorch": [flag]}))
    name = flag.split("=")[0]
    code, _, err = run(capsys, "mutate", "--job", job, "--task", "worker")
    assert code == 2 and err.startswith(f"volcano-webhook mutate: job default/pytorch-demo: plugin pytorch: {name}: flag provided but not defined")
    assert (hint in err) if hint else ("did you mean" not in err), err


def test_an_unknown_task_lists_the_tasks_and_says_what_was_meant(capsys, tmp_path):
    refused(capsys, ["mutate", "--job", str(PYTORCH), "--task", "wroker"],
            "job default/pytorch-demo: task: the job has no task 'wroker'; did you mean 'worker'? (tasks: master, worker)")
    refused(capsys, ["review", "--job", str(PYTORCH), "--task", "ps"], "job default/pytorch-demo: task: the job has no task 'ps' (tasks: master, worker)")
    obj = copy.deepcopy(yaml.safe_load((EXAMPLES / "jobs" / "jax-job.yaml").read_text()))
    obj["metadata"]["annotations"] = {"volcano-job-webhook/plugins": json.dumps({"jax": ["--coordinator=leadr"]})}
    obj["spec"].pop("plugins", None)
    code, _, err = run(capsys, "resources", "--job", write_job(tmp_path, obj))
    assert code == 2 and "plugin jax: --coordinator: the job has no task 'leadr'; did you mean 'leader'? (tasks: " in err, err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: [\n", "not readable as YAML: while parsing a flow node"),
        ("- port\n", "must be a map of settings (port: 8443, ...), got a YAML list"),
        ("8443\n", "must be a map of settings (port: 8443, ...), got a YAML number"),
        ("nonsense: 1\n", "nonsense: Extra inputs are not permitted"),
    ],
)
def test_a_bad_settings_file_exits_2_with_one_line(capsys, tmp_path, text, message):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    for argv in (["mutate", "--task", "worker"], ["review", "--task", "worker"], ["resources"]):
        command, *rest = argv
        code, out, err = run(capsys, command, "--job", str(PYTORCH), *rest, "--config", str(config))
        assert (code, out) == (2, "") and err.count("\n") == 1 and message in err, err


# A file without a uid -----------------------------------------------------------------------------


def owner_uid(capsys, job: str, task: str | None = None, index: int = 0) -> str:
    """The uid ``review`` names for the job's Pod: its controller reference's (a Volcano Job's Pods also
    carry it in their PodGroup's name), or for a JobSet the label its Jobs' Pods carry."""
    code, out, err = run(capsys, "review", "--job", job, *(["--task", task] if task else []), "--index", str(index))
    assert code == 0, err
    meta = json.loads(out)["request"]["object"]["metadata"]
    if "jobset.sigs.k8s.io/jobset-uid" in meta["labels"]:
        return str(meta["labels"]["jobset.sigs.k8s.io/jobset-uid"])
    (ref,) = meta["ownerReferences"]
    group = meta["annotations"].get("scheduling.k8s.io/group-name")
    assert group in (None, f"{ref['name']}-{ref['uid']}")
    return str(ref["uid"])


def test_a_file_without_a_uid_is_given_the_same_one_on_every_run(capsys, tmp_path):
    """The examples name no uid (a second ``kubectl apply`` of a file that names one is refused): the
    commands give a file without one a uid made from its kind, namespace and name, so their output
    is the same on every run, and another job's differs; a uid the file names is kept."""
    env = str(EXAMPLES / "jobs" / "env-job.yaml")
    first = owner_uid(capsys, env, "worker", 1)
    assert uuid.UUID(first).version == 5
    assert owner_uid(capsys, env, "worker", 1) == first == owner_uid(capsys, env, "worker", 0)
    obj = yaml.safe_load(Path(env).read_text())
    assert "uid" not in obj["metadata"]
    others = {
        "namespace": {**obj, "metadata": {**obj["metadata"], "namespace": "ml"}},
        "name": {**obj, "metadata": {**obj["metadata"], "name": "env-demo-2"}},
    }
    uids = {what: owner_uid(capsys, write_job(tmp_path, other, f"{what}.yaml"), "worker") for what, other in others.items()}
    assert len({first, *uids.values()}) == 3, uids
    named = {**obj, "metadata": {**obj["metadata"], "uid": "11111111-2222-4333-8444-555555555555"}}
    assert owner_uid(capsys, write_job(tmp_path, named, "named.yaml"), "worker") == "11111111-2222-4333-8444-555555555555"
    # The side objects name the same owner.
    code, out, _ = run(capsys, "resources", "--job", str(EXAMPLES / "jobs" / "svc-job.yaml"))
    assert code == 0
    owners = {o["metadata"]["ownerReferences"][0]["uid"] for o in yaml.safe_load_all(out)}
    assert owners == {owner_uid(capsys, str(EXAMPLES / "jobs" / "svc-job.yaml"), "worker")}


@pytest.mark.parametrize("path", ["workloads/torchrun-indexed-job.yaml", "workloads/jax-jobset.yaml"])
def test_an_indexed_job_or_jobset_file_without_a_uid_is_given_one_too(capsys, path):
    job = str(EXAMPLES / path)
    task = "leader" if "jobset" in path else None
    uid = owner_uid(capsys, job, task)
    assert uuid.UUID(uid).version == 5 and owner_uid(capsys, job, task) == uid
    assert uid != owner_uid(capsys, str(EXAMPLES / "jobs" / "env-job.yaml"), "worker")
