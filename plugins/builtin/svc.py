"""``svc``: stable host names, peer host lists and the job's network objects (docs/volcano-behaviour.md#svc).

Host files past the ConfigMap's 1 MiB, where Volcano's job never starts, are written in each Pod by an
init container (docs/volcano-behaviour.md#svc-host-files-past-the-configmaps-limit), into an emptyDir
at ``/etc/volcano``: not one ``subPath`` mount per file, which would grow every Pod with its tasks and
never see the ConfigMap's updates.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

from ..base import Existing, Mount, Plugin, PodContext
from ..budget import (
    ARG_LIMIT_TEXT,
    DATA_LIMIT,
    DATA_LIMIT_TEXT,
    ENV_LIMIT_TEXT,
    ENV_STRING_LIMIT,
    GENERATED_LIMIT,
    GENERATED_LIMIT_TEXT,
    STORE_LIMIT,
    STORE_LIMIT_TEXT,
    Hosts,
    digits,
    env_value_limit,
    stored_map,
)
from ..flags import Flag
from ..helpers import (
    add_init_container,
    host_names,
    host_suffix,
    hosts_size,
    name_taken,
    plugin_error,
    plugin_warning,
    reject,
    require_hostnames,
    require_mount_free,
    require_name,
    template_containers,
)
from ..kinds import CONFIG_MAP, SERVICE
from ..pod import Obj, ensure_envs, ensure_mount, ensure_volume, sized_as_first_container, spec
from . import netpolicy
from .pytorch import wait_image

MOUNT_PATH = "/etc/volcano"
# Jobs whose host files do not all fit the ConfigMap (module docstring).
INIT_CONTAINER = "volcano-svc-hosts"
_NAME_TAKEN = name_taken(INIT_CONTAINER, "the init container svc adds to write the host files its ConfigMap cannot hold")
CONFIG_MAP_PATH = "/etc/volcano-configmap"  # the ConfigMap, in the init container only

# Run as ``sh -c SCRIPT volcano-svc-hosts CONFIG_MAP_PATH MOUNT_PATH``. {lines} calls write_hosts /
# write_one once per left-out host file; the other fields are shell-quoted words.
_SCRIPT = """\
# {name} (volcano-job-webhook svc plugin): the host files of job {job} that do not fit its
# ConfigMap {cm} are written here, next to copies of its keys, as the ConfigMap would show them.
set -eu
umask 022
cm=$1 dir=$2
cd "$cm"
# The ConfigMap volume's entries (the kubelet's ..data links are not keys), without one cp per key.
ls | xargs sh -c 'exec cp "$@" "$0"' "$dir"
# <job>-<task>-0.<subdomain> ... -<count-1>, one a line, no final newline (Volcano's strings.Join).
write_hosts() {{
  awk -v p="$2" -v n="$3" -v s="$4" 'BEGIN {{ for (i = 0; i < n; i++) printf "%s%s-%d.%s", (i ? "\\n" : ""), p, i, s }}' >"$dir/$1"
}}
write_one() {{ printf '%s' "$2" >"$dir/$1"; }}
{lines}
echo "$0: job {job}: $dir holds the keys of ConfigMap {cm} and {written}"
"""


def config_map_name(job_name: str) -> str:
    return f"{job_name}-svc"


def hosts_volume_name(job_name: str) -> str:
    """The emptyDir at ``/etc/volcano`` of a job whose host files do not all fit its ConfigMap."""
    return f"{job_name}-svc-hosts"


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


def _same_container(current: Obj, wanted: Obj) -> bool:
    """``current`` is ``wanted`` with what the API server defaults (imagePullPolicy, ...) besides."""
    mounts = [m for m in current.get("volumeMounts") or [] if isinstance(m, dict)]
    return (
        all(current.get(key) == wanted[key] for key in ("image", "command"))
        and len(mounts) == len(wanted["volumeMounts"])
        and all(want.items() <= have.items() for want, have in zip(wanted["volumeMounts"], mounts, strict=True))
    )


@dataclass(frozen=True)
class _Plan:
    """What of the job's host lists fits, decided once per job from sizes alone: the tasks whose
    ``<task>.host`` each Pod writes itself (none while the ConfigMap holds them all), the tasks whose
    ``VC_<TASK>_HOSTS`` key stays in the ConfigMap, those whose variable every container gets, and
    the warnings for the rest."""

    generated: tuple[str, ...]
    in_config_map: frozenset[str]
    in_env: frozenset[str]
    warnings: list[str]


def _fits(keys: int, values: int, entries: int) -> bool:
    return values <= DATA_LIMIT and stored_map(keys, values, entries) <= STORE_LIMIT


def _over(keys: int, values: int, entries: int) -> str:
    if values > DATA_LIMIT:
        return f"{values} bytes of data, over {DATA_LIMIT_TEXT}"
    return f"{stored_map(keys, values, entries)} bytes stored, over {STORE_LIMIT_TEXT}"


class SvcPlugin(Plugin):
    name = "svc"
    flags = (
        Flag("publish-not-ready-addresses", "bool", False, "Service spec.publishNotReadyAddresses"),
        Flag("disable-network-policy", "bool", False, "do not create the job's NetworkPolicy"),
        Flag("inject-hosts-env", "bool", True, "add VC_<TASK>_HOSTS and VC_<TASK>_NUM to every container"),
        *netpolicy.FLAGS,
    )

    def check(self) -> list[str]:
        for task in self.job.tasks:
            require_hostnames(self, task)
        require_name(self, "label", config_map_name(self.job.name), "volume name")
        if not self.job.own_service:
            require_name(self, "dns1035", self.job.name, "Service name")
        if self._plan.generated:
            require_name(self, "label", hosts_volume_name(self.job.name), "volume name")
            self._check_init_container()
        require_mount_free(self, self.job.tasks, self.mounts()[0])
        self._check_ingress()
        return list(self._plan.warnings)

    @cached_property
    def ingress(self) -> netpolicy.Ingress:
        """What the NetworkPolicy flags allow besides the job's own Pods (:mod:`.netpolicy`)."""
        return netpolicy.read_ingress(self)

    def _check_ingress(self) -> None:
        """The NetworkPolicy flags, read at check(): one that does not parse refuses the job, never
        only its objects."""
        if self.ingress.given and self.options["disable-network-policy"]:
            flag = next(f.name for f in netpolicy.FLAGS if self.options[f.name])
            raise plugin_error(self, f"--{flag}", "--disable-network-policy makes no NetworkPolicy, so every client "
                               f"reaches the job already: give one of --disable-network-policy and --{flag}")

    def mounts(self) -> list[Mount]:
        volume = hosts_volume_name if self._plan.generated else config_map_name
        return [Mount(MOUNT_PATH, volume(self.job.name), "volumeMounts")]

    def injected_init_containers(self) -> frozenset[str]:
        return frozenset({INIT_CONTAINER}) if self._plan.generated else frozenset()

    @cached_property
    def _hosts(self) -> dict[str, Hosts]:
        return {task.name: hosts_size(self, task) for task in self.job.tasks}

    @cached_property
    def _plan(self) -> _Plan:
        """The ConfigMap sized before it is built: past its limit host files left out largest first (refused
        past ``GENERATED_LIMIT``), then ``VC_<TASK>_HOSTS`` keys, each with its variable (a reference to a
        missing key stops the container); variables too long to inject left out (docs/volcano-behaviour.md#limits)."""
        job, cm = self.job, config_map_name(self.job.name)
        hosts = self._hosts
        length = {name: h.joined() for name, h in hosts.items()}
        values = sum(length[name] + digits(h.count) for name, h in hosts.items())
        keys = sum(len(host_file_key(name)) + len(num_env_name(name)) for name in hosts)
        entries = 2 * len(hosts)
        files = sum(length.values())
        generated: list[str] = []
        for name in sorted(hosts, key=lambda n: (-length[n], n)):
            if _fits(keys, values, entries):
                break
            generated.append(name)
            values -= length[name]
            keys -= len(host_file_key(name))
            entries -= 1
        if not _fits(keys, values, entries):
            raise plugin_error(
                self,
                self.job.tasks_field,
                f"the ConfigMap {cm!r} would hold the counts (VC_<TASK>_NUM) of {len(hosts)} tasks even with every host file "
                f"written in the Pods: {_over(keys, values, entries)}",
            )
        written = sum(length[name] for name in generated)
        if written > GENERATED_LIMIT:
            largest = job.task(generated[0])
            assert largest is not None
            raise plugin_error(
                self,
                largest.replicas_path,
                f"the host files ({MOUNT_PATH}/<task>.host) would be {files} bytes; the {written} bytes of them the ConfigMap "
                f"{cm!r} cannot hold would be written in every Pod, over {GENERATED_LIMIT_TEXT}; task {largest.name!r} alone "
                f"has {length[largest.name]} bytes for {hosts[largest.name].count} hosts",
            )
        for name in generated:
            task = job.task(name)
            if task is not None and not task.hostname and job.host_prefix(task) is None:
                raise plugin_error(
                    self,
                    f"{job.tasks_field}[{task.position}]",
                    f"the host file {MOUNT_PATH}/{host_file_key(name)} ({length[name]} bytes for {hosts[name].count} hosts) "
                    f"does not fit the ConfigMap {cm!r}, and a {job.kind}'s host names cannot be written by counting in the Pods",
                )
        warnings = [
            plugin_warning(
                self,
                f"task {name!r}: {MOUNT_PATH}/{host_file_key(name)} ({length[name]} bytes for {hosts[name].count} hosts) "
                f"left out of the ConfigMap {cm!r}, which cannot hold it; every Pod's init container {INIT_CONTAINER!r} "
                f"writes it; {hosts_env_name(name)} left out of the ConfigMap and of every container"
            )
            for name in generated
        ]
        kept = set(hosts) - set(generated)
        values += sum(length[name] for name in kept)
        keys += sum(len(hosts_env_name(name)) for name in kept)
        for name in sorted(kept, key=lambda n: (-length[n], n)):
            if _fits(keys, values, entries + len(kept)):
                break
            warnings.append(plugin_warning(
                self,
                f"task {name!r}: {hosts_env_name(name)} left out of the ConfigMap {cm!r} and of every container: "
                f"with it the ConfigMap would be {_over(keys, values, entries + len(kept))}; read "
                f"{MOUNT_PATH}/{host_file_key(name)} instead"
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
            warnings.append(plugin_warning(
                self,
                f"task {name!r}: {env_name} left out: its host list is {size} bytes, {reason}; "
                f"read {MOUNT_PATH}/{host_file_key(name)} instead"
            ))
        order = {task.name: task.position for task in job.tasks}
        return _Plan(tuple(sorted(generated, key=order.__getitem__)), frozenset(kept), frozenset(in_env), warnings)

    # ---- the init container of a job whose host files do not all fit its ConfigMap

    @cached_property
    def image(self) -> str:
        return wait_image(self)

    @cached_property
    def script(self) -> str:
        """The init container's ``sh -c`` script: one line per host file it writes."""
        lines, written = [], []
        for name in self._plan.generated:
            task = self.job.task(name)
            assert task is not None
            suffix = host_suffix(self, task)
            file = host_file_key(name)
            count = self._hosts[name].count
            if task.hostname:  # svc lists a task whose template fixes the hostname once
                host = f"{task.hostname}.{suffix}" if count else ""
                line = f"write_one {shlex.quote(file)} {shlex.quote(host)}"
            else:
                prefix = self.job.host_prefix(task)
                assert prefix is not None  # _plan refuses a task whose names are not counted
                line = f"write_hosts {shlex.quote(file)} {shlex.quote(prefix)} {count} {shlex.quote(suffix)}"
            lines.append(line)
            written.append(f"{file} ({count} hosts)")
        return _SCRIPT.format(
            name=INIT_CONTAINER,
            job=shlex.quote(self.job.key),
            cm=shlex.quote(config_map_name(self.job.name)),
            lines="\n".join(lines),
            written=", ".join(written),
        )

    def init_container(self) -> Obj:
        return {
            "name": INIT_CONTAINER,
            "image": self.image,
            "command": ["sh", "-c", self.script, INIT_CONTAINER, CONFIG_MAP_PATH, MOUNT_PATH],
            "volumeMounts": [
                {"name": config_map_name(self.job.name), "mountPath": CONFIG_MAP_PATH, "readOnly": True},
                {"name": hosts_volume_name(self.job.name), "mountPath": MOUNT_PATH},
            ],
        }

    def _check_init_container(self) -> None:
        if not self.image:
            raise plugin_error(self, "image", f"the pytorch plugin's --wait-master-image, which svc's init container {INIT_CONTAINER!r} uses, is empty")
        # The script is one argument of sh -c: one string the kernel passes whole, or not at all.
        if len(self.script) + 1 > ENV_STRING_LIMIT:
            raise plugin_error(
                self,
                "spec.tasks",
                f"the script of the init container {INIT_CONTAINER!r}, writing {len(self._plan.generated)} host files, would "
                f"be {len(self.script)} bytes, over {ARG_LIMIT_TEXT}",
            )
        for task in self.job.tasks:
            for where, container in template_containers(task):
                if container.get("name") == INIT_CONTAINER:
                    raise plugin_error(self, f"{where}.name", _NAME_TAKEN)

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
        ctx.warnings.append(plugin_warning(
            self,
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
        require_name(self, "label", pod_spec["hostname"], "spec.hostname")
        require_name(self, "label", pod_spec["subdomain"], "spec.subdomain")
        ctx.names_hosts(self.name)  # its host files, and VC_<TASK>_HOSTS

        cm_name = config_map_name(self.job.name)
        # check() has already made sure the volume names are valid labels.
        volumes: list[Obj] = [{"name": cm_name, "configMap": {"name": cm_name}}]
        mount: Obj = {"name": cm_name, "mountPath": MOUNT_PATH}
        if self._plan.generated:
            volume = hosts_volume_name(self.job.name)
            volumes.append({"name": volume, "emptyDir": {}})
            mount = {"name": volume, "mountPath": MOUNT_PATH, "readOnly": True}
        for volume_obj in volumes:
            reject(self, "spec.volumes", ensure_volume(ctx.pod, volume_obj))
        env = self._env if self._env and self._env_fits(ctx) else []
        for where, container in ctx.located_containers():
            if container.get("name") == INIT_CONTAINER and self._plan.generated:
                continue  # ours (when the chain did not say so: a plugin run on its own)
            if env:
                ensure_envs(container, env)
            reject(self, f"{where}.volumeMounts", ensure_mount(container, dict(mount)))
        if self._plan.generated:  # first, so that the template's own init containers see /etc/volcano filled
            wanted = {**self.init_container(), **sized_as_first_container(ctx.pod)}
            add_init_container(self, ctx.pod, wanted, _NAME_TAKEN, first=True, same=_same_container)

    def hosts_data(self) -> dict[str, str]:
        """The ConfigMap data Volcano's ``GenerateHosts`` builds, per task in ``spec.tasks`` order,
        without the host files and ``VC_<TASK>_HOSTS`` keys that do not fit (:attr:`_plan`)."""
        plan = self._plan  # raises before anything is built when the host files cannot be served
        data: dict[str, str] = {}
        for task in self.job.tasks:
            if task.name in plan.generated:
                data[num_env_name(task.name)] = str(self._hosts[task.name].count)
                continue
            hosts = host_names(self, task)
            data[host_file_key(task.name)] = "\n".join(hosts)
            if task.name in plan.in_config_map:
                data[hosts_env_name(task.name)] = ",".join(hosts)
            data[num_env_name(task.name)] = str(len(hosts))
        return data

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        job = self.job
        out: list[dict[str, Any]] = [job.side_object(CONFIG_MAP, config_map_name(job.name), data=self.hosts_data())]
        if not job.own_service:  # a JobSet makes its own, named after its subdomain
            out.append(job.side_object(SERVICE, job.name, spec={
                "clusterIP": "None",
                "selector": job.pod_selector(),
                "publishNotReadyAddresses": self.options["publish-not-ready-addresses"],
            }))
        if not self.options["disable-network-policy"]:
            selector = job.pod_selector()
            own: Obj = {"podSelector": {"matchLabels": dict(selector)}}
            ingress = self.ingress
            peers = [copy.deepcopy(peer) for peer in ingress.peers]  # the cached ones stay as read
            out.append(netpolicy.network_policy(self, job.name, selector, {"from": [own, *peers]}))
            out.extend(netpolicy.opened_policies(self, ingress))
        return out
