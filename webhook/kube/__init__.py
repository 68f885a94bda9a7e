"""Kubernetes access shared by the webhook and the reconciler: :mod:`.client` makes a client, :mod:`.rest`
calls and watches, :mod:`.informer` caches, :mod:`.records` what a cache keeps, :mod:`.backoff` waits."""
