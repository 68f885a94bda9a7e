"""``xgboost``: what XGBoost's collective needs to make one group of every Pod of the job, under
Kubeflow Trainer's ``DMLC_*`` names (docs/volcano-behaviour.md#xgboost); XGBoost reads none of them
itself, the program passes them (``examples/xgboost/train.py``)."""

from __future__ import annotations

from ..base import PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name
from .group import EnvEntries, GroupPlugin

DEFAULT_PORT = 9091


class XGBoostPlugin(GroupPlugin):
    name = "xgboost"
    leader_flag = "tracker"
    port_name = "xgboost-port"
    reserved = frozenset({"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_NUM_WORKER", "DMLC_TASK_ID"})
    reserved_why = "the xgboost plugin sets it, with the other DMLC_* variables of the XGBoost group"
    flags = (
        port_flag("port", DEFAULT_PORT, "DMLC_TRACKER_PORT: the tracker's port"),
        Flag("tracker", "string", "", "task whose Pod 0 runs the tracker (DMLC_TASK_ID 0); default the first task"),
    )

    def group_env(self, ctx: PodContext, rank: int, index: int) -> EnvEntries:
        ctx.names_hosts(self.name)
        return [
            ("DMLC_TRACKER_URI", domain_name(self, self.leader, 0), None),
            ("DMLC_TRACKER_PORT", str(self.options["port"]), None),
            ("DMLC_NUM_WORKER", str(self.size), None),
            ("DMLC_TASK_ID", str(rank), None),
        ]
