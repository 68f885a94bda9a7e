"""``torchrun``: the ``PET_*`` environment ``torchrun`` reads, so that a plain ``torchrun train.py``
joins the job (docs/volcano-behaviour.md#torchrun)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from ..base import Plugin, PodContext
from ..flags import Flag
from ..helpers import (
    domain_name,
    peer_options,
    plugin_error,
    plugin_warning,
    reject,
    reject_reserved_env,
    require_port_free,
    sole_task,
    task_hint,
)
from ..pod import Obj, containers, ensure_envs, ensure_port
from .pytorch import PytorchPlugin
from .quantity import gpu_limit, parse_quantity, requested, whole

PORT_NAME = "torchrun-port"
DEFAULT_PORT = 29500
RESERVED_PREFIX = "PET_"
# Elastic: with the rendezvous store shared with the trainers (torch >= 2.4), a node that joins after
# the first round never learns their MASTER_ADDR and times out (torch 2.13).
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

def auto_nproc(container: Mapping[str, Any], where: str) -> int:
    """``--nproc-per-node=auto`` for one container: GPU limit, else CPU limit, else CPU request,
    rounded down, at least 1; 1 when the container asks for neither."""
    gpus = gpu_limit(container, where)
    if gpus is not None:
        return gpus
    for kind in ("limits", "requests"):
        cpu = requested(container, kind).get("cpu")
        if cpu is not None:
            try:
                return whole(parse_quantity(cpu))
            except ValueError as exc:
                raise ValueError(f"{where}.resources.{kind}.cpu: {exc}") from None
    return 1


class TorchrunPlugin(Plugin):
    name = "torchrun"
    requires = ("svc",)
    flags = (
        Flag("master", "string", "master", "name of the master task (node rank 0)"),
        Flag("worker", "string", "worker", "name of the worker task (node rank index + 1)"),
        Flag("port", "int", None, "PET_MASTER_PORT (default: the pytorch plugin's --port when it is on, else 29500)", minimum=1, maximum=65535),
        Flag("nproc-per-node", "string", "auto", "processes per Pod: a number, or auto (GPU limit, else CPUs)"),
        Flag("min-nodes", "int", None, "elastic: minimum number of nodes"),
        Flag("max-nodes", "int", None, "elastic: maximum number of nodes"),
        Flag("max-restarts", "int", None, "PET_MAX_RESTARTS (default 0 when elastic)"),
        Flag("rdzv-backend", "string", "c10d", "elastic: rendezvous backend"),
    )

    @cached_property
    def port(self) -> int:
        if self.options["port"] is not None:
            return int(self.options["port"])
        pytorch = peer_options(self, PytorchPlugin, field="--port", reason="cannot read the pytorch plugin's --port to default to")
        return DEFAULT_PORT if pytorch is None else int(pytorch["port"])

    @property
    def elastic(self) -> bool:
        return self.options["min-nodes"] is not None or self.options["max-nodes"] is not None

    @cached_property
    def single(self) -> str | None:
        """The one task that is master and workers alike, or None."""
        return sole_task(self, self.options["master"], self.options["worker"])

    def node_count(self) -> int:
        """Master + worker replicas (the one task's, when :attr:`single`)."""
        if self.single is not None:
            return self.job.replicas(self.single)
        return self.job.replicas(self.options["master"]) + self.job.replicas(self.options["worker"])

    def nnodes(self) -> str:
        if not self.elastic:
            return str(self.node_count())
        low, high = self._bounds()
        return f"{low}:{high}"

    def _bounds(self) -> tuple[int, int]:
        count = self.node_count()
        low, high = self.options["min-nodes"], self.options["max-nodes"]
        return (count if low is None else low, count if high is None else high)

    def master_address(self) -> str:
        master = self.job.task(self.single or self.options["master"])
        assert master is not None  # check() makes sure
        return domain_name(self, master, 0)

    def check(self) -> list[str]:
        master_name, worker_name = self.options["master"], self.options["worker"]
        if self.single is not None:
            master_name = worker_name = self.single
        master = self.job.task(master_name)
        if master is None:
            raise plugin_error(self, "--master", f"the job has no task {master_name!r} (torchrun needs a master Pod for node rank 0){task_hint(self, master_name)}")
        if self.single is None and worker_name == master_name:
            raise plugin_error(self, "--worker", f"names the master task {master_name!r}; master and worker must be different tasks")
        if self.single is not None:
            if not master.replicas:
                raise plugin_error(self, master.replicas_path, f"task {master_name!r} has no Pods; torchrun needs a master Pod for node rank 0")
        elif master.replicas != 1:
            raise plugin_error(
                self,
                master.replicas_path,
                f"the master task {master_name!r} has {master.replicas} replicas; torchrun needs exactly 1 (node rank 0)",
            )
        nproc = self.options["nproc-per-node"]
        if nproc != "auto" and not (nproc.isascii() and nproc.isdigit() and int(nproc) >= 1):
            raise plugin_error(self, "--nproc-per-node", f"must be auto or a positive integer, got {nproc!r}")
        for flag in ("min-nodes", "max-nodes"):
            value = self.options[flag]
            if value is not None and value < 1:
                raise plugin_error(self, f"--{flag}", f"must be at least 1, got {value}")
        if self.options["max-restarts"] is not None and self.options["max-restarts"] < 0:
            raise plugin_error(self, "--max-restarts", f"must be 0 or more, got {self.options['max-restarts']}")
        if not self.options["rdzv-backend"]:
            raise plugin_error(self, "--rdzv-backend", "must not be empty")
        _ = self.port  # a pytorch --port that does not parse surfaces here
        tasks = [t for t in map(self.job.task, dict.fromkeys((master_name, worker_name))) if t]
        reject_reserved_env(self, lambda name: name.startswith(RESERVED_PREFIX), "the torchrun plugin sets the PET_* variables torchrun reads", tasks)
        require_port_free(self, [t for t in (master, self.job.task(worker_name)) if t], PORT_NAME, self.port)
        warnings = []
        if self.single is None and self.job.task(worker_name) is None:
            warnings.append(plugin_warning(self, f"--worker: the job has no task {worker_name!r}; only the master runs (PET_NNODES counts it alone)"))
        if self.elastic:
            warnings.extend(self._check_bounds())
        return warnings

    def _check_bounds(self) -> list[str]:
        low, high = self._bounds()
        count = self.node_count()
        if low > high:
            if self.options["max-nodes"] is None:
                which = f"the job's node count {count} (master + worker replicas, the default for --max-nodes)"
            elif self.options["min-nodes"] is None:
                raise plugin_error(self, "--max-nodes", f"{high} is less than the job's node count {count} (master + worker replicas, the default for --min-nodes)")
            else:
                which = f"--max-nodes {high}"
            raise plugin_error(self, "--min-nodes", f"{low} is more than {which}")
        if not low <= count <= high:
            return [plugin_warning(self, f"the job runs {count} nodes (master + worker replicas), outside --min-nodes..--max-nodes {low}:{high}")]
        return []

    def mutate(self, ctx: PodContext) -> None:
        if self.single is not None:
            if ctx.task.name != self.single:
                return
            rank = ctx.index_number(self.name)
        elif ctx.task.name == self.options["master"]:
            rank = 0
        elif ctx.task.name == self.options["worker"]:
            rank = ctx.index_number(self.name) + 1
        else:
            return
        master = self.master_address()
        ctx.names_hosts(self.name)
        port = self.port
        common: list[tuple[str, str | None, Obj | None]] = [
            ("PET_MASTER_ADDR", master, None),
            ("PET_MASTER_PORT", str(port), None),
            ("PET_NNODES", self.nnodes(), None),
            ("PET_NODE_RANK", str(rank), None),
        ]
        extra: list[tuple[str, str | None, Obj | None]] = []
        if self.elastic:
            extra += [
                ("PET_RDZV_BACKEND", self.options["rdzv-backend"], None),
                ("PET_RDZV_ENDPOINT", f"{master}:{port}", None),
                ("PET_RDZV_ID", self.job.uid, None),
            ]
        if self.elastic or self.options["max-restarts"] is not None:
            extra.append(("PET_MAX_RESTARTS", str(self.options["max-restarts"] or 0), None))
        fixed = self.options["nproc-per-node"]
        for i, container in enumerate(containers(ctx.pod)):
            try:
                nproc = auto_nproc(container, f"spec.containers[{i}]") if fixed == "auto" else int(fixed)
            except ValueError as exc:
                raise plugin_error(self, "--nproc-per-node=auto", str(exc)) from None
            reject(self, f"spec.containers[{i}].ports", ensure_port(container, PORT_NAME, port))
            entries = [*common, ("PET_NPROC_PER_NODE", str(nproc), None), *extra]
            if self.elastic and not any(isinstance(e, dict) and e.get("name") == UNSHARED_STORE for e in container.get("env") or []):
                entries.append((UNSHARED_STORE, "1", None))
            ensure_envs(container, entries)
