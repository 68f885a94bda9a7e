"""``waitfor``: an init container that holds Pods until the Pods of other tasks resolve in DNS and, with
``--port``, answer on it (docs/volcano-behaviour.md#waitfor).

A Pod is in DNS only once Ready (unless svc publishes not-ready addresses) and answers on a port only
after its init containers: a task waiting for itself, or for one that waits for it, would wait until
``--timeout``, so that is refused.
"""

from __future__ import annotations

import shlex
from functools import cached_property

from ..base import Plugin, PodContext
from ..budget import ARG_LIMIT_TEXT, ENV_STRING_LIMIT
from ..flags import Flag
from ..helpers import add_init_container, host_names, host_suffix, name_taken, peer_options, plugin_error, plugin_warning, require_task
from ..job import Task
from ..pod import sized_as_first_container
from .pytorch import WAIT_CONTAINER as PYTORCH_WAIT
from .pytorch import PytorchPlugin, wait_image
from .svc import SvcPlugin

WAIT_CONTAINER = "wait-for-tasks"
_NAME_TAKEN = name_taken(WAIT_CONTAINER, "the waitfor plugin's init container")
INTERVAL = 2  # seconds between rounds, as pytorch's wait-for-master

# {hosts} adds every host to $hosts; the other fields are shell-quoted words.
_SCRIPT = """\
# {name} (volcano-job-webhook waitfor plugin): wait for the Pods of {tasks}
job={job} tasks={tasks_word} timeout={timeout} port={port} start=$(date +%s)
hosts=''
add() {{ i=0; while [ "$i" -lt "$2" ]; do hosts="$hosts $1-$i.$3"; i=$((i + 1)); done; }}
{hosts}
{domains}
resolves() {{
  for d in $domains ''; do
    nslookup "$1.${{d:+$d.}}" >/dev/null 2>&1 && return 0
  done
  return 1
}}
ready() {{
  resolves "$1" || {{ why='does not resolve'; return 1; }}
  [ -z "$port" ] || nc -w 2 "$1" "$port" -e true </dev/null >/dev/null 2>&1 || {{ why="does not answer on port $port"; return 1; }}
}}
set -- $hosts
total=$#
echo "waitfor: job $job: waiting up to ${{timeout}}s for the $total Pods of tasks $tasks to resolve${{port:+ and answer on port $port}}"
said=''
while :; do
  left='' first=''
  for h in $hosts; do
    ready "$h" && continue
    left="$left $h"
    [ -n "$first" ] || first="$h $why"
  done
  hosts=$left
  elapsed=$(($(date +%s) - start))
  [ -z "$hosts" ] && break
  set -- $hosts
  if [ "$elapsed" -ge "$timeout" ]; then
    echo "waitfor: job $job: timed out after ${{elapsed}}s: $# of $total Pods not ready; first: $first" >&2
    exit 1
  fi
  now="$# of $total Pods not ready; first: $first"
  [ "$now" = "$said" ] || echo "waitfor: job $job: $now (${{elapsed}}s of ${{timeout}}s)"
  said=$now
  sleep {interval}
done
echo "waitfor: job $job: all $total Pods of tasks $tasks ready after ${{elapsed}}s"
"""


# How the script finds the search domains it tries each name under, and, for names already fully
# qualified (a cluster_domain), that there are none to try.
_SEARCH_DOMAINS = """\
# Each search domain by hand, names fully qualified: busybox's nslookup applies the list unreliably.
domains=$(awk '$1 == "search" || $1 == "domain" { for (i = 2; i <= NF; i++) print $i }' /etc/resolv.conf 2>/dev/null)"""
_NO_SEARCH = """\
# The names are fully qualified in the cluster's domain: no search domain to try.
domains=''"""


def _names(text: str) -> list[str]:
    """A comma-separated list, blanks dropped, first occurrence kept."""
    return list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


class WaitforPlugin(Plugin):
    name = "waitfor"
    requires = ("svc",)
    flags = (
        Flag("tasks", "string", "", "comma-separated tasks whose Pods must resolve in DNS (required)"),
        Flag("waiters", "string", "", "comma-separated tasks whose Pods wait (default: every task not in --tasks)"),
        Flag("port", "int", None, "also wait until this TCP port answers on each Pod", minimum=1, maximum=65535),
        Flag("timeout", "int", 300, "seconds to wait before the init container fails (0: one round)", minimum=0),
    )

    @cached_property
    def tasks(self) -> list[Task]:
        return [require_task(self, "--tasks", name) for name in _names(self.options["tasks"])]

    @cached_property
    def waiters(self) -> list[Task]:
        names = _names(self.options["waiters"])
        if not names:
            waited = {t.name for t in self.tasks}
            names = [t.name for t in self.job.tasks if t.name not in waited]
        return [require_task(self, "--waiters", name) for name in names]

    @cached_property
    def image(self) -> str:
        return wait_image(self)

    @property
    def port(self) -> int | None:
        port = self.options["port"]
        return None if port is None else int(port)

    def check(self) -> list[str]:
        if not _names(self.options["tasks"]):
            raise plugin_error(self, "--tasks", "name the tasks whose Pods to wait for, comma-separated (e.g. --tasks=worker)")
        if not self.waiters:
            raise plugin_error(self, "--waiters", "no task is left to wait: every task is in --tasks; name the waiting tasks")
        if not self.image:
            raise plugin_error(self, "image", "the pytorch plugin's --wait-master-image, which waitfor's init container uses, is empty")
        self._check_deadlock()
        for task in self.waiters:
            for i, container in enumerate((task.template.get("spec") or {}).get("initContainers") or []):
                if isinstance(container, dict) and container.get("name") == WAIT_CONTAINER:
                    raise plugin_error(
                        self,
                        f"{task.template_path}.spec.initContainers[{i}]",
                        f"the name {WAIT_CONTAINER!r} is the waitfor plugin's init container; rename it",
                    )
            for i, container in enumerate(task.containers):
                if isinstance(container, dict) and container.get("name") == WAIT_CONTAINER:
                    raise plugin_error(self, f"{task.template_path}.spec.containers[{i}].name", _NAME_TAKEN)
        # The script is one argument of sh -c: one string the kernel passes whole, or not at all.
        if len(self.script) + 1 > ENV_STRING_LIMIT:
            raise plugin_error(
                self,
                "--tasks",
                f"the wait script for {len(self.tasks)} tasks would be {len(self.script)} bytes, over {ARG_LIMIT_TEXT}; "
                "wait for fewer tasks",
            )
        return [
            plugin_warning(
                self,
                f"task {task.name!r} has subdomain {task.subdomain!r}, not the job's headless Service "
                f"{self.job.name!r}: its Pods resolve only if a Service of that name exists"
            )
            for task in self.tasks
            if task.subdomain and task.subdomain != self.job.name
        ]

    def _check_deadlock(self) -> None:
        svc = peer_options(self, SvcPlugin) or {}
        if not self.port and svc.get("publish-not-ready-addresses"):
            return  # a Pod resolves from its first init container on: no one waits for a Ready Pod
        why = (
            f"--port {self.port} answers only once a Pod's containers run, after its init containers"
            if self.port
            else "a Pod is in DNS only once Ready (svc's --publish-not-ready-addresses is off)"
        )
        waited = {t.name for t in self.tasks}
        for task in self.waiters:
            if task.name in waited:
                raise plugin_error(self, "--waiters", f"task {task.name!r} would wait for its own Pods, and {why}: they would wait until --timeout")
        pytorch = peer_options(self, PytorchPlugin)
        if pytorch and pytorch["wait-master-enabled"] and pytorch["worker"] in waited:
            master = pytorch["master"]
            if any(t.name == master for t in self.waiters):
                raise plugin_error(
                    self,
                    "--waiters",
                    f"task {master!r} would wait for task {pytorch['worker']!r}, whose Pods wait for {master!r} in pytorch's "
                    f"{PYTORCH_WAIT}, and {why}: both would wait until --timeout",
                )

    def injected_init_containers(self) -> frozenset[str]:
        return frozenset({WAIT_CONTAINER})

    @cached_property
    def script(self) -> str:
        lines: list[str] = []
        for task in self.tasks:
            suffix = host_suffix(self, task)
            prefix = self.job.host_prefix(task)
            if task.hostname or prefix is None:  # svc lists one name for a task whose template fixes the hostname
                lines.extend(f'hosts="$hosts {host}"' for host in host_names(self, task))
            elif task.replicas:
                lines.append(f"add {shlex.quote(prefix)} {task.replicas} {shlex.quote(suffix)}")
        names = ", ".join(t.name for t in self.tasks)
        return _SCRIPT.format(
            name=WAIT_CONTAINER,
            tasks=names,
            tasks_word=shlex.quote(names),
            job=shlex.quote(self.job.key),
            timeout=self.options["timeout"],
            port="''" if self.port is None else self.port,
            hosts="\n".join(lines) or ":",
            domains=_NO_SEARCH if self.settings.cluster_domain else _SEARCH_DOMAINS,
            interval=INTERVAL,
        )

    def mutate(self, ctx: PodContext) -> None:
        if not any(t.name == ctx.task.name for t in self.waiters):
            return
        ctx.names_hosts(self.name)  # in its script
        wanted = {"name": WAIT_CONTAINER, "image": self.image, "command": ["sh", "-c", self.script], **sized_as_first_container(ctx.pod)}
        add_init_container(self, ctx.pod, wanted, _NAME_TAKEN)
