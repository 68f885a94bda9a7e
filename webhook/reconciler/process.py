"""``volcano-webhook reconcile``: the process — health server, leader election, reconciler, registration —
until SIGTERM (exit 0: in-flight reconciles get a moment, the Lease is released) or a lost Lease (exit 1,
as controller-runtime: the Deployment starts it again, so no write path asks whether it still leads)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import threading
import time

from volcano_job_webhook import logs, memory
from volcano_job_webhook.certs.cluster import sync as certs_sync
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.kube.rest import Rest, api_client
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB

from .health import HealthServer
from .leader import LeaderElector
from .manager import Reconciler
from .metrics import ReconcilerMetrics
from .registration import Registrar, load_configurations

log = logging.getLogger(__name__)


def run(settings: WebhookSettings, stop: threading.Event | None = None) -> int:
    logs.configure(settings.log_level)
    api = api_client(settings.kubeconfig)  # before anything starts: no cluster is exit 2
    memory.configure()  # the collector off until the caches' first load is in (memory.settle)
    templates = load_configurations(settings.webhook_configurations) if settings.webhook_configurations else None
    metrics = ReconcilerMetrics()
    reconciler = Reconciler(api, settings, metrics=metrics, on_synced=memory.settle)
    if templates is not None or settings.ca_secret:
        certificates = functools.partial(certs_sync, api, settings.service_namespace, settings.tls_secret, settings.ca_secret,
                                         settings.service_name, settings.service_namespace) if settings.ca_secret else None
        Registrar(reconciler.manager, Rest(api), templates or [], settings.service_namespace, settings.tls_secret,
                  settings.registration_owner, certificates=certificates, metrics=metrics)

    def on_change(leading: bool) -> None:
        metrics.leader.set(int(leading))
        if leading:
            reconciler.manager.lead()

    elector = None
    if settings.leader_elect:
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        namespace = settings.lease_namespace or os.environ.get("POD_NAMESPACE") or settings.service_namespace
        elector = LeaderElector(api, settings.lease_name, namespace, identity, on_change=on_change)
    health = HealthServer("0.0.0.0", settings.health_port, lambda: reconciler.manager.ready, metrics.registry,
                          details=lambda: {"leader": elector is None or elector.is_leader, "jobs": len(reconciler.manager.caches[VOLCANO_JOB])},
                          timeout=settings.header_timeout_seconds)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    health.start()
    reconciler.start(leading=False)
    if elector is None:
        on_change(True)
    else:
        elector.start()
    log.info("reconciler started (health on :%d, leader election %s)", health.port, "on" if elector else "off")
    led = lost = False
    while not stop.wait(0.1):
        # The elector's own clock says when the renew deadline passed, before its loop comes round.
        led = led or (elector is not None and elector.is_leader)
        if led and elector is not None and not elector.is_leader:
            lost = True
            log.error("lost the Lease: exiting, to be started again as a candidate")
            break
    # Within two seconds: watches are cancelled rather than waited out, in-flight reconciles get a
    # moment, then the Lease is released (after the last write) so a standby takes over at once.
    stopping = time.monotonic()
    log.info("stopping")
    reconciler.stop()
    if elector:
        elector.stop()
    health.stop()
    log.info("stopped in %.2fs", time.monotonic() - stopping)
    return 1 if lost else 0
