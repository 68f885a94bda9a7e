"""The reconciler: a controller that creates, updates and cleans up each job's side objects.

:mod:`.manager` assembles it (``For(Job).Owns(...)``): a generic :mod:`.controller` (informers,
:mod:`.workqueue`, workers, resync, leadership) runs :mod:`.jobs`' one-job reconcile, which writes
through :mod:`.writer` and warns through :mod:`.events`; :mod:`.kinds` names the owned kinds and
what is cached of them, :mod:`.compare` what a live object needs; :mod:`.leader` is Lease-based
leader election; :mod:`.health` and :mod:`.metrics` what the process serves on its probe port;
:mod:`.run` starts the whole process.
"""

from .controller import Controller, NotLeading
from .leader import LeaderElector
from .manager import Reconciler
from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

__all__ = ["Controller", "LeaderElector", "NotLeading", "Reconciler", "ReconcilerMetrics", "WorkQueue"]
