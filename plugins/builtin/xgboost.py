"""``xgboost``: what XGBoost's collective (``xgboost.collective``) needs to make one group of every
Pod of the job, under the ``DMLC_*`` names Kubeflow Trainer's XGBoost runtime uses.

Not a Volcano plugin: a built-in of this project, enabled like the others through ``spec.plugins`` or
the ``volcano-job-webhook/plugins`` annotation. It brings in ``svc`` (stable Pod host names).

Every regular container of every Pod of the job gets:

* ``DMLC_TRACKER_URI``: the tracker task's Pod 0 domain (``<job>-<task>-0.<job>``);
* ``DMLC_TRACKER_PORT``: ``--port`` (default 9091);
* ``DMLC_NUM_WORKER``: the replicas of all tasks together (one XGBoost worker per Pod);
* ``DMLC_TASK_ID``: the replicas of the tasks before the Pod's task + the Pod's index, counting the
  ``--tracker`` task first and then the others in ``spec.tasks`` order, so the Pod that must start
  the tracker is the one with task id 0.

The containers of the tracker task's Pods also get the port ``xgboost-port`` (``--port``), unless they
already have a port of that number.

XGBoost 3 reads none of these by itself: the program starts ``xgboost.tracker.RabitTracker`` on task
0 (``n_workers=DMLC_NUM_WORKER``, ``port=DMLC_TRACKER_PORT``) and gives every worker
``collective.CommunicatorContext(dmlc_tracker_uri=..., dmlc_tracker_port=int(...),
dmlc_task_id=...)``; ``examples/xgboost/train.py`` does both. The four names are reserved: a pod
template that sets one is an error (at ``/validate`` and at admission), as its value would be
silently replaced.
"""

from __future__ import annotations

from functools import cached_property

from ..base import Plugin, PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, require_port_free
from ..job import Task
from ..pod import Obj
from .group import first_task, member_index, offsets, reject_reserved_env, size, wire_members

PORT_NAME = "xgboost-port"
DEFAULT_PORT = 9091
RESERVED = frozenset({"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_NUM_WORKER", "DMLC_TASK_ID"})


class XGBoostPlugin(Plugin):
    name = "xgboost"
    requires = ("svc",)
    flags = (
        port_flag("port", DEFAULT_PORT, "DMLC_TRACKER_PORT: the tracker's port"),
        Flag("tracker", "string", "", "task whose Pod 0 runs the tracker (DMLC_TASK_ID 0); default the first task"),
    )

    @cached_property
    def tracker(self) -> Task:
        return first_task(self, "tracker")

    @cached_property
    def offsets(self) -> dict[str, int]:
        return offsets(self.job.tasks, self.tracker)

    def check(self) -> list[str]:
        _ = self.tracker
        reject_reserved_env(self, RESERVED, "the xgboost plugin sets it, with the other DMLC_* variables of the XGBoost group")
        require_port_free(self, [self.tracker], PORT_NAME, self.options["port"])
        return []

    def mutate(self, ctx: PodContext) -> None:
        tracker = self.tracker
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
