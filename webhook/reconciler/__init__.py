"""The reconciler: controllers that create, update and clean up each job's side objects.

:mod:`.manager` has controller-runtime's shape: a ``Manager`` holding one shared cache per kind and
``build``, the builder (``For(kind).Owns(kinds...).Complete(reconcile)``), on which ``Reconciler``
builds a controller per workload kind. A generic :mod:`.controller` (its :mod:`.workqueue`, workers,
resync, leadership) runs :mod:`.jobs`' one-job reconcile, which writes through :mod:`.writer` and
warns through :mod:`.events`; :mod:`.kinds` names the owned kinds and what is cached of them,
:mod:`.compare` what a live object needs; :mod:`.leader` is Lease-based leader election;
:mod:`.health` and :mod:`.metrics` what the process serves on its probe port; :mod:`.run` starts the
whole process.
"""

from .controller import Controller, NotLeading
from .leader import LeaderElector
from .manager import Manager, Reconciler, build
from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

__all__ = ["Controller", "LeaderElector", "Manager", "NotLeading", "Reconciler", "ReconcilerMetrics", "WorkQueue", "build"]
