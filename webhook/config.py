"""Server configuration: command-line flags over ``VOLCANO_WEBHOOK_*`` environment variables over a YAML
file (``--config`` or ``VOLCANO_WEBHOOK_CONFIG``, keyed by the field names below) over defaults."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from volcano_job_webhook.plugins import BUILTIN_ORDER, Chain, ChainConfig, Settings, default_registry
from volcano_job_webhook.plugins.base import DEFAULT_HOSTS_ENV_LIMIT
from volcano_job_webhook.plugins.keys import VOLCANO_PLUGINS
from volcano_job_webhook.plugins.names import dns1123_subdomain

CONFIG_ENV = "VOLCANO_WEBHOOK_CONFIG"
# The settings file's map, read once by load_settings (a file named only by CONFIG_ENV is read by the source).
_config_data: ContextVar[dict[str, Any] | None] = ContextVar("config_data", default=None)


class ConfigError(Exception):
    """Settings that cannot work (a jobs directory that is not there): printed as one line, exit 2."""


class WebhookSettings(BaseSettings):
    """Everything ``serve`` and ``reconcile`` can be told."""

    model_config = SettingsConfigDict(env_prefix="VOLCANO_WEBHOOK_", extra="forbid", frozen=True)

    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8443, ge=1, le=65535, description="HTTPS port")
    certs_dir: Path = Field(Path("certs"), description="directory with ca.crt, tls.crt and tls.key")
    client_ca_file: Path | None = Field(None, description="require client certificates signed by this CA")
    cert_reload_seconds: float = Field(10.0, gt=0, description="how often to look for renewed certificate files in certs_dir")
    service_name: str = Field("volcano-job-webhook", description="Service name put in the serving certificate")
    service_namespace: str = Field("volcano-job-webhook", description="its namespace")

    job_source: Literal["files", "kube"] = Field("files", description="where Volcano Jobs are looked up")
    jobs_dir: Path | None = Field(None, description="Job files for job_source=files (default: the example jobs shipped with the package)")
    namespaces: list[str] = Field(default_factory=list, description="namespaces to watch (empty: all)")
    kubeconfig: Path | None = Field(None, description="kubeconfig for job_source=kube (default: in-cluster)")

    plugin_order: list[str] = Field(default_factory=lambda: list(BUILTIN_ORDER), description="plugin order")
    allowed_plugins: list[str] | None = Field(None, description="plugins jobs may use (default: all installed)")
    default_plugins: dict[str, list[str]] = Field(default_factory=dict, description="plugins every job gets")
    hosts_env_limit: int | None = Field(
        DEFAULT_HOSTS_ENV_LIMIT, ge=1, description="longest VC_<TASK>_HOSTS value injected; null for no limit"
    )
    env_placement: Literal["last", "first"] = Field(
        "last", description="where our plugins' variables go in a container's env: last (as Volcano appends) or first (so "
        "$(RANK) in its own expands); a job's annotation volcano-job-webhook/env-placement overrides it",
    )
    cluster_domain: str | None = Field(
        None, description="kubelet's --cluster-domain (cluster.local): our plugins' host names become fully qualified, "
        "resolvable from any namespace; null: <host>.<subdomain>, as Volcano writes them",
    )
    volcano_controller_plugins: list[str] | None = Field(
        None, description="plugins Volcano's job controller runs when spec.plugins names them; default: its eight on a "
        "cluster, none for job files (docs/install.md#who-runs-what)",
    )
    workloads: list[Literal["jobs.batch", "jobsets.jobset.x-k8s.io"]] = Field(
        ["jobs.batch", "jobsets.jobset.x-k8s.io"],
        description="kinds the reconciler also makes side objects for when they opt in (docs/workloads.md); one not served is skipped",
    )
    enforcement: Literal["deny", "audit"] = Field(
        "deny", description="audit: what would be denied is allowed with a warning (rolling out onto running jobs)"
    )
    # Registration (webhook/reconciler/registration.py, docs/install.md#registration): read by reconcile.
    webhook_configurations: Path | None = Field(
        None, description="webhook configurations (a YAML list, no caBundle) reconcile registers once the webhook serves",
    )
    registration_owner: str | None = Field(
        None, description="ClusterRole of the install every registration is owned by: deleting it deletes them",
    )
    tls_secret: str = Field(
        "volcano-job-webhook-tls", description="serving Secret (kubernetes.io/tls) in service_namespace: its ca.crt is every "
        "registration's caBundle; serve follows it with certs_from_secret",
    )
    ca_secret: str | None = Field(
        None, description="Secret of the self-managed CA reconcile keeps with tls_secret; none: another issuer writes tls_secret",
    )
    certs_from_secret: bool = Field(
        False, description="serve watches tls_secret through the API and serves each certificate it holds, rather than files",
    )

    # The reconciler (webhook/reconciler/): read by reconcile.
    resync_seconds: float = Field(300.0, gt=0, description="how often reconcile looks at every job anyway (changes are seen at once)")
    workers: int = Field(4, ge=1, description="jobs reconciled at once; one job is never in two workers")
    health_port: int = Field(8081, ge=0, le=65535, description="reconcile's plain-HTTP /healthz, /readyz and /metrics (0: any free port)")
    leader_elect: bool = Field(False, description="reconcile works only while it holds the Lease, and exits when it loses it")
    lease_name: str = Field("volcano-job-webhook-reconciler", description="the Lease of the leader election")
    lease_namespace: str | None = Field(None, description="its namespace (default: $POD_NAMESPACE, else service_namespace)")

    max_body_bytes: int = Field(3 * 1024 * 1024, ge=1024, description="largest AdmissionReview accepted")
    # What one client can hold (webhook/server/connections.py); docs/install.md, "Limits".
    header_timeout_seconds: float = Field(10.0, gt=0, description="time for a request's headers, from connection or first byte")
    body_timeout_seconds: float = Field(10.0, gt=0, description="time for a request's body, from its headers")
    idle_timeout_seconds: float = Field(100.0, gt=0, description="an idle keep-alive connection is closed after this (keep it past the API server's 90 s)")
    drain_seconds: float = Field(3.0, ge=0, description="after SIGTERM, requests are answered with Connection: close at least this long, then until no connection is open")
    tls_handshake_timeout_seconds: float = Field(10.0, gt=0, description="time for the TLS handshake (and TLS shutdown)")
    max_connections: int = Field(1024, ge=1, description="open connections; past it the longest-waiting one is closed")
    max_tls_handshakes: int = Field(16, ge=1, description="TLS handshakes under way at once; more connections wait to be accepted")
    receive_buffer_bytes: int = Field(16 * 1024, ge=4096, description="SO_RCVBUF of client connections (the kernel doubles it)")
    max_job_file_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="a larger file in jobs_dir is skipped, with a warning")
    job_lookup_ttl_seconds: float = Field(
        5.0, ge=0, description="job_source=kube: how long a Job a live GET found is reused"
    )
    job_not_found_ttl_seconds: float = Field(
        1.0, ge=0, description="job_source=kube: how long a live GET's 'no such Job' is reused for Pods with no owner"
    )
    log_level: str = Field("info", description="debug, info, warning or error")

    @field_validator("cluster_domain")
    @classmethod
    def _dns_domain(cls, value: str | None) -> str | None:
        problem = dns1123_subdomain(value) if value is not None else None
        if problem:
            raise ValueError(f"{problem}; a DNS domain such as cluster.local, no trailing dot")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be debug, info, warning or error")
        return value.lower()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        data = _config_data.get()
        if data is None and os.environ.get(CONFIG_ENV):
            data = _yaml_map(os.environ[CONFIG_ENV])
        if data:
            # What pydantic-settings' YamlConfigSettingsSource does with the file's map, given the map.
            sources.append(InitSettingsSource(settings_cls, init_kwargs=data))
        return tuple(sources)

    def chain(self, on_cluster: bool | None = None) -> Chain:
        """The chain of the installed plugins, configured: how every command builds it."""
        return Chain(default_registry(), self.chain_config(on_cluster))

    def chain_config(self, on_cluster: bool | None = None) -> ChainConfig:
        """The chain's configuration. ``on_cluster``: Volcano's controller may run beside us (by
        default when Jobs come from the cluster), running its eight plugins unless set otherwise."""
        on_cluster = self.job_source == "kube" if on_cluster is None else on_cluster
        volcano = self.volcano_controller_plugins
        if volcano is None:
            volcano = list(VOLCANO_PLUGINS) if on_cluster else []
        return ChainConfig(
            order=tuple(self.plugin_order),
            allowed=frozenset(self.allowed_plugins) if self.allowed_plugins is not None else None,
            defaults=dict(self.default_plugins),
            settings=Settings(hosts_env_limit=self.hosts_env_limit, env_placement=self.env_placement,
                              cluster_domain=self.cluster_domain),
            volcano_plugins=frozenset(volcano),
        )


def load_settings(config_file: str | None = None, **overrides: Any) -> WebhookSettings:
    """Settings from flags (``overrides``, None values dropped), environment and the YAML file."""
    named = config_file or os.environ.get(CONFIG_ENV)
    if named and not Path(named).is_file():
        # pydantic-settings reads a missing file as empty: a typo would run on the defaults.
        raise ConfigError(f"config file {named} does not exist or is not a file")
    token = _config_data.set(_yaml_map(named) if named else {})
    try:
        return WebhookSettings(**{k: v for k, v in overrides.items() if v is not None})
    finally:
        _config_data.reset(token)


def _yaml_map(path: str) -> dict[str, Any]:
    """The map ``path`` holds (empty for nothing); :class:`ConfigError` for anything else, in one
    line, where pydantic-settings would raise a parser's or ``dict()``'s own error."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"config file {path}: not readable as YAML: {reason}") from None
    if data is not None and not isinstance(data, dict):
        kind = {list: "list", str: "string", bool: "boolean"}.get(type(data), "number")
        raise ConfigError(f"config file {path}: must be a map of settings (port: 8443, ...), got a YAML {kind}")
    return data or {}
