"""Volcano's own plugin code as the reference for ours: generated jobs run through vcref (a build of
Volcano's Go plugins, Pod builder and job admission, ``VOLCANO_REF``) or read from its recorded
answers (``../shared/volcano-reference/``), compared field by field with our chain's after the
normalisations vcref's README asks for; each documented difference is named once (``DIFFERENCES``)
and counted, anything else is a mismatch."""

from __future__ import annotations

import base64
import json
import lzma
import os
import random
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.builtin.ssh import generate_key_pair
from volcano_job_webhook.plugins.flags import parse_flags
from volcano_job_webhook.plugins.keys import VOLCANO_PLUGINS
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.registry import default_registry

Obj = dict[str, Any]
VOLCANO_REF_ENV = "VOLCANO_REF"


def vcref_path() -> str | None:
    return os.environ.get(VOLCANO_REF_ENV) or None


def run_vcref(documents: list[Obj], path: str, timeout: float = 600) -> list[Obj]:
    """One vcref process for the whole batch (a JSON array in, one result per document out)."""
    done = subprocess.run([path], input=json.dumps(documents).encode(), capture_output=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"vcref exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    results = json.loads(done.stdout)
    if not isinstance(results, list) or len(results) != len(documents):
        raise RuntimeError(f"vcref answered {type(results).__name__} for {len(documents)} documents")
    return results


# ---------------------------------------------------------------------------------------------
# Job generator: deterministic for a seed; tasks, replicas, templates and plugin flags within what
# Volcano's job admission admits, plus a few jobs it denies (unknown plugin, missing mpi master).

ROLE_TASKS = ("master", "worker", "head", "ps", "chief", "evaluator", "mpimaster", "mpi-worker", "launcher")
CONTAINER_NAMES = ("main", "head", "worker", "sidecar", "c0", "logger")
INIT_NAMES = ("init", "setup", "init-2", "wait-for-master")
ENV_NAMES = ("RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "VC_TASK_INDEX", "VK_TASK_INDEX", "TF_CONFIG", "MPI_HOST", "FOO", "BAR_1")
PORTS = (22, 2222, 23456, 6379, 8265, 10001, 8080, 29500)
VOLUMES = ("data", "scratch", "cache-1")


def _label(rng: random.Random, low: int, high: int, first: str = "abcdefghijklmnopqrstuvwxyz0123456789") -> str:
    """A DNS-1123 label (what Volcano's CRD admits for task names) of ``low``..``high`` characters."""
    size = rng.randint(low, high)
    inner = "abcdefghijklmnopqrstuvwxyz0123456789-"
    edge = "abcdefghijklmnopqrstuvwxyz0123456789"
    if size == 1:
        return rng.choice(first)
    return rng.choice(first) + "".join(rng.choice(inner) for _ in range(size - 2)) + rng.choice(edge)


def _task_names(rng: random.Random) -> list[str]:
    names: list[str] = []
    wanted = rng.randint(1, 4)
    while len(names) < wanted:
        name = rng.choice(ROLE_TASKS) if rng.random() < 0.7 else _label(rng, 1, 10)
        if name not in names:
            names.append(name)
    return names


def _env(rng: random.Random, tasks: list[str]) -> list[Obj]:
    pool = ENV_NAMES + tuple(f"VC_{t.replace('-', '_').upper()}_NUM" for t in tasks)
    out = []
    for _ in range(rng.choice((0, 0, 1, 2, 3))):
        name = rng.choice(pool)
        if rng.random() < 0.15:
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        else:
            out.append({"name": name, "value": rng.choice(("x", "7", "0", "a b", "$(FOO)"))})
    return out


def _make_container(rng: random.Random, name: str, tasks: list[str], volumes: list[str], *, init: bool) -> Obj:
    c: Obj = {"name": name, "image": rng.choice(("busybox:1.36.1", "rayproject/ray:2.9.0", "pytorch/pytorch:2.5.1"))}
    if rng.random() < 0.3:
        c["command"] = rng.choice((["python", "train.py"], ["sh", "-c", "sleep 1"]))
    if rng.random() < 0.2:
        c["args"] = ["--epochs=1"]
    env = _env(rng, tasks)
    if env:
        c["env"] = env
    if rng.random() < (0.15 if init else 0.4):
        numbers = rng.sample(PORTS, rng.randint(1, 2))
        ports = []
        for i, number in enumerate(numbers):
            port: Obj = {"containerPort": number}
            if rng.random() < 0.7:
                port["name"] = f"p{i}-{number}"
            if rng.random() < 0.3:
                port["protocol"] = rng.choice(("TCP", "UDP"))
            ports.append(port)
        c["ports"] = ports
    mounts = [{"name": v, "mountPath": f"/mnt/{v}"} for v in volumes if rng.random() < 0.6]
    if mounts:
        c["volumeMounts"] = mounts
    return c


def _template(rng: random.Random, tasks: list[str]) -> Obj:
    names = rng.sample(CONTAINER_NAMES, rng.randint(1, 3))
    volumes = rng.sample(VOLUMES, rng.choice((0, 0, 1, 2)))
    spec: Obj = {"containers": [_make_container(rng, n, tasks, volumes, init=False) for n in names]}
    if volumes:
        spec["volumes"] = [{"name": v, "emptyDir": {}} for v in volumes]
    if rng.random() < 0.3:
        init_names = [n for n in rng.sample(INIT_NAMES, rng.randint(1, 2)) if n != "wait-for-master" or rng.random() < 0.3]
        if init_names:
            spec["initContainers"] = [_make_container(rng, n, tasks, volumes, init=True) for n in init_names]
    if rng.random() < 0.05:
        spec["schedulerName"] = "custom"
    if rng.random() < 0.08:
        spec["hostname"] = _label(rng, 1, 8, first="abcdefghijklmnopqrstuvwxyz")
    if rng.random() < 0.05:
        spec["subdomain"] = _label(rng, 1, 8, first="abcdefghijklmnopqrstuvwxyz")
    template: Obj = {"spec": spec}
    if rng.random() < 0.1:
        template["metadata"] = {"labels": {"app": "demo"}, "annotations": rng.choice(({"note": "x"}, {"hccl/rankIndex": "5"}))}
    return template


def _tokens(rng: random.Random, flag: str, value: str | None, boolean: bool) -> list[str]:
    """One flag in any of Go's spellings; ``value`` None is a bare boolean. A boolean's value is
    never a separate token: Go reads ``--flag true`` as ``--flag`` and stops at ``true``."""
    if value is None:
        return [rng.choice(("-", "--")) + flag]
    style = rng.random() * (0.8 if boolean else 1)
    if style < 0.6:
        return [f"--{flag}={value}"]
    if style < 0.8:
        return [f"-{flag}={value}"]
    return [f"--{flag}", value]


def _task_flag(rng: random.Random, tasks: list[str], default: str) -> str:
    """Mostly a task of the job; now and then the default or a task the job lacks."""
    roll = rng.random()
    return rng.choice(tasks) if roll < 0.8 else default if roll < 0.95 else _label(rng, 1, 6, first="abcdefghijklmnopqrstuvwxyz")


def _bool(rng: random.Random) -> str | None:
    return rng.choice((None, "true", "false", "1", "F"))


def _flags(rng: random.Random, plugin: str, tasks: list[str], containers: list[str]) -> list[str]:
    """Valid arguments for ``plugin`` (Volcano's flags: each plugin's "flags" section of docs/volcano-behaviour.md), each flag present or not."""
    chosen: list[tuple[str, str | None]] = []
    booleans = {"publish-not-ready-addresses", "disable-network-policy", "inject-hosts-env", "wait-master-enabled"}

    def maybe(flag: str, value: Callable[[], str | None], p: float = 0.35) -> None:
        if rng.random() < p:
            chosen.append((flag, value()))

    def task(flag: str, default: str) -> None:
        """A task-name flag: always given when the job has no task of the default name, so that
        jobs Volcano or we deny for a missing task stay a minority."""
        maybe(flag, lambda: _task_flag(rng, tasks, default), 0.5 if default in tasks else 0.95)

    def port() -> str:
        return str(rng.choice((*PORTS, 1234, 65535)))

    if plugin == "svc":
        for flag in ("publish-not-ready-addresses", "disable-network-policy", "inject-hosts-env"):
            maybe(flag, lambda: _bool(rng))
    elif plugin == "ssh":
        maybe("ssh-key-file-path", lambda: rng.choice(("/root/.ssh", "/home/user/.ssh", "/root/.ssh/")))
        maybe("ssh-port", port)
        if rng.random() < 0.75:  # keys of one's own (also spares Volcano a 2048-bit key generation)
            chosen += [("ssh-private-key", f"PRIVATE{rng.randint(0, 9)}"), ("ssh-public-key", f"ssh-rsa PUBLIC{rng.randint(0, 9)}")]
    elif plugin == "pytorch":
        task("master", "master")
        task("worker", "worker")
        maybe("port", port)
        maybe("wait-master-enabled", lambda: _bool(rng))
        maybe("wait-master-timeout", lambda: str(rng.choice((0, 30, 300))))
        maybe("wait-master-image", lambda: "busybox:1.37")
    elif plugin == "tensorflow":
        for role in ("ps", "worker", "chief", "evaluator"):
            task(role, role)
        maybe("port", port)
    elif plugin in ("mpi", "hcclrank"):
        task("master", "master")
        task("worker", "worker")
        if plugin == "mpi":
            maybe("port", port)
    elif plugin == "ray":
        task("head", "head")
        task("worker", "worker")
        maybe("headContainer", lambda: rng.choice(containers), 0.6)
        maybe("workerContainer", lambda: rng.choice(containers), 0.6)
        numbers = rng.sample((6379, 8265, 10001, 6380, 8266, 10002), 3)
        if rng.random() < 0.05:  # two flags of one number (documented: ray-distinct-ports)
            numbers[rng.randint(1, 2)] = numbers[0]
        for flag, number in zip(("port", "dashboardPort", "clientPort"), numbers, strict=True):
            maybe(flag, lambda number=number: str(number))  # type: ignore[misc]
        if rng.random() < 0.1:  # the spelling in Volcano's docs (documented: ray-client-server-port-alias)
            chosen.append(("clientServerPort", str(rng.choice((10003, 10004)))))
    rng.shuffle(chosen)
    return [token for flag, value in chosen for token in _tokens(rng, flag, value, flag in booleans)]


def generate_job(rng: random.Random, serial: int) -> Obj:
    """One Volcano Job. ``serial`` keeps names unique within a batch."""
    tasks = _task_names(rng)
    if rng.random() < 0.06:  # long names, near the 63-character hostname limit
        longest = max(len(t) for t in tasks)
        name = _label(rng, max(1, 57 - longest), 62 - longest, first="abcdefghijklmnopqrstuvwxyz")
    else:
        name = _label(rng, 1, 12, first="abcdefghijklmnopqrstuvwxyz")
    templates = {t: _template(rng, tasks) for t in tasks}
    containers = sorted({c["name"] for t in templates.values() for c in t["spec"]["containers"]} | {"head", "worker"})
    plugins: Obj = {}
    for plugin in rng.sample(VOLCANO_PLUGINS, rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 8))):
        plugins[plugin] = _flags(rng, plugin, tasks, containers)
    if "mpi" in plugins and "ssh" not in plugins and rng.random() < 0.5:  # else mpi brings ssh, keys generated
        plugins["ssh"] = _flags(rng, "ssh", tasks, containers)
    if rng.random() < 0.02:
        plugins["bogus"] = []
    spec: Obj = {"tasks": [{"name": t, "replicas": rng.randint(1, 5), "template": templates[t]} for t in tasks]}
    scheduler = rng.choice(("volcano", "volcano", "volcano", None, "kube-batch"))
    if scheduler:
        spec["schedulerName"] = scheduler
    if rng.random() < 0.1:
        spec["priorityClassName"] = "high"
    if plugins or rng.random() < 0.5:
        spec["plugins"] = plugins
    if rng.random() < 0.2:
        spec["queue"] = "research"
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": rng.choice(("default", "team-a")),
            "uid": f"00000000-0000-4000-8000-{serial:012d}",
        },
        "spec": spec,
    }


def generate_jobs(seed: int, count: int) -> list[Obj]:
    rng = random.Random(seed)
    return [generate_job(rng, i) for i in range(count)]


# ---------------------------------------------------------------------------------------------
# Our side: the /validate-equivalent check, every Pod through the chain, the side objects.


@dataclass
class Ours:
    denied: PluginError | None = None
    pods: dict[str, Obj | PluginError] = field(default_factory=dict)
    resources: list[Obj] = field(default_factory=list)


@cache
def _kept_keys() -> dict[str, str]:
    """One key pair for every job: our ssh plugin keeps an existing Secret's keys, which spares a
    key generation per job; key bytes are compared by shape only anyway."""
    pair = generate_key_pair()
    raw = {"id_rsa": pair.private_pem, "id_rsa.pub": pair.public_openssh, "authorized_keys": pair.public_openssh}
    return {k: base64.b64encode(v).decode() for k, v in raw.items()}


def reference_chain() -> Chain:
    """The chain compared with Volcano, live and recorded alike: the one place it is built."""
    return Chain()


def run_ours(job_obj: Obj) -> Ours:
    chain = reference_chain()
    try:
        job = Job.from_object(job_obj)
        chain.check(job)
    except PluginError as exc:
        return Ours(denied=exc)
    out = Ours()
    for task in job.tasks:
        for index in range(task.replicas):
            pod = make_pod(job, task.name, index)
            try:
                out.pods[pod["metadata"]["name"]] = chain.mutate(job, pod).pod
            except PluginError as exc:
                out.pods[pod["metadata"]["name"]] = exc
    existing = {("Secret", f"{job.name}-ssh"): {"data": _kept_keys()}}
    out.resources = chain.resources(job, existing)
    return out


# ---------------------------------------------------------------------------------------------
# The documented differences, in one place. Each names the difference it stands for (README, "Where
# we differ from Volcano"; docs/volcano-behaviour.md#differences-at-a-glance has each with its
# reason) and shows how the difference is taken out before comparing: the job vcref gets is
# rewritten (``rewrite``), Volcano's Pod is adjusted (``adjust``), or the job is one we deny
# and Volcano admits (``we_deny``: the plugin and argument our error must name) or the reverse
# (``volcano_denies``).


def _options(plugin: str, args: Iterable[str]) -> dict[str, Any]:
    cls = default_registry().get(plugin)
    assert cls is not None
    return parse_flags(cls.flags, list(args))


def _plugins(job: Obj) -> dict[str, list[str]]:
    return dict((job.get("spec") or {}).get("plugins") or {})


def _task(job: Obj, name: str) -> Obj | None:
    return next((t for t in job["spec"]["tasks"] if t["name"] == name), None)


def _alias_rewrite(job: Obj) -> bool:
    """Volcano stops parsing ray's flags at ``--clientServerPort`` (not defined); we read it as
    ``--clientPort``. vcref gets the spelling Volcano defines."""
    args = _plugins(job).get("ray")
    if not args:
        return False
    fixed = [re.sub(r"^(--?)clientServerPort\b", r"\1clientPort", a) for a in args]
    if fixed == args:
        return False
    job["spec"]["plugins"]["ray"] = fixed
    return True


def _ray_head_is_worker_rewrite(job: Obj) -> bool:
    """--head and --worker name one task and one container: Volcano's worker command replaces the
    head command there (no head runs anywhere); we keep the head command. vcref gets a worker
    container name no container has, which leaves it the head's."""
    args = _plugins(job).get("ray")
    if args is None:
        return False
    opts = _options("ray", args)
    if opts["head"] != opts["worker"] or opts["headContainer"] != opts["workerContainer"] or _task(job, opts["head"]) is None:
        return False
    job["spec"]["plugins"]["ray"] = [*args, "--workerContainer=vcref-no-such-container"]
    return True


def _hcclrank_adjust(job: Obj, pod: Obj) -> bool:
    """hcclrank reads the first container that sets ``RANK``. Where it lists ``RANK`` more than once
    (pytorch's appended after the template's, in Volcano), Volcano copies the first entry; we copy
    the last, the one the kubelet runs the container with. Volcano's annotation is replaced with what
    its own rule gives when it reads the last entry. True when that changes the annotation."""
    plugins = _plugins(job)
    if "hcclrank" not in plugins:
        return False
    meta = pod["metadata"]
    task_name = meta["annotations"]["volcano.sh/task-spec"]
    template = (_task(job, task_name) or {}).get("template") or {}
    if ((template.get("metadata") or {}).get("annotations") or {}).get("hccl/rankIndex"):
        return False
    ranks = next(
        (r for c in pod["spec"]["containers"] if (r := [e for e in c.get("env") or [] if e.get("name") == "RANK"])), []
    )
    if len(ranks) < 2:
        return False
    rank: str | None = ranks[-1].get("value") or None
    if rank is None:  # valueFrom: the task's own rank, as both compute it
        opts = _options("hcclrank", plugins["hcclrank"])
        index = int(meta["labels"]["volcano.sh/task-index"])
        if task_name == opts["master"]:
            rank = str(index)
        elif task_name == opts["worker"]:
            rank = str(((_task(job, opts["master"]) or {}).get("replicas") or 0) + index)
    annotations = meta.setdefault("annotations", {})
    before = annotations.get("hccl/rankIndex")
    if rank is None:
        annotations.pop("hccl/rankIndex", None)
    else:
        annotations["hccl/rankIndex"] = rank
    return before != rank


def _ray_options(job: Obj) -> dict[str, Any] | None:
    args = _plugins(job).get("ray")
    return None if args is None else _options("ray", [re.sub(r"^(--?)clientServerPort\b", r"\1clientPort", a) for a in args])


def _ray_ports_not_distinct(job: Obj) -> set[tuple[str, str]]:
    opts = _ray_options(job)
    if opts is None:
        return set()
    port, dashboard, client = opts["port"], opts["dashboardPort"], opts["clientPort"]
    if dashboard == port:  # the first flag that repeats an earlier one is named
        return {("ray", "--dashboardPort")}
    return {("ray", "--clientPort")} if client in (port, dashboard) else set()


def _ray_no_head(job: Obj) -> set[tuple[str, str]]:
    opts = _ray_options(job)
    return {("ray", "--head")} if opts is not None and _task(job, opts["head"]) is None else set()


def _names_over_limits(job: Obj) -> set[tuple[str, str]]:
    """Names Kubernetes rejects that Volcano's admission lets through: the ray head Service
    ``<job>-head-svc`` and, where svc makes them hostnames, Pod names, checked at the highest
    index (Volcano's admission checks ``<job>-<task>-<position in spec.tasks>``)."""
    name = job["metadata"]["name"]
    out = set()
    if _ray_options(job) is not None and len(f"{name}-head-svc") > 63:
        out.add(("ray", "head Service name"))
    for task in job["spec"]["tasks"]:
        if not task["template"]["spec"].get("hostname") and len(f"{name}-{task['name']}-{task['replicas'] - 1}") > 63:
            out.add(("svc", f"hostname of task {task['name']!r}"))
    return out


def _job_rule_outside_plugins(job: Obj, ours_plugins: Mapping[str, Any], error: str) -> bool:
    """Volcano's job admission rejects a Pod name over 63 characters (``<job>-<task>-<position>``)
    whatever the plugins; our /validate judges plugins, and a Pod name matters to them only where
    svc makes it the hostname (no template hostname)."""
    if "create pod with name" not in error:
        return False
    name = job["metadata"]["name"]
    long = [t for i, t in enumerate(job["spec"]["tasks"]) if len(f"{name}-{t['name']}-{i}") > 63]
    return "svc" not in ours_plugins or all(t["template"]["spec"].get("hostname") for t in long)


@dataclass(frozen=True)
class Difference:
    key: str
    reason: str
    rewrite: Callable[[Obj], bool] | None = None
    adjust: Callable[[Obj, Obj], bool] | None = None
    we_deny: Callable[[Obj], set[tuple[str, str]]] | None = None
    volcano_denies: Callable[[Obj, Mapping[str, Any], str], bool] | None = None


DIFFERENCES: tuple[Difference, ...] = (
    Difference("ray-client-server-port-alias", "Volcano's documented --clientServerPort is undefined in its code; we accept it as --clientPort",
               rewrite=_alias_rewrite),
    Difference("ray-head-is-worker", "one task and container as ray head and worker: Volcano's worker command replaces the head's, so no head runs; we keep the head's",
               rewrite=_ray_head_is_worker_rewrite),
    Difference("hcclrank-effective-rank", "hccl/rankIndex is the RANK the container runs with (the last entry: pytorch's), not the first (the template's) Volcano copies",
               adjust=_hcclrank_adjust),
    Difference("ray-distinct-ports", "ray ports of one number: Volcano's head Service is rejected by the API server (Duplicate value); we deny the job",
               we_deny=_ray_ports_not_distinct),
    Difference("ray-no-head", "ray without its head task: Volcano admits the job and fails every Pod; we deny the job",
               we_deny=_ray_no_head),
    Difference("names-over-limits", "a ray head Service or hostname over 63 characters: the API server rejects Volcano's; we deny the job",
               we_deny=_names_over_limits),
    Difference("job-rules-outside-plugins", "Volcano's own job admission rejects Pod names over 63 characters; our /validate only judges plugins",
               volcano_denies=_job_rule_outside_plugins),
)

# Always applied, to both sides (vcref's README, "Mind when comparing", and docs/volcano-behaviour.md#idempotency).
NORMALISATIONS: tuple[tuple[str, str], ...] = (
    ("go-zero-values", "Go drops false, 0, \"\", empty lists and maps under omitempty: absent and zero are the same"),
    ("env-by-name", "env by name, the last entry of a name winning as in the kubelet: we replace in place where Volcano appends a duplicate"),
    ("lists-by-name", "ports, volume mounts and volumes compared regardless of order: Volcano's plugin order is a Go map's"),
    ("ssh-key-bytes", "generated SSH keys are random: compared by shape (PKCS#1 PEM, ssh-rsa, authorized_keys = id_rsa.pub)"),
    ("managed-by-label", "everything we create carries app.kubernetes.io/managed-by: volcano-job-webhook"),
)


def reference_input(job: Obj) -> tuple[Obj, list[str]]:
    """The job as vcref gets it, with the input rewrites of ``DIFFERENCES`` applied (names returned)."""
    copy = json.loads(json.dumps(job))
    applied = [d.key for d in DIFFERENCES if d.rewrite is not None and d.rewrite(copy)]
    return copy, applied


def _example(name: str, plugins: Obj, tasks: list[tuple[str, int, list[Obj]]]) -> Obj:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "uid": f"00000000-0000-4000-9000-{len(name):012d}"},
        "spec": {"plugins": plugins, "tasks": [{"name": t, "replicas": r, "template": {"spec": {"containers": c}}} for t, r, c in tasks]},
    }


def documented_examples() -> dict[str, Obj]:
    """One job per entry of ``DIFFERENCES`` that shows it, so that every run exercises each."""
    ray = [("head", 1, [{"name": "head", "image": "ray"}]), ("worker", 2, [{"name": "worker", "image": "ray"}])]
    return {
        "ray-client-server-port-alias": _example("alias", {"ray": ["--clientServerPort=10002"]}, ray),
        "ray-head-is-worker": _example(
            "both", {"ray": ["--head=master", "--worker=master", "--headContainer=ray", "--workerContainer=ray"]},
            [("master", 2, [{"name": "ray", "image": "ray"}])],
        ),
        "hcclrank-effective-rank": _example(
            "rank", {"pytorch": [], "hcclrank": []},
            [("master", 1, [{"name": "main", "image": "pt"}]), ("worker", 2, [{"name": "main", "image": "pt", "env": [{"name": "RANK", "value": "x"}]}])],
        ),
        "ray-distinct-ports": _example("ports", {"ray": ["--dashboardPort=6379"]}, ray),
        "ray-no-head": _example("nohead", {"ray": []}, ray[1:]),
        "names-over-limits": _example("r" * 55, {"ray": ["--head=h", "--worker=w"]}, [("h", 1, [{"name": "head", "image": "ray"}]), ("w", 1, [{"name": "worker", "image": "ray"}])]),
        "job-rules-outside-plugins": _example("e" * 60, {"env": []}, [("master", 1, [{"name": "main", "image": "x"}])]),
    }


# ---------------------------------------------------------------------------------------------
# Normalisation and comparison


def _drop_zero(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _drop_zero(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, False, 0, "", {}, [])}
    if isinstance(value, list):
        return [_drop_zero(v) for v in value]
    return value


def _normal_container(c: Obj) -> Obj:
    c = dict(c)
    env = {}
    for entry in c.pop("env", None) or []:
        env[entry.get("name")] = entry  # the last of a name wins, as in the kubelet
    if env:
        c["env"] = env
    for name in ("ports", "volumeMounts"):
        if c.get(name):
            c[name] = sorted(c[name], key=lambda d: json.dumps(d, sort_keys=True))
    return c


def normalise_pod(pod: Obj) -> Obj:
    pod = _drop_zero({k: v for k, v in pod.items() if k != "status"})
    spec = pod.get("spec") or {}
    for name in ("containers", "initContainers"):
        if name in spec:
            spec[name] = [_normal_container(c) for c in spec[name]]
    if "volumes" in spec:
        spec["volumes"] = sorted(spec["volumes"], key=lambda v: json.dumps(v, sort_keys=True))
    return pod


_PEM = re.compile(rb"^-----BEGIN RSA PRIVATE KEY-----\n([A-Za-z0-9+/=]{64}\n)*[A-Za-z0-9+/=]{1,64}\n-----END RSA PRIVATE KEY-----\n$")
_SSH_RSA = re.compile(rb"^ssh-rsa AAAAB3NzaC1yc2E[A-Za-z0-9+/=]+\n$")


def normalise_object(obj: Obj, generated_keys: bool) -> Obj:
    obj = _drop_zero({k: v for k, v in obj.items() if k != "status"})
    labels = obj.get("metadata", {}).get("labels")
    if labels:
        labels.pop("app.kubernetes.io/managed-by", None)
        if not labels:
            del obj["metadata"]["labels"]
    if obj.get("kind") == "Secret" and generated_keys:
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        shape = {
            "id_rsa": "<PKCS#1 PEM RSA key>" if _PEM.match(data.get("id_rsa", b"")) else data.get("id_rsa"),
            "id_rsa.pub": "<ssh-rsa key>" if _SSH_RSA.match(data.get("id_rsa.pub", b"")) else data.get("id_rsa.pub"),
            "authorized_keys": "<= id_rsa.pub>" if data.get("authorized_keys") == data.get("id_rsa.pub") else data.get("authorized_keys"),
        }
        obj["data"] = {**obj["data"], **shape}
    return obj


def diff(ref: Any, ours: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two normalised objects differ: (path, Volcano's value, ours)."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        out = []
        for key in sorted(set(ref) | set(ours), key=str):
            out += diff(ref.get(key), ours.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(ref, list) and isinstance(ours, list) and len(ref) == len(ours):
        return [d for i, (a, b) in enumerate(zip(ref, ours, strict=True)) for d in diff(a, b, f"{path}[{i}]")]
    return [] if ref == ours else [(path, ref, ours)]


_INDEX = re.compile(r"\[\d+\]")


def _kind_of(path: str) -> str:
    """A mismatch's kind for the tables: the field path without list indexes and dict keys that
    vary per job (env names are kept: they say which plugin)."""
    parts = _INDEX.sub("", path).split(".")
    if parts[:2] == ["metadata", "annotations"] or parts[:2] == ["metadata", "labels"]:
        return ".".join(parts[:3])
    return ".".join(parts[:4])


@dataclass(frozen=True)
class Mismatch:
    kind: str
    job: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] job {self.job}: {self.where}: {self.detail}"


@dataclass
class Report:
    jobs: int = 0
    pods: int = 0
    objects: int = 0
    both_denied: int = 0
    pod_errors: int = 0
    documented: Counter[str] = field(default_factory=Counter)
    mismatches: list[Mismatch] = field(default_factory=list)

    def add(self, other: Report) -> None:
        self.jobs += other.jobs
        self.pods += other.pods
        self.objects += other.objects
        self.both_denied += other.both_denied
        self.pod_errors += other.pod_errors
        self.documented.update(other.documented)
        self.mismatches += other.mismatches


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:150] + "…"


def compare_job(job: Obj, ref: Obj, ours: Ours, rewrites: list[str], label: str = "") -> Report:
    """Compare one job's vcref result with ours; documented differences are counted, not reported.
    ``label`` says where the job came from (a recorded job's seed and index) in its mismatches."""
    report = Report(jobs=1)
    report.documented.update(rewrites)
    key = f"{job['metadata']['namespace']}/{job['metadata']['name']}" + (f" ({label})" if label else "")

    def mismatch(kind: str, where: str, detail: str) -> None:
        report.mismatches.append(Mismatch(kind, key, where, detail))

    if ref.get("error"):
        if ours.denied is not None:
            report.both_denied += 1
            return report
        # What the plugins are built with: the effective plugin map, dependencies added (each plugin's peers).
        ours_plugins = next((p.peers for p in reference_chain().prepare(Job.from_object(job)).plugins), {})
        documented = [d.key for d in DIFFERENCES if d.volcano_denies and d.volcano_denies(job, ours_plugins, ref["error"])]
        if documented:
            report.documented.update(documented)
        else:
            mismatch("admission", "job", f"Volcano denies ({ref['error']}), we admit")
        return report
    if ours.denied is not None:
        denial = (ours.denied.plugin, ours.denied.field)
        matched = [d.key for d in DIFFERENCES if d.we_deny and denial in d.we_deny(job)]
        if matched:
            report.documented.update(matched[:1])
        else:
            mismatch("admission", "job", f"we deny ({ours.denied}), Volcano admits")
        return report

    ref_errors = {e["pod"]: e["error"] for e in ref.get("pod_errors") or []}
    ref_pods = {p["metadata"]["name"]: p for p in ref.get("pods") or []}
    for name in sorted(set(ref_pods) | set(ref_errors) | set(ours.pods)):
        mine = ours.pods.get(name)
        report.pods += 1
        if name in ref_errors or isinstance(mine, PluginError):
            if name in ref_errors and isinstance(mine, PluginError):
                report.pod_errors += 1
            else:
                mismatch("pod-error", name, f"Volcano: {ref_errors.get(name, 'wires it')}; ours: {mine if isinstance(mine, PluginError) else 'wires it'}")
            continue
        if name not in ref_pods or mine is None:
            mismatch("pod-missing", name, "only Volcano makes it" if mine is None else "only we make it")
            continue
        theirs = json.loads(json.dumps(ref_pods[name]))
        for d in DIFFERENCES:
            if d.adjust and d.adjust(job, theirs):
                report.documented[d.key] += 1
        for path, a, b in diff(normalise_pod(theirs), normalise_pod(mine)):
            mismatch(f"pod {_kind_of(path)}", name, f"{path}: Volcano {_short(a)}, ours {_short(b)}")

    generated = not any(a.lstrip("-").startswith("ssh-private-key") for a in _plugins(job).get("ssh") or [])
    ref_objects = {(o["kind"], o["metadata"]["name"]): o for o in ref.get("resources") or []}
    our_objects = {(o["kind"], o["metadata"]["name"]): o for o in ours.resources}
    for okey in sorted(set(ref_objects) | set(our_objects)):
        report.objects += 1
        kind = f"object {okey[0]}"
        if okey not in ref_objects or okey not in our_objects:
            mismatch(kind, "/".join(okey), "only Volcano makes it" if okey in ref_objects else "only we make it")
            continue
        a, b = normalise_object(ref_objects[okey], generated), normalise_object(our_objects[okey], generated)
        for path, x, y in diff(a, b):
            mismatch(kind, "/".join(okey), f"{path}: Volcano {_short(x)}, ours {_short(y)}")
    return report


def summary(mismatches: Sequence[Mismatch], jobs: int = 10) -> str:
    """The mismatches by kind, then the first differing field of each of the first ``jobs`` jobs."""
    first: dict[str, Mismatch] = {}
    per_job: Counter[str] = Counter()
    for m in mismatches:
        first.setdefault(m.job, m)
        per_job[m.job] += 1
    lines = [f"{len(mismatches)} mismatches in {len(first)} jobs {dict(Counter(m.kind for m in mismatches))}:"]
    for job, m in list(first.items())[:jobs]:
        more = per_job[job] - 1
        lines.append(f"{m}" + (f" (+{more} more in this job)" if more else ""))
    if len(first) > jobs:
        lines.append(f"... and {len(first) - jobs} more jobs")
    return "\n".join(lines)


@dataclass(frozen=True)
class Reference:
    """Volcano's results for a batch of jobs: for each, the job, the input rewrites it got, what
    Volcano's code was given (``{"job": <rewritten job>, "buildAll": true}``) and its answer, and a
    label naming where the job came from ("" for generated jobs, seed and index for recorded ones)."""

    jobs: list[Obj]
    rewrites: list[list[str]]
    results: list[Obj]
    inputs: list[Obj] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)


def run_reference(jobs: list[Obj], vcref: str) -> Reference:
    """Every job through vcref, in one process."""
    inputs = [reference_input(job) for job in jobs]
    documents = [{"job": j, "buildAll": True} for j, _ in inputs]
    results = run_vcref(documents, vcref)
    return Reference(jobs, [applied for _, applied in inputs], results, documents)


def compare(reference: Reference) -> Report:
    """Every job of the batch through our chain, compared with Volcano's results."""
    report = Report()
    labels = reference.labels or [""] * len(reference.jobs)
    for job, rewrites, ref, label in zip(reference.jobs, reference.rewrites, reference.results, labels, strict=True):
        report.add(compare_job(job, ref, run_ours(job), rewrites, label))
    return report


# ---------------------------------------------------------------------------------------------
# Volcano's recorded answers (``../shared/volcano-reference/README.md``): one JSON object a line,
# xz-compressed, with seed, index, job, rewrites, vcref_input and vcref_output. Kept as raw lines
# and parsed a batch at a time: parsed all at once, the garbage collector's passes over millions
# of live objects cost several times the parsing.

RECORDED_ENV = "VOLCANO_REFERENCE_DATA"
RECORDED_FILE = "volcano-reference-ed72c7c.jsonl.xz"
RECORDED_JOBS = 4000


def recorded_path() -> Path:
    """The recorded answers: ``$VOLCANO_REFERENCE_DATA`` (the file, or a directory holding
    ``RECORDED_FILE``), else ``shared/volcano-reference/`` beside the repository."""
    override = os.environ.get(RECORDED_ENV)
    if not override:
        return Path(__file__).resolve().parents[2].parent / "shared" / "volcano-reference" / RECORDED_FILE
    path = Path(override)
    return path / RECORDED_FILE if path.is_dir() else path


def read_recorded(path: Path) -> list[bytes]:
    """The records of the file, one JSON document each, unparsed."""
    with lzma.open(path) as f:
        return [line for line in f.read().splitlines() if line.strip()]


def recorded_reference(lines: Sequence[bytes]) -> Reference:
    """Recorded records as a batch :func:`compare` takes, each labelled with its seed and index."""
    records = [json.loads(line) for line in lines]
    return Reference(
        jobs=[r["job"] for r in records],
        rewrites=[r["rewrites"] for r in records],
        results=[r["vcref_output"] for r in records],
        inputs=[r["vcref_input"] for r in records],
        labels=[f"seed {r['seed']} index {r['index']}" for r in records],
    )


def stale_inputs(reference: Reference) -> list[str]:
    """Jobs whose recorded input is not what :func:`reference_input` gives today (a rewrite in
    ``DIFFERENCES`` added or changed since the recording): Volcano's answer there is to another job."""
    stale = []
    labels = reference.labels or [""] * len(reference.jobs)
    for job, rewrites, given, label in zip(reference.jobs, reference.rewrites, reference.inputs, labels, strict=True):
        today, applied = reference_input(job)
        if applied != rewrites or given != {"job": today, "buildAll": True}:
            stale.append(f"{label or job['metadata']['name']}: recorded rewrites {rewrites}, today {applied}")
    return stale
