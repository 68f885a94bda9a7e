"""``ray``: ``ray start`` commands, head ports and the head Service (docs/volcano-behaviour.md#ray)."""

from __future__ import annotations

from ..base import Existing, Plugin, PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, plugin_error, plugin_warning, reject, require_name, task_hint, template_containers
from ..job import Task
from ..kinds import SERVICE
from ..pod import Obj, containers, ensure_port


def head_service_name(job_name: str) -> str:
    return f"{job_name}-head-svc"


class RayPlugin(Plugin):
    name = "ray"
    requires = ("svc",)
    flags = (
        Flag("head", "string", "head", "name of the head task"),
        Flag("headContainer", "string", "head", "name of the container that runs the head in head Pods"),
        Flag("worker", "string", "worker", "name of the worker task"),
        Flag("workerContainer", "string", "worker", "name of the container that runs a worker in worker Pods"),
        port_flag("port", 6379, "GCS port"),
        port_flag("dashboardPort", 8265, "dashboard port"),
        # Volcano's docs call it --clientServerPort; its code only defines --clientPort.
        port_flag("clientPort", 10001, "Ray client server port", aliases=("clientServerPort",)),
    )

    def ports(self) -> list[tuple[str, int]]:
        return [("gcs", self.options["port"]), ("dashboard", self.options["dashboardPort"]), ("client-server", self.options["clientPort"])]

    def head_is_worker(self) -> bool:
        """One task and one container named for both roles: it runs the head only."""
        options = self.options
        return bool(options["head"] == options["worker"] and options["headContainer"] == options["workerContainer"])

    def _head(self) -> Task:
        head = self.job.task(self.options["head"])
        if head is None:
            raise plugin_error(self, "--head", f"the job has no head task {self.options['head']!r}{task_hint(self, self.options['head'])}")
        return head

    def check(self) -> list[str]:
        head = self._head()
        require_name(self, "dns1035", head_service_name(self.job.name), "head Service name")
        self._require_distinct_ports()
        self._require_ports_free(head, self.options["headContainer"])
        warnings = []
        if self.head_is_worker():
            warnings.append(plugin_warning(
                self,
                f"--head and --worker name the same task {self.options['head']!r} and --headContainer and "
                f"--workerContainer the same container {self.options['headContainer']!r}: it runs the ray head "
                "(Volcano would run a worker there that waits for a head no Pod starts)"
            ))
        for flag, task_flag in (("headContainer", "head"), ("workerContainer", "worker")):
            task = self.job.task(self.options[task_flag])
            if task and not any(c.get("name") == self.options[flag] for c in task.containers if isinstance(c, dict)):
                warnings.append(plugin_warning(self, f"--{flag}: task {task.name!r} has no container named {self.options[flag]!r}; it gets no ray command"))
        return warnings

    def _require_distinct_ports(self) -> None:
        """Volcano opens each port only when the container lacked it before, so two flags of one
        number give the head container two ports of that number (accepted, with a warning) and the
        head Service two ports of that number, which the API server rejects ("Duplicate value"):
        Volcano's job never gets past creating it. Ray cannot serve two things on one port either."""
        seen: dict[int, str] = {}
        for flag in ("port", "dashboardPort", "clientPort"):
            number = self.options[flag]
            if number in seen:
                raise plugin_error(
                    self,
                    f"--{flag}",
                    f"{number} is also --{seen[number]}: the head Service cannot carry one port number twice",
                )
            seen[number] = flag

    def _require_ports_free(self, head: Task, container: str) -> None:
        """The head container's ports, in order: an earlier one may take a number a later one skips."""
        for where, found in template_containers(head, init=False):
            if found.get("name") != container:
                continue
            trial: Obj = {"name": container, "ports": [dict(p) for p in found.get("ports") or [] if isinstance(p, dict)]}
            for name, number in self.ports():
                reject(self, f"{where}.ports", ensure_port(trial, name, number))

    def mutate(self, ctx: PodContext) -> None:
        head = self._head()
        is_head = ctx.task.name == self.options["head"]
        # Volcano's two checks are independent: a task that is both head and worker gets both.
        is_worker = ctx.task.name == self.options["worker"] and not self.head_is_worker()
        if not (is_head or is_worker):
            return
        head_command = (
            "ray start --head --block --dashboard-host=0.0.0.0 "
            f"--port={self.options['port']} --dashboard-port={self.options['dashboardPort']} "
            f"--ray-client-server-port={self.options['clientPort']}"
        )
        worker_command = f"ray start --block --address={domain_name(self, head, 0)}:{self.options['port']}"
        for i, container in enumerate(containers(ctx.pod)):
            name = container.get("name")
            if is_head and name == self.options["headContainer"]:
                for port_name, number in self.ports():
                    reject(self, f"spec.containers[{i}].ports", ensure_port(container, port_name, number))
                container["command"] = ["sh", "-c", head_command]
            if is_worker and name == self.options["workerContainer"]:
                container["command"] = ["sh", "-c", worker_command]
                ctx.names_hosts(self.name)

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        job = self.job
        return [job.side_object(SERVICE, head_service_name(job.name), spec={
            "selector": job.task_selector(self._head()),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in self.ports()],
        })]
