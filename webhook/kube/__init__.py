"""Kubernetes access shared by the webhook and the reconciler, through the official client:
:mod:`.client` (how a client is made), :mod:`.rest` (plain-JSON calls and watches),
:mod:`.backoff` (retries), :mod:`.informer` (list-and-watch caches)."""

from .backoff import Backoff, with_retries
from .client import api_client
from .informer import Informer, JobInformer
from .rest import Rest

__all__ = ["Backoff", "Informer", "JobInformer", "Rest", "api_client", "with_retries"]
