"""The reconciler: controllers that create, update and clean up each job's side objects, in
controller-runtime's shape (docs/architecture.md maps its modules)."""

from .manager import Manager, Reconciler, build

__all__ = ["Manager", "Reconciler", "build"]
