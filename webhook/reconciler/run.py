"""``volcano-webhook reconcile``: the sidecar process — health server, leader election, reconciler —
until SIGTERM, then a graceful stop (in-flight reconciles finish, the Lease is released)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from volcano_job_webhook import logs, memory
from volcano_job_webhook.certs.cluster import sync as certs_sync
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.kube.client import api_client
from volcano_job_webhook.kube.rest import Rest

from .health import HealthServer
from .leader import LeaderElector
from .manager import Reconciler, served_workloads
from .metrics import ReconcilerMetrics
from .registration import Registrar, load_configurations

log = logging.getLogger(__name__)


def run(
    settings: WebhookSettings,
    *,
    health_port: int = 8081,
    leader_elect: bool = False,
    lease_name: str = "volcano-job-webhook-reconciler",
    lease_namespace: str | None = None,
    resync_seconds: float = 300.0,
    workers: int = 4,
    kubeconfig: Path | None = None,
    stop: threading.Event | None = None,
) -> None:
    logs.configure(settings.log_level)
    api = api_client(kubeconfig or settings.kubeconfig)  # before anything starts: no cluster is exit 2
    memory.configure()  # the collector off until the caches' first load is in (memory.settle)
    templates = load_configurations(settings.webhook_configurations) if settings.webhook_configurations else None
    metrics = ReconcilerMetrics()
    elector: LeaderElector | None = None
    reconciler: Reconciler | None = None

    def on_change(lead: bool) -> None:
        metrics.leader.set(int(lead))
        if reconciler is not None:
            reconciler.leadership_changed(lead)

    if leader_elect:
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        namespace = lease_namespace or os.environ.get("POD_NAMESPACE") or settings.service_namespace
        elector = LeaderElector(api, lease_name, namespace, identity, on_change=on_change)
    else:
        metrics.leader.set(1)

    def is_leader() -> bool:
        return elector.is_leader if elector else True

    reconciler = Reconciler(
        api,
        settings.chain(on_cluster=True),
        namespaces=settings.namespaces,
        resync_seconds=resync_seconds,
        workers=workers,
        is_leader=is_leader,
        metrics=metrics,
        on_synced=memory.settle,
        workloads=served_workloads(api, settings.workloads),
    )
    rec = reconciler
    registrar = None
    if templates is not None or settings.ca_secret:
        registrar = Registrar(
            Rest(api), templates or [], settings.service_namespace, settings.tls_secret, settings.registration_owner, is_leader,
            on_write=lambda kind, name: metrics.writes.labels(kind, "apply").inc(),
            certificates=functools.partial(
                certs_sync, api, settings.service_namespace, settings.tls_secret, settings.ca_secret,
                settings.service_name, settings.service_namespace,
            ) if settings.ca_secret else None,
        )
    health = HealthServer(
        "0.0.0.0", health_port, lambda: rec.ready, metrics.registry,
        details=lambda: {"leader": is_leader(), "jobs": len(rec.jobs)},
    )
    stop = stop or threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            signal.signal(sig, lambda *_: stop.set())
    health.start()
    if elector:
        elector.start()
    reconciler.start()
    if registrar:
        registrar.start()
    log.info("reconciler started (health on :%d, leader election %s)", health.port, "on" if elector else "off")
    stop.wait()
    # Within two seconds: watches are cancelled rather than waited out, in-flight reconciles get a
    # moment, then the Lease is released (after the last write) so a standby takes over at once.
    stopping = time.monotonic()
    log.info("stopping")
    if registrar:
        registrar.stop()
    reconciler.stop()
    if elector:
        elector.stop()
    health.stop()
    log.info("stopped in %.2fs", time.monotonic() - stopping)
