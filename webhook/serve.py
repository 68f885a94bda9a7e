"""``volcano-webhook serve``: certificates, job source, app, HTTPS server — in that order."""

from __future__ import annotations

import logging

from volcano_job_webhook.plugins import Chain, default_registry

from . import logs
from .app import create_app
from .certs import ensure_certs
from .config import WebhookSettings
from .jobsource import DirectoryJobSource, JobSource
from .tls import serve as serve_tls

log = logging.getLogger(__name__)


def make_source(settings: WebhookSettings) -> JobSource:
    if settings.job_source == "kube":
        from .kubecache import KubeJobSource, api_client

        return KubeJobSource(api_client(settings.kubeconfig), settings.namespaces)
    return DirectoryJobSource(settings.jobs_dir)


def serve(settings: WebhookSettings) -> None:
    """Run the webhook until SIGINT/SIGTERM. Missing certificates are created first."""
    logs.configure(settings.log_level)
    paths = ensure_certs(settings.certs_dir, settings.service_name, settings.service_namespace)
    log.info("serving certificate %s; CA bundle for the webhook registration: %s", paths.cert, paths.ca_cert)
    print(f"CA bundle: {paths.ca_cert}", flush=True)
    source = make_source(settings)
    app = create_app(
        source,
        Chain(default_registry(), settings.chain_config()),
        max_body_bytes=settings.max_body_bytes,
    )
    serve_tls(
        app,
        settings.host,
        settings.port,
        paths.cert,
        paths.key,
        client_ca_file=settings.client_ca_file,
        reload_interval=settings.cert_reload_seconds,
    )
