"""Kubernetes access shared by the webhook and the reconciler, through the official client:
:mod:`.client` (how a client is made), :mod:`.backoff` (retries), :mod:`.informer` (list-and-watch)."""

from .backoff import Backoff, with_retries
from .client import api_client
from .informer import JobInformer

__all__ = ["Backoff", "JobInformer", "api_client", "with_retries"]
