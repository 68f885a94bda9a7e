"""``xgboost``: what XGBoost's collective needs to make one group of every Pod of the job, under
Kubeflow Trainer's ``DMLC_*`` names (docs/volcano-behaviour.md#xgboost); XGBoost reads none of them
itself, the program passes them (``examples/xgboost/train.py``)."""

from __future__ import annotations

from ..base import PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, reject_reserved_env, require_port_free
from ..pod import Obj
from .group import GroupPlugin, member_index, size, wire_members

PORT_NAME = "xgboost-port"
DEFAULT_PORT = 9091
RESERVED = frozenset({"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_NUM_WORKER", "DMLC_TASK_ID"})


class XGBoostPlugin(GroupPlugin):
    name = "xgboost"
    leader_flag = "tracker"
    flags = (
        port_flag("port", DEFAULT_PORT, "DMLC_TRACKER_PORT: the tracker's port"),
        Flag("tracker", "string", "", "task whose Pod 0 runs the tracker (DMLC_TASK_ID 0); default the first task"),
    )

    def check(self) -> list[str]:
        _ = self.leader
        reject_reserved_env(self, RESERVED.__contains__, "the xgboost plugin sets it, with the other DMLC_* variables of the XGBoost group")
        require_port_free(self, [self.leader], PORT_NAME, self.options["port"])
        return []

    def mutate(self, ctx: PodContext) -> None:
        tracker = self.leader
        index = member_index(self, ctx)
        port = self.options["port"]
        entries: list[tuple[str, str | None, Obj | None]] = [
            ("DMLC_TRACKER_URI", domain_name(self, tracker, 0), None),
            ("DMLC_TRACKER_PORT", str(port), None),
            ("DMLC_NUM_WORKER", str(size(self.job.tasks)), None),
            ("DMLC_TASK_ID", str(self.offsets[ctx.task.name] + index), None),
        ]
        ctx.names_hosts(self.name)
        wire_members(self, ctx, entries, (PORT_NAME, port) if ctx.task.name == tracker.name else None)
