"""Prometheus metrics of the reconciler, in a registry of its own (one per process; served by
:mod:`.health`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ReconcilerMetrics:
    """Reconciles by result, writes and API requests by kind, errors by status, queue depth, leadership, cache sizes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reconciles = Counter("volcano_reconciler_reconciles_total", "Job reconciles, by result", ["result"], registry=self.registry)
        self.writes = Counter("volcano_reconciler_writes_total", "Objects written, by kind and action", ["kind", "action"], registry=self.registry)
        self.api_requests = Counter("volcano_reconciler_api_requests_total", "Requests sent to the API server by reconciles, by verb and kind",
                                    ["verb", "kind"], registry=self.registry)
        self.api_errors = Counter("volcano_reconciler_api_errors_total", "API errors seen, by status", ["status"], registry=self.registry)
        self.queue_depth = Gauge("volcano_reconciler_queue_depth", "keys ready to be reconciled (not those held back)", registry=self.registry)
        self.leader = Gauge("volcano_reconciler_leader", "1 while this replica leads", registry=self.registry)
        self.cached_jobs = Gauge("volcano_reconciler_cached_jobs", "Volcano Jobs held in memory", registry=self.registry)
        self.cached_objects = Gauge("volcano_reconciler_cached_objects", "Objects of ours held in memory, by kind", ["kind"],
                                    registry=self.registry)
