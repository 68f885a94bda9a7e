"""Seeded fuzz cases for ``bench/fuzz.py``: Volcano Jobs (valid and broken) for the jobs directory,
and requests to the webhook — AdmissionReviews of those jobs' Pods and of the Jobs themselves,
damaged and hostile ones (truncated JSON, wrong types, deep nesting, huge strings, bad plugins and
flags, giant replicas), and bodies that are not reviews at all.

Everything comes from one ``random.Random(seed)``: the same seed gives the same cases.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from volcano_job_webhook.plugins import Job, PluginError, default_registry
from volcano_job_webhook.plugins.keys import PLUGINS_ANNOTATION
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.admission import admission_review

TASK_NAMES = ("master", "worker", "ps", "chief", "head", "mpimaster", "mpiworker", "node", "trainer", "w", "evaluator")
BAD_NAMES = ("Worker", "wörker", "bad_name", "-w", "w" * 70, "", "a.b")
IMAGES = ("busybox:1.36.1", "pytorch/pytorch:2.5.1", "python:3.12-slim")
GIANT = (10**6, 10**9, 2**31 - 1)
MAX_BODY = 3 * 1024 * 1024
EXAMPLE_JOBS = Path(__file__).resolve().parent.parent / "examples" / "jobs"


@dataclass
class Case:
    """One request: where it goes, its bytes, and (for a Pod review) the Pod, to check the patch on."""

    kind: str
    path: str
    body: bytes
    pod: dict[str, Any] | None = None


def deep_json(depth: int, leaf: bytes = b'"x"') -> bytes:
    """``depth`` nested objects as JSON text (orjson writes at most 254 levels; it reads 1,024)."""
    return b'{"a":' * depth + leaf + b"}" * depth


class Generator:
    def __init__(self, seed: int, jobs: int = 300) -> None:
        self.rng = random.Random(seed)
        self.registry = default_registry()
        self.plugins = self.registry.names()
        self.examples = [yaml.safe_load(path.read_text()) for path in sorted(EXAMPLE_JOBS.glob("*.yaml"))]
        # Half made up (mostly refused: bad flags, missing tasks), half the example jobs varied
        # (mostly wired), so that many patches are applied and checked.
        self.jobs: list[dict[str, Any]] = [self.job(i) if i % 2 else self.varied_example(i) for i in range(jobs)]
        self.uid = 0

    # Jobs ----------------------------------------------------------------------------------------

    def flag(self, plugin: str, tasks: list[str]) -> str:
        rng = self.rng
        cls = self.registry.get(plugin)
        flags = list(getattr(cls, "flags", ()))
        roll = rng.random()
        if not flags or roll < 0.05:
            return rng.choice(["--nope=1", "garbage", "--", "-x", "--port", "=", "a" * rng.choice((10, 5000))])
        flag = rng.choice(flags)
        if roll < 0.12:  # a value of the wrong kind
            return f"--{flag.name}={rng.choice(['abc', '-1', '99999999999', '', '0x', '1.5'])}"
        if flag.kind == "bool":
            return rng.choice([f"--{flag.name}", f"--{flag.name}=false", f"--{flag.name}=true"])
        if flag.kind == "int":
            return f"--{flag.name}={rng.choice([1, 22, 1024, 23456, 65535, rng.randint(1, 65535)])}"
        value = rng.choice(tasks) if tasks and rng.random() < 0.7 else rng.choice(["x", "w" * 40, "a,b", "auto", "1"])
        return f"--{flag.name}={value}"

    def container(self, name: str) -> dict[str, Any]:
        rng = self.rng
        container: dict[str, Any] = {"name": name, "image": rng.choice(IMAGES)}
        if rng.random() < 0.4:
            container["command"] = ["sh", "-c", "echo $VC_TASK_INDEX"]
        if rng.random() < 0.3:
            container["env"] = [{"name": f"USER_{i}", "value": str(i)} for i in range(rng.randint(1, 4))]
        if rng.random() < 0.2:
            container["ports"] = [{"name": "metrics", "containerPort": 9100}]
        if rng.random() < 0.2:
            container["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
        return container

    def job(self, i: int) -> dict[str, Any]:
        rng = self.rng
        names = rng.sample(TASK_NAMES, rng.randint(1, 4))
        if rng.random() < 0.05:
            names[0] = rng.choice(BAD_NAMES)
        tasks = []
        for name in names:
            replicas = rng.choice(GIANT) if rng.random() < 0.03 else rng.choice((0, 1, 1, 2, 2, 3, 4, 8))
            spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [self.container(name or "main")]}
            if rng.random() < 0.2:
                spec["initContainers"] = [self.container("init")]
            if rng.random() < 0.15:
                spec["volumes"] = [{"name": "data", "emptyDir": {}}]
                spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
            if rng.random() < 0.05:
                spec["hostname"] = rng.choice(["fixed", "Bad_Host", "h" * 70])
            tasks.append({"name": name, "replicas": replicas, "template": {"spec": spec}})
        plugins = {p: [self.flag(p, names) for _ in range(rng.choice((0, 0, 1, 2)))]
                   for p in rng.sample(self.plugins, rng.choice((0, 1, 1, 2, 2, 3, 4)))}
        if rng.random() < 0.03:
            plugins[rng.choice(["horovod", "Env", "", "x" * 100])] = []
        name = f"fz{i}-" + "".join(rng.choice("abcdefghij") for _ in range(rng.choice((3, 8, 40))))
        obj: dict[str, Any] = {
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name[:63], "namespace": "default", "uid": f"uid-fz-{i}", "resourceVersion": "1"},
            "spec": {"minAvailable": 1, "schedulerName": "volcano", "tasks": tasks},
        }
        if rng.random() < 0.2:  # some plugins through the annotation, as this project allows
            moved = dict(list(plugins.items())[: len(plugins) // 2 + 1])
            for key in moved:
                plugins.pop(key, None)
            text = json.dumps(moved) if rng.random() < 0.9 else "{not json"
            obj["metadata"]["annotations"] = {PLUGINS_ANNOTATION: text}
        obj["spec"]["plugins"] = plugins
        return obj

    def varied_example(self, i: int) -> dict[str, Any]:
        """An example job under another name, with other replica counts and more in its Pods."""
        rng = self.rng
        job = copy.deepcopy(self.examples[i // 2 % len(self.examples)])
        meta = job["metadata"]
        meta["name"] = f"ex{i}-{meta['name']}"[:50]
        meta["uid"], meta["resourceVersion"] = f"uid-ex-{i}", "1"
        for task in job["spec"]["tasks"]:
            if rng.random() < 0.5:
                task["replicas"] = rng.choice((1, 2, 3, 5, 16, 64))
            spec = task.setdefault("template", {}).setdefault("spec", {})
            first = (spec.get("containers") or [{}])[0]
            if rng.random() < 0.3:
                first.setdefault("env", []).append({"name": "USER_SET", "value": "1"})
            if rng.random() < 0.2:
                first.setdefault("ports", []).append({"name": "metrics", "containerPort": 9100})
            if rng.random() < 0.2:
                spec.setdefault("volumes", []).append({"name": "scratch", "emptyDir": {}})
                first.setdefault("volumeMounts", []).append({"name": "scratch", "mountPath": "/scratch"})
            if rng.random() < 0.15:
                spec.setdefault("containers", []).append(self.container("sidecar"))
        return job

    # Pods ----------------------------------------------------------------------------------------

    def pod(self, job: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng
        task = rng.choice(job["spec"]["tasks"])
        index = rng.randint(0, max(0, min(task["replicas"], 8) - 1)) if rng.random() < 0.95 else rng.randint(0, 10**6)
        try:
            pod = make_pod(Job.from_object(job), task["name"], index)
        except PluginError:  # a broken job: the Pod as the controller would still label it
            meta = job["metadata"]
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{meta['name']}-{task['name']}-{index}"[:253], "namespace": "default",
                             "labels": {"volcano.sh/job-name": meta["name"], "volcano.sh/task-spec": task["name"],
                                        "volcano.sh/task-index": str(index)},
                             "annotations": {"volcano.sh/task-spec": task["name"], "volcano.sh/task-index": str(index)}},
                "spec": copy.deepcopy(task["template"]["spec"]),
            }
        if rng.random() < 0.1:  # another webhook or the user added things first
            pod["spec"]["containers"].append(self.container("sidecar"))
        return pod

    def damage(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
        """A damaged copy of ``pod`` (and, for nesting orjson cannot write, a marker to splice)."""
        rng = self.rng
        pod = copy.deepcopy(pod)
        spec, meta = pod.setdefault("spec", {}), pod.setdefault("metadata", {})
        containers = spec.get("containers") or [{}]
        choice = rng.randrange(16)
        if choice == 0:
            spec["containers"] = rng.choice(["x", 7, None, {}, [1, 2]])
        elif choice == 1:
            containers[0]["env"] = rng.choice([{"a": 1}, "E", [1], [{"name": 5}], [{"value": "x"}]])
        elif choice == 2:
            meta["labels"] = rng.choice([["x"], "l", {"volcano.sh/job-name": 123}, {"volcano.sh/job-name": ""}])
        elif choice == 3:
            meta.setdefault("annotations", {})["volcano.sh/task-index"] = rng.choice([5, "-1", "x", "99999999999999"])
        elif choice == 4:
            pod["spec"] = rng.choice([[], "s", 1])
        elif choice == 5:
            pod["metadata"] = rng.choice(["m", [], None])
        elif choice == 6:
            containers[0]["ports"] = rng.choice(["p", [{"containerPort": "x"}], [None]])
        elif choice == 7:
            spec["volumes"] = rng.choice([{"v": 1}, ["v"], [{"name": 1}]])
        elif choice == 8:
            meta.setdefault("annotations", {})["big"] = "x" * rng.choice((10_000, 500_000, 2_000_000))
        elif choice == 9:
            containers[0]["name"] = "n" * rng.choice((64, 10_000))
        elif choice == 10:
            depth = rng.choice((50, 101, 254, 600, 1000))
            containers[0]["x-deep"] = "@@DEEP@@"
            return pod, deep_json(depth)
        elif choice == 11:
            for key in rng.sample(list(pod), k=min(len(pod), 2)):
                del pod[key]
        elif choice == 12:
            meta["labels"] = {**(meta.get("labels") or {}), "volcano.sh/job-name": rng.choice(["no-such-job", "x" * 300])}
        elif choice == 13:
            spec["initContainers"] = rng.choice(["i", [{"name": "init"}] * 3, [7]])
        elif choice == 14:
            meta["name"] = rng.choice([5, "\u0000\u202e", "é" * 300])
        else:
            pod["kind"] = rng.choice(["Service", 5, None])
        return pod, None

    # Requests ------------------------------------------------------------------------------------

    def review(self, obj: Any, *, operation: str = "CREATE", version: str = "admission.k8s.io/v1") -> dict[str, Any]:
        self.uid += 1
        if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
            return admission_review(obj, uid=f"fz-{self.uid}", operation=operation, api_version=version)
        review = admission_review({"kind": "Pod", "metadata": {}}, uid=f"fz-{self.uid}", operation=operation, api_version=version)
        review["request"]["object"] = obj
        return review

    def broken_body(self) -> bytes:
        rng = self.rng
        valid = orjson.dumps(self.review(self.pod(rng.choice(self.jobs))))
        choice = rng.randrange(12)
        if choice == 0:
            return valid[: rng.randrange(len(valid))]
        if choice == 1:
            return bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 64, 2048))))
        if choice == 2:
            return rng.choice([b"[]", b"123", b'"s"', b"null", b'{"request": []}', b"{}", b"true"])
        if choice == 3:
            review = orjson.loads(valid)
            field = rng.choice(["uid", "kind", "operation", "dryRun", "subResource", "namespace"])
            review["request"][field] = rng.choice([5, [], {"a": 1}, "yes", None])
            return orjson.dumps(review)
        if choice == 4:
            review = orjson.loads(valid)
            review["apiVersion"] = rng.choice(["admission.k8s.io/v2", "", 1])
            return orjson.dumps(review)
        if choice == 5:
            return b"[" * 1025 + b"]" * 1025
        if choice == 6:
            review = orjson.loads(valid)
            review["request"]["options"] = "@@DEEP@@"
            return orjson.dumps(review).replace(b'"@@DEEP@@"', deep_json(rng.choice((300, 1000))))
        if choice == 7:
            return valid.replace(b'"name"', b'"\xff\xfe"', 1)
        if choice == 8 and rng.random() < 0.05:
            return b" " * (MAX_BODY + 1)
        if choice == 9:
            return valid[:-1] + b',"request":{}}'  # a duplicate key
        if choice == 10:
            return b"\xef\xbb\xbf" + valid  # a byte-order mark
        return valid.replace(b"{", b"{\n", 5)

    def case(self) -> Case:
        rng = self.rng
        roll = rng.random()
        if roll < 0.45:
            pod = self.pod(rng.choice(self.jobs))
            version = "admission.k8s.io/v1beta1" if rng.random() < 0.1 else "admission.k8s.io/v1"
            return Case("pod", "/mutate", orjson.dumps(self.review(pod, version=version)), pod)
        if roll < 0.65:
            pod, deep = self.damage(self.pod(rng.choice(self.jobs)))
            body = orjson.dumps(self.review(pod))
            if deep is not None:
                return Case("damaged-pod", "/mutate", body.replace(b'"@@DEEP@@"', deep))
            return Case("damaged-pod", "/mutate", body, pod)
        if roll < 0.8:
            job = copy.deepcopy(rng.choice(self.jobs))
            if rng.random() < 0.3:
                job["spec"] = rng.choice([[], {"tasks": "t"}, {"tasks": [{"name": 5}]}, {"tasks": [{"replicas": -1}]}])
            return Case("job", "/validate", orjson.dumps(self.review(job, operation=rng.choice(["CREATE", "UPDATE"]))))
        if roll < 0.9:
            return Case("broken-body", rng.choice(["/mutate", "/validate"]), self.broken_body())
        pod = self.pod(rng.choice(self.jobs))
        review = self.review(pod, operation=rng.choice(["UPDATE", "DELETE", "CONNECT"]))
        if rng.random() < 0.5:
            review["request"]["subResource"] = rng.choice(["status", "binding", "exec"])
        return Case("other", "/mutate", orjson.dumps(review), pod)

    def cases(self, count: int) -> Iterator[Case]:
        for _ in range(count):
            yield self.case()
