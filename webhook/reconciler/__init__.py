"""The reconciler: a controller that creates, updates and cleans up each job's side objects.

:mod:`.controller` holds the reconcile loop over a :mod:`.workqueue`; :mod:`.kinds` the owned API
kinds; :mod:`.leader` Lease-based leader election; :mod:`.health` and :mod:`.metrics` what the
process serves on its probe port; :mod:`.run` starts the whole process.
"""

from .controller import Reconciler
from .leader import LeaderElector
from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

__all__ = ["LeaderElector", "Reconciler", "ReconcilerMetrics", "WorkQueue"]
