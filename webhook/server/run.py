"""``volcano-webhook serve``: certificates, job source, app, HTTPS server — in that order."""

from __future__ import annotations

import dataclasses
import logging
import os
from importlib.resources import files
from pathlib import Path

from volcano_job_webhook import logs, memory
from volcano_job_webhook.certs.files import ensure_certs
from volcano_job_webhook.certs.reload import CertReloader
from volcano_job_webhook.certs.secret import ServingSecret
from volcano_job_webhook.config import ConfigError, WebhookSettings

from .app import create_app
from .connections import ConnectionLimits
from .https import ListenError, build_server
from .jobs import DirectoryJobSource, JobSource

log = logging.getLogger(__name__)


def jobs_dir(settings: WebhookSettings) -> Path:
    """The directory ``job_source=files`` reads (by default the example jobs shipped with the
    package); :class:`ConfigError` at start when it cannot be read, not a server never ready."""
    directory = settings.jobs_dir or Path(str(files("volcano_job_webhook.examples") / "jobs"))
    if not directory.is_dir():
        raise ConfigError(f"jobs directory {directory} does not exist or is not a directory "
                          "(pass --jobs-dir DIR, or --job-source kube)")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise ConfigError(f"jobs directory {directory} is not readable")
    return directory


def make_source(settings: WebhookSettings) -> JobSource:
    if settings.job_source == "kube":
        from volcano_job_webhook.kube.rest import api_client

        from .jobs.kube import KubeJobSource

        return KubeJobSource(api_client(settings.kubeconfig), settings.namespaces, lookup_ttl=settings.job_lookup_ttl_seconds,
                             not_found_ttl=settings.job_not_found_ttl_seconds, on_synced=memory.settle)
    return DirectoryJobSource(jobs_dir(settings), max_file_bytes=settings.max_job_file_bytes)


def connection_limits(settings: WebhookSettings) -> ConnectionLimits:
    """The limits of the settings of the same names."""
    named = [f.name for f in dataclasses.fields(ConnectionLimits) if f.name in WebhookSettings.model_fields]
    return ConnectionLimits(**{name: getattr(settings, name) for name in named})


def certificates(settings: WebhookSettings) -> CertReloader:
    """The served certificate: Secret ``tls_secret`` followed by its watch (``certs_from_secret``), or
    the files of ``certs_dir`` (made first when missing: the development CA; or a mounted Secret,
    which the kubelet updates) looked at every ``cert_reload_seconds``."""
    if settings.certs_from_secret:
        from volcano_job_webhook.kube.rest import api_client

        return ServingSecret(api_client(settings.kubeconfig), settings.service_namespace, settings.tls_secret).follow(settings.client_ca_file)
    paths = ensure_certs(settings.certs_dir, settings.service_name, settings.service_namespace)
    log.info("serving certificate %s; CA bundle for the webhook registration: %s", paths.cert, paths.ca_cert)
    print(f"CA bundle: {paths.ca_cert}", flush=True)
    return CertReloader.from_files(paths.cert, paths.key, settings.client_ca_file, settings.cert_reload_seconds)


def run(settings: WebhookSettings) -> None:
    """Run the webhook until SIGINT/SIGTERM. Missing certificates are created first."""
    logs.configure(settings.log_level)
    if settings.job_source == "kube":
        memory.configure()  # before any thread starts: the collector off until the Job cache's first load (on_synced)
    source = make_source(settings)
    reloader = certificates(settings)
    app = create_app(source, settings.chain(), max_body_bytes=settings.max_body_bytes,
                     audit=settings.enforcement == "audit")
    server = build_server(app, settings.host, settings.port, reloader, limits=connection_limits(settings), drain_seconds=settings.drain_seconds)
    metrics = app.state.metrics
    metrics.registry.register(server.guard)
    metrics.watch_certificate(server.reloader.expiry_seconds)
    try:
        server.run()
    except ListenError as exc:
        raise ConfigError(str(exc)) from None
