"""``pytorch``: ``torch.distributed``'s environment and port, and the workers' optional wait for the
master (docs/volcano-behaviour.md#pytorch)."""

from __future__ import annotations

from ..base import Plugin, PodContext
from ..flags import Flag, port_flag
from ..helpers import (
    add_init_container,
    domain_name,
    name_taken,
    peer_options,
    plugin_error,
    plugin_warning,
    reject,
    require_port_free,
    template_containers,
)
from ..pod import containers, ensure_envs, ensure_port

PORT_NAME = "pytorchjob-port"
WAIT_CONTAINER = "wait-for-master"
_NAME_TAKEN = name_taken(WAIT_CONTAINER, "the init container --wait-master-enabled adds to workers")
# Also the waitfor plugin's image, which reads this plugin's --wait-master-image when the job runs it.
DEFAULT_WAIT_IMAGE = "busybox:1.36.1"

_WAIT_SCRIPT = """echo "Waiting for master node {addr}:{port} to be ready..."
TIMEOUT={timeout}
ELAPSED=0
until {{ nc -z {addr} {port} || echo > /dev/tcp/{addr}/{port}; }} 2>/dev/null; do
  if [ $ELAPSED -ge $TIMEOUT ]; then
    echo "Timeout waiting for master after ${{TIMEOUT}} seconds"
    exit 1
  fi
  echo "Master not ready yet, retrying in 2 seconds... (elapsed: ${{ELAPSED}}s)"
  sleep 2
  ELAPSED=$((ELAPSED + 2))
done
echo "Master node is ready!\""""


def wait_image(plugin: Plugin) -> str:
    """The image of the init containers this project adds beside ``plugin`` (svc's, waitfor's): this
    plugin's ``--wait-master-image`` when the chain runs it for the job, else its default, so one
    setting serves them all."""
    options = peer_options(plugin, PytorchPlugin)
    return DEFAULT_WAIT_IMAGE if options is None else str(options["wait-master-image"])


class PytorchPlugin(Plugin):
    name = "pytorch"
    requires = ("svc",)
    flags = (
        Flag("master", "string", "master", "name of the master task"),
        Flag("worker", "string", "worker", "name of the worker task"),
        port_flag("port", 23456, "MASTER_PORT, opened on every container"),
        Flag("wait-master-enabled", "bool", False, "workers wait for the master's port in an init container"),
        Flag("wait-master-timeout", "int", 300, "seconds the init container waits", minimum=0),
        Flag("wait-master-image", "string", DEFAULT_WAIT_IMAGE, "image of the wait-for-master init container (and waitfor's)"),
    )

    def check(self) -> list[str]:
        if self.job.task(self.options["master"]) is None:
            return [plugin_warning(self, f"--master: the job has no task {self.options['master']!r}, so pytorch leaves its Pods alone (as Volcano does)")]
        if self.options["wait-master-enabled"] and not self.options["wait-master-image"]:
            raise plugin_error(self, "--wait-master-image", "must not be empty when --wait-master-enabled is set")
        require_port_free(self, self.job.tasks, PORT_NAME, self.options["port"])
        worker = self.job.task(self.options["worker"])
        if self.options["wait-master-enabled"] and worker is not None:
            for where, container in template_containers(worker, init=False):
                if container.get("name") == WAIT_CONTAINER:
                    raise plugin_error(self, f"{where}.name", _NAME_TAKEN)
        return []

    def injected_init_containers(self) -> frozenset[str]:
        return frozenset({WAIT_CONTAINER}) if self.options["wait-master-enabled"] else frozenset()

    def master_address(self) -> str | None:
        master = self.job.task(self.options["master"])
        return domain_name(self, master, 0) if master else None

    def world_size(self) -> int:
        roles = {self.options["master"], self.options["worker"]}
        return sum(task.replicas for task in self.job.tasks if task.name in roles)

    def mutate(self, ctx: PodContext) -> None:
        master_addr = self.master_address()
        if master_addr is None:  # Volcano leaves the Pod alone; check() warned
            return
        port = self.options["port"]
        rank: int | None = None
        if ctx.task.name == self.options["worker"]:
            rank = ctx.index_number(self.name) + 1
            if self.options["wait-master-enabled"]:
                script = _WAIT_SCRIPT.format(addr=master_addr, port=port, timeout=self.options["wait-master-timeout"])
                wanted = {"name": WAIT_CONTAINER, "image": self.options["wait-master-image"], "command": ["sh", "-c", script]}
                add_init_container(self, ctx.pod, wanted, _NAME_TAKEN)
        elif ctx.task.name == self.options["master"]:
            rank = 0
        ctx.names_hosts(self.name)  # MASTER_ADDR
        world_size = str(self.world_size())
        entries = [("MASTER_ADDR", master_addr, None), ("MASTER_PORT", str(port), None), ("WORLD_SIZE", world_size, None)]
        if rank is not None:
            entries.append(("RANK", str(rank), None))
        for i, container in enumerate(containers(ctx.pod)):
            reject(self, f"spec.containers[{i}].ports", ensure_port(container, PORT_NAME, port))
            ensure_envs(container, entries)
