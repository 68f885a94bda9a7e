"""``svc``: stable host names and peer host lists for every Pod (SPEC Part 2 §6.2).

Pods get ``hostname``/``subdomain`` (when empty), ``VC_<TASK>_HOSTS``/``VC_<TASK>_NUM`` for every
task read from the ``<job>-svc`` ConfigMap, and that ConfigMap mounted at ``/etc/volcano``. The job
gets the ConfigMap (host files), a headless Service ``<job>`` and a NetworkPolicy ``<job>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

from .base import Existing, Mount, Plugin, PodContext
from .budget import (
    DATA_LIMIT,
    DATA_LIMIT_TEXT,
    ENV_LIMIT_TEXT,
    STORE_LIMIT,
    STORE_LIMIT_TEXT,
    digits,
    env_value_limit,
    stored_map,
    task_hosts,
)
from .flags import Flag
from .keys import JOB_NAME_KEY, JOB_NAMESPACE_KEY
from .pod import Obj, ensure_envs, ensure_mount, ensure_volume, spec

MOUNT_PATH = "/etc/volcano"


def config_map_name(job_name: str) -> str:
    return f"{job_name}-svc"


def task_key(task: str) -> str:
    """Host-file key stem: ``-`` becomes ``_``, case kept (``mpi-worker`` → ``mpi_worker``)."""
    return task.replace("-", "_")


def hosts_env_name(task: str) -> str:
    return f"VC_{task_key(task).upper()}_HOSTS"


def num_env_name(task: str) -> str:
    return f"VC_{task_key(task).upper()}_NUM"


def host_file_key(task: str) -> str:
    return f"{task_key(task)}.host"


EnvEntry = tuple[str, str | None, Obj | None]


@dataclass(frozen=True)
class _Plan:
    """What of the job's host lists fits, decided once per job from sizes alone: the tasks whose
    ``VC_<TASK>_HOSTS`` key stays in the ConfigMap, those whose variable every container gets, and
    the warnings for the rest."""

    in_config_map: frozenset[str]
    in_env: frozenset[str]
    warnings: list[str]


class SvcPlugin(Plugin):
    name = "svc"
    flags = (
        Flag("publish-not-ready-addresses", "bool", False, "Service spec.publishNotReadyAddresses"),
        Flag("disable-network-policy", "bool", False, "do not create the job's NetworkPolicy"),
        Flag("inject-hosts-env", "bool", True, "add VC_<TASK>_HOSTS and VC_<TASK>_NUM to every container"),
    )

    def check(self) -> list[str]:
        for task in self.job.tasks:
            self.require_hostnames(task)
        self.require_name("label", config_map_name(self.job.name), "volume name")
        self.require_name("dns1035", self.job.name, "Service name")
        self.require_mount_free(self.job.tasks, self.mounts()[0])
        return list(self._plan.warnings)

    def mounts(self) -> list[Mount]:
        return [Mount(MOUNT_PATH, config_map_name(self.job.name), "volumeMounts")]

    @cached_property
    def _plan(self) -> _Plan:
        """Size the ConfigMap before building it. Its host files and counts are the svc contract
        (SPEC Part 2 §6.2): past a ConfigMap's limit the job is refused. The ``VC_<TASK>_HOSTS`` keys
        repeat the host files comma-joined: past the limit they go, largest first, and so do their
        variables (a reference to a missing key stops the container). A variable longer than
        ``hosts_env_limit`` or than one environment string can be is left out too; the host file
        ``/etc/volcano/<task>.host`` and ``VC_<TASK>_NUM`` stay in every case."""
        job, cm = self.job, config_map_name(self.job.name)
        hosts = {task.name: task_hosts(job, task) for task in job.tasks}
        length = {name: h.joined() for name, h in hosts.items()}
        values = sum(length[name] + digits(h.count) for name, h in hosts.items())
        keys = sum(len(host_file_key(name)) + len(num_env_name(name)) for name in hosts)
        entries = 2 * len(hosts)
        stored = stored_map(keys, values, entries)
        if values > DATA_LIMIT or stored > STORE_LIMIT:
            largest = max(job.tasks, key=lambda t: length[t.name])
            limit = f"over {DATA_LIMIT_TEXT}" if values > DATA_LIMIT else f"{stored} bytes stored, over {STORE_LIMIT_TEXT}"
            raise self.error(
                f"spec.tasks[{largest.position}].replicas",
                f"the ConfigMap {cm!r} would hold {values} bytes of host files ({MOUNT_PATH}/<task>.host) and "
                f"counts, {limit}; task {largest.name!r} alone has {length[largest.name]} bytes for "
                f"{hosts[largest.name].count} hosts",
            )
        warnings: list[str] = []
        kept = set(hosts)
        values += sum(length.values())
        keys += sum(len(hosts_env_name(name)) for name in hosts)
        for name in sorted(hosts, key=lambda n: (-length[n], n)):
            stored = stored_map(keys, values, entries + len(kept))
            if values <= DATA_LIMIT and stored <= STORE_LIMIT:
                break
            over = f"{values} bytes of data, over {DATA_LIMIT_TEXT}" if values > DATA_LIMIT else f"{stored} bytes stored, over {STORE_LIMIT_TEXT}"
            warnings.append(self.warning(
                f"task {name!r}: {hosts_env_name(name)} left out of the ConfigMap {cm!r} and of every container: "
                f"with it the ConfigMap would be {over}; read {MOUNT_PATH}/{host_file_key(name)} instead"
            ))
            kept.discard(name)
            values -= length[name]
            keys -= len(hosts_env_name(name))
        in_env = set()
        setting = self.settings.hosts_env_limit
        for name in hosts:
            if name not in kept:
                continue
            size, env_name = length[name], hosts_env_name(name)
            if setting is not None and size > setting:
                reason = f"over the hosts_env_limit of {setting}"
            elif size > env_value_limit(env_name):
                reason = f"over {ENV_LIMIT_TEXT}"
            else:
                in_env.add(name)
                continue
            warnings.append(self.warning(
                f"task {name!r}: {env_name} left out: its host list is {size} bytes, {reason}; "
                f"read {MOUNT_PATH}/{host_file_key(name)} instead"
            ))
        return _Plan(frozenset(kept), frozenset(in_env), warnings)

    @cached_property
    def _env(self) -> list[EnvEntry]:
        """The ``VC_<TASK>_*`` references every container gets: the same for every Pod of the job."""
        if not self.options["inject-hosts-env"]:
            return []
        cm_name = config_map_name(self.job.name)
        env: list[EnvEntry] = []
        for task in self.job.tasks:
            names = [num_env_name(task.name)]
            if task.name in self._plan.in_env:
                names.insert(0, hosts_env_name(task.name))
            env.extend((n, None, {"configMapKeyRef": {"name": cm_name, "key": n}}) for n in names)
        return env

    @cached_property
    def _env_bytes(self) -> dict[str, int]:
        """What each entry of :attr:`_env` adds to a Pod's JSON (its comma included)."""
        return {name: len(orjson.dumps({"name": name, "valueFrom": ref})) + 1 for name, _, ref in self._env}

    def _env_fits(self, ctx: PodContext) -> bool:
        """Whether the variables fit the Pod: a job of thousands of tasks adds two references per
        task to every container. Past the limit etcd stores, they are left out with a warning; the
        values stay readable as files under /etc/volcano (one per ConfigMap key)."""
        added = 0
        for container in ctx.all_containers():
            present = {e.get("name") for e in container.get("env") or [] if isinstance(e, dict)}
            added += sum(size for name, size in self._env_bytes.items() if name not in present)
        if ctx.input_bytes + added <= STORE_LIMIT:
            return True
        ctx.warnings.append(self.warning(
            f"Pod {ctx.pod_name!r}: the VC_<TASK>_HOSTS and VC_<TASK>_NUM variables of the job's {len(self.job.tasks)} tasks "
            f"would add {added} bytes to a Pod of {ctx.input_bytes} bytes, over {STORE_LIMIT_TEXT}; left out: read "
            f"them as files in {MOUNT_PATH}, or set --inject-hosts-env=false"
        ))
        return False

    def mutate(self, ctx: PodContext) -> None:
        pod_spec = spec(ctx.pod)
        if not pod_spec.get("hostname"):
            pod_spec["hostname"] = ctx.pod_name
        if not pod_spec.get("subdomain"):
            pod_spec["subdomain"] = self.job.name
        self.require_name("label", pod_spec["hostname"], "spec.hostname")
        self.require_name("label", pod_spec["subdomain"], "spec.subdomain")

        cm_name = config_map_name(self.job.name)
        # check() has already made sure the volume name is a valid label.
        problem = ensure_volume(ctx.pod, {"name": cm_name, "configMap": {"name": cm_name}})
        if problem:
            raise self.error("spec.volumes", problem)
        env = self._env if self._env and self._env_fits(ctx) else []
        for where, container in ctx.located_containers():
            if env:
                ensure_envs(container, env)
            problem = ensure_mount(container, {"name": cm_name, "mountPath": MOUNT_PATH})
            if problem:
                raise self.error(f"{where}.volumeMounts", problem)

    def hosts_data(self) -> dict[str, str]:
        """The ConfigMap data Volcano's ``GenerateHosts`` builds, per task in ``spec.tasks`` order,
        without the ``VC_<TASK>_HOSTS`` keys that do not fit (:attr:`_plan`)."""
        plan = self._plan  # raises before anything is built when the host files cannot fit
        data: dict[str, str] = {}
        for task in self.job.tasks:
            hosts = self.job.host_names(task)
            data[host_file_key(task.name)] = "\n".join(hosts)
            if task.name in plan.in_config_map:
                data[hosts_env_name(task.name)] = ",".join(hosts)
            data[num_env_name(task.name)] = str(len(hosts))
        return data

    def _selector(self) -> dict[str, str]:
        return {JOB_NAME_KEY: self.job.name, JOB_NAMESPACE_KEY: self.job.namespace}

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        job = self.job
        out: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": job.object_meta(config_map_name(job.name)),
                "data": self.hosts_data(),
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": job.object_meta(job.name),
                "spec": {
                    "clusterIP": "None",
                    "selector": self._selector(),
                    "publishNotReadyAddresses": self.options["publish-not-ready-addresses"],
                },
            },
        ]
        if not self.options["disable-network-policy"]:
            selector = self._selector()
            out.append(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": job.object_meta(job.name),
                    "spec": {
                        "podSelector": {"matchLabels": selector},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": dict(selector)}}]}],
                        "policyTypes": ["Ingress"],
                    },
                }
            )
        return out
