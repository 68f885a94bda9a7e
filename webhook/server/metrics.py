"""Prometheus metrics of the webhook, in a registry of its own (one per app, so tests and several
apps in one process never collide)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class WebhookMetrics:
    """Admission requests by endpoint and result, latency, patches by plugin, job lookups, cache size, and the
    served certificate's time left (:meth:`watch_certificate`)."""

    def __init__(self, cached_jobs: Callable[[], float] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "volcano_webhook_admission_requests_total", "Admission requests answered, by endpoint and result",
            ["endpoint", "result"], registry=self.registry,
        )
        self.latency = Histogram(
            "volcano_webhook_admission_duration_seconds", "Time to answer an admission request",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.patches = Counter(
            "volcano_webhook_patches_total", "Pods patched, by plugin that ran", ["plugin"], registry=self.registry,
        )
        self.lookups = Counter(
            "volcano_webhook_job_lookups_total", "Job lookups, by result (found, not_found, not_watched, error)",
            ["result"], registry=self.registry,
        )
        # labels() memoised: the label sets are few, and labels() costs more than the increment on the hot path.
        for name in ("requests", "latency", "patches", "lookups"):
            metric = getattr(self, name)
            metric.labels = cache(metric.labels)
        self.cached = Gauge("volcano_webhook_cached_jobs", "Volcano Jobs held in memory (a finished one as its identity only)",
                            registry=self.registry)
        if cached_jobs is not None:
            self.cached.set_function(cached_jobs)
        self.certificate_expiry: Gauge | None = None

    def watch_certificate(self, expiry_seconds: Callable[[], float]) -> None:
        """Export ``volcano_webhook_certificate_expiry_seconds`` from ``expiry_seconds`` at each scrape;
        registered only once there is a certificate, so an app without TLS shows no "expired now" 0."""
        if self.certificate_expiry is None:
            self.certificate_expiry = Gauge(
                "volcano_webhook_certificate_expiry_seconds",
                "Seconds until the served TLS certificate's notAfter (negative once expired)", registry=self.registry,
            )
        self.certificate_expiry.set_function(expiry_seconds)
