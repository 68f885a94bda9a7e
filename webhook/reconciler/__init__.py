"""The reconciler: controllers that create, update and clean up each job's side objects.

:mod:`.manager` has controller-runtime's shape (a ``Manager`` of shared caches, ``build``, and the
process's ``Reconciler``); :mod:`.controller` runs a reconcile on :mod:`.workqueue`'s keys;
:mod:`.jobs` is one job's reconcile, writing through :mod:`.writer`, waiting on :mod:`.expectations`,
warning through :mod:`.events`; :mod:`.registration` registers the webhook; :mod:`.run` is the process.
"""

from .manager import Manager, Reconciler, build

__all__ = ["Manager", "Reconciler", "build"]
