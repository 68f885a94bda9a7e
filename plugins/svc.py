"""``svc``: stable host names and peer host lists for every Pod (SPEC Part 2 §6.2).

Pods get ``hostname``/``subdomain`` (when empty), ``VC_<TASK>_HOSTS``/``VC_<TASK>_NUM`` for every
task read from the ``<job>-svc`` ConfigMap, and that ConfigMap mounted at ``/etc/volcano``. The job
gets the ConfigMap (host files), a headless Service ``<job>`` and a NetworkPolicy ``<job>``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from .base import Existing, Plugin, PodContext
from .flags import Flag
from .pod import JOB_NAME_KEY, Obj, ensure_envs, ensure_mount, ensure_volume, spec
from .keys import JOB_NAMESPACE_KEY

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
        return self._oversized_warnings()

    @cached_property
    def _oversized(self) -> dict[str, int]:
        """Tasks whose comma-joined host list is longer than the server's ``hosts_env_limit``, with
        that length. One environment string over 128 KiB stops a container from starting, so their
        ``VC_<TASK>_HOSTS`` reference is left out; the host file and ``VC_<TASK>_NUM`` stay."""
        limit = self.settings.hosts_env_limit
        if limit is None:
            return {}
        sizes = {task.name: self.job.host_list_length(task) for task in self.job.tasks}
        return {name: size for name, size in sizes.items() if size > limit}

    def _oversized_warnings(self) -> list[str]:
        return [
            self.warning(
                f"task {name!r}: {hosts_env_name(name)} left out: its host list is {size} bytes, over the "
                f"hosts_env_limit of {self.settings.hosts_env_limit}; read {MOUNT_PATH}/{task_key(name)}.host instead"
            )
            for name, size in self._oversized.items()
        ]

    @cached_property
    def _env(self) -> list[tuple[str, str | None, Obj | None]]:
        """The ``VC_<TASK>_*`` references every container gets: the same for every Pod of the job."""
        if not self.options["inject-hosts-env"]:
            return []
        cm_name = config_map_name(self.job.name)
        env: list[tuple[str, str | None, Obj | None]] = []
        for task in self.job.tasks:
            names = [num_env_name(task.name)]
            if task.name not in self._oversized:
                names.insert(0, hosts_env_name(task.name))
            env.extend((n, None, {"configMapKeyRef": {"name": cm_name, "key": n}}) for n in names)
        return env

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
        for container in ctx.all_containers():
            if self._env:
                ensure_envs(container, self._env)
            ensure_mount(container, {"name": cm_name, "mountPath": MOUNT_PATH})

    def hosts_data(self) -> dict[str, str]:
        """The ConfigMap data Volcano's ``GenerateHosts`` builds, per task in ``spec.tasks`` order."""
        data: dict[str, str] = {}
        for task in self.job.tasks:
            hosts = self.job.host_names(task)
            data[f"{task_key(task.name)}.host"] = "\n".join(hosts)
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
