"""A real kube-apiserver and etcd for the tests, envtest-style (../shared/real-kubernetes.md), from
``KUBEBUILDER_ASSETS``; without it the fixtures skip. Nothing else of a cluster runs unless asked
(:func:`controller_manager`): no garbage collection, no ``default`` ServiceAccount, no kubelet. Its
token users have exactly what RBAC grants them (the admin: ``system:masters``), and its audit log
says which calls a process really made. The helpers below talk to it through the official
client's ``ApiClient``, install this project's prerequisites, and run the product as a subprocess."""

from __future__ import annotations

import base64
import concurrent.futures
import ctypes
import functools
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self, TypeVar

import anyio
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers.jobs import API_VERSION as JOB_API_VERSION  # noqa: F401 (the tests of a real API server import it from here)
from tests.helpers.kustomize import DEFAULT_VARIANT, build_variant
from tests.helpers.manifests_util import webhook_configurations as registered_configurations
from volcano_job_webhook.certs.issue import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, generate_ca, generate_serving_cert

ASSETS_ENV = "KUBEBUILDER_ASSETS"
BINARIES = ("kube-apiserver", "etcd")

ADMIN = "envtest-admin"
# The ServiceAccounts of the manifests, as token users of the same name (see install_rbac).
WEBHOOK_USER = "volcano-job-webhook"
NOBODY = "nobody"  # no binding names it: only what every authenticated user may do
DEFAULT_USERS = (WEBHOOK_USER, NOBODY)

OWNER_REFERENCES_ENFORCEMENT = "OwnerReferencesPermissionEnforcement"
BASE_ADMISSION_PLUGINS = ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the kubernetes Service's ClusterIP: the first of SERVICE_CIDR
SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")

JOB_CRD = Path(__file__).resolve().parents[1] / "fixtures" / "crd" / "batch.volcano.sh_jobs.yaml"
FIELD_MANAGER = "envtest"

T = TypeVar("T")


def find_assets(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The ``KUBEBUILDER_ASSETS`` directory when it holds executable ``kube-apiserver`` and ``etcd``."""
    value = environ.get(ASSETS_ENV)
    if not value:
        return None
    directory = Path(value)
    if all(os.access(directory / name, os.X_OK) for name in BINARIES):
        return directory
    return None


_EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A port nobody has bound right now, on any address, and not given before in this process (the
    caller binds it soon after). It is below the kernel's ephemeral range and NodePorts' 30000: a
    port the kernel picks is one it also gives outgoing connections, and one took a hollow kubelet's
    meanwhile, "bind: address already in use" (bench/storm.py, fifty kubelets connecting)."""
    low = int(_EPHEMERAL_PORTS.read_text().split()[0]) if _EPHEMERAL_PORTS.exists() else 32768
    candidates = range(max(1025, low // 2), min(low, 30000))
    for port in secrets.SystemRandom().sample(candidates, min(len(candidates), 256)):
        if port in _PORTS_GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {candidates.start}-{candidates.stop - 1}")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1,
               log: Callable[[], str] | None = None) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; AssertionError naming
    ``what`` after ``timeout`` seconds. Exceptions from ``predicate`` propagate; an AssertionError,
    its own or the timeout's, is followed by ``log()`` (a process's last lines, say) when given."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)
    except AssertionError as exc:
        if log is None:
            raise
        raise AssertionError(f"{exc}\n{log()}".rstrip()) from None


async def eventually(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """:func:`wait_until` for async tests: the event loop runs on between looks."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await anyio.sleep(interval)
    return value


# Certificates and keys -------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def write_certs(directory: Path, dns_names: Sequence[str] = ("localhost",), ips: Sequence[str] = ("127.0.0.1",),
                ca_name: str = "test-ca") -> bytes:
    """A throwaway CA and a serving certificate it signed for ``dns_names`` and ``ips``, valid for a day
    (the product's own ``generate_ca``/``generate_serving_cert``), written to ``directory`` as
    ``ca.crt``, ``ca.key``, ``tls.crt`` and ``tls.key``; returns the CA's PEM."""
    ca, ca_key = generate_ca(ca_name, days=1)
    cert, key = generate_serving_cert(ca, ca_key, dns_names, ips, days=1)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in ((CA_CERT, ca), (TLS_CERT, cert)):
        (directory / name).write_bytes(data)
    for name, data in ((CA_KEY, ca_key), (TLS_KEY, key)):
        _write_private(directory / name, data)
    return ca


def _make_client_cert(ca_pem: bytes, ca_key_pem: bytes, user: str, groups: Sequence[str]) -> tuple[bytes, bytes]:
    """``(cert, key)``: a client certificate of ``user`` in ``groups`` (CN, O), signed by the CA (the
    product makes serving certificates only)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    start = datetime.now(UTC) - timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user),
                         *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _make_service_account_keys() -> tuple[bytes, bytes]:
    """``(sa.key, sa.pub)``: the pair the API server signs and checks service-account tokens with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _pem_key(key), public


# Processes -------------------------------------------------------------------------------------


_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="process-spawner")


def _die_with_parent() -> None:
    # A killed pytest must not leave a 300 MB API server behind: the kernel sends SIGKILL to the
    # child when the thread that started it exits (the fixtures start processes from the main
    # thread). Linux only; elsewhere the fixtures' teardown is all there is.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Process:
    """A child process whose stdout and stderr go to ``log_path``."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> Process:
        def spawn() -> subprocess.Popen[bytes]:
            with log_path.open("ab") as log:
                return subprocess.Popen(
                    list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=dict(env) if env is not None else None, cwd=cwd, preexec_fn=_die_with_parent,
                )

        # From a thread that ends (a storm's faults restarting the API server), the process would die
        # with it: such starts go through one thread that lives as long as this process.
        popen = spawn() if threading.current_thread() is threading.main_thread() else _SPAWNER.submit(spawn).result()
        return cls(name, popen, log_path)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def running(self) -> bool:
        """True while it runs; AssertionError with its last lines once it has exited (for a wait's predicate)."""
        assert self.alive, f"{self.name} exited ({self.popen.returncode}):\n{self.log(tail=40)}"
        return True

    def wait_for(self, predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
        """:func:`wait_until` ``predicate`` while the process runs; its last lines in the failure."""
        def check() -> T:
            assert self.alive, f"{self.name} exited ({self.popen.returncode})"
            return predicate()

        return wait_until(check, timeout, what, interval, log=lambda: self.log(tail=40))

    def log(self, tail: int | None = None) -> str:
        """The output so far (the last ``tail`` lines when given)."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-tail:]) if tail else text

    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL. Returns the exit status."""
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait()


# The API server --------------------------------------------------------------------------------


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""


@dataclass(frozen=True)
class AuditEvent:
    """One request as the API server's audit log records it. ``code`` is the HTTP status answered
    (None while a watch is still streaming); ``api_group`` is "" for the core group."""

    user: str
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int | None
    received: datetime  # when the API server received the request (UTC)
    uri: str = ""  # the request's path and query

    @property
    def permission(self) -> tuple[str, str, str]:
        """``(apiGroup, resource[/subresource], verb)``, as an RBAC rule names it."""
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return self.api_group, resource, self.verb


@dataclass(frozen=True)
class User:
    name: str
    token: str
    groups: tuple[str, ...] = ()


@dataclass
class EnvTest:
    """etcd and kube-apiserver on free ports, their files in ``workdir``. ``admission_plugins`` are on
    top of the defaults and the two webhook plugins; ``users`` become token users with only their
    ``groups``; on an ``address`` other than loopback (a node's) the API server keeps the
    ``kubernetes`` Service's endpoint there; ``apiserver_args`` come last (the last of a flag wins);
    ``kubelet_client`` gives it a ``system:masters`` certificate for its calls to kubelets."""

    assets: Path
    workdir: Path
    admission_plugins: tuple[str, ...] = ()
    users: tuple[str, ...] = DEFAULT_USERS
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    address: str = "127.0.0.1"
    apiserver_args: tuple[str, ...] = ()
    authorization: str = "RBAC"
    kubelet_client: bool = False
    host: str = field(default="", init=False)  # https://127.0.0.1:PORT once started
    ca_file: Path = field(init=False)  # the CA of the API server's serving certificate
    audit_log: Path = field(init=False)
    _tokens: dict[str, User] = field(default_factory=dict, init=False)
    _etcd: Process | None = field(default=None, init=False)
    _apiserver: Process | None = field(default=None, init=False)
    _clients: list[client.ApiClient] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.workdir / CA_CERT
        self.audit_log = self.workdir / "audit.log"

    # Lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> Self:
        """Start etcd and kube-apiserver and return once ``/readyz`` says ok (the bootstrap RBAC roles
        made); a port taken meanwhile is retried with new ones, and any failure stops both."""
        self._write_credentials()
        for attempt in range(3):
            try:
                self._start_processes(timeout)
                break
            except _EarlyExit:
                self.stop()
                if attempt == 2:
                    raise
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """Stop the API server (SIGKILL after 5 s: its graceful shutdown can take a minute), then etcd."""
        for api in self._clients:
            api.close()
        self._clients.clear()
        if self._apiserver is not None:
            self._apiserver.stop(grace=5.0)
            self._apiserver = None
        if self._etcd is not None:
            self._etcd.stop(grace=5.0)
            self._etcd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_credentials(self) -> None:
        ips = () if self.address == "127.0.0.1" else (self.address, SERVICE_IP)
        write_certs(self.workdir, ("localhost", *SERVICE_NAMES), ("127.0.0.1", *ips), "envtest-ca")
        sa_key, sa_pub = _make_service_account_keys()
        _write_private(self.workdir / "sa.key", sa_key)
        (self.workdir / "sa.pub").write_bytes(sa_pub)
        if ADMIN in self.users or len(set(self.users)) != len(self.users):
            raise ValueError(f"users must be distinct and not {ADMIN!r}: {self.users}")
        self._tokens = {ADMIN: User(ADMIN, secrets.token_hex(16), ("system:masters",))}
        self._tokens.update({name: User(name, secrets.token_hex(16), tuple(self.groups.get(name, ())))
                             for name in self.users})
        lines = []
        for user in self._tokens.values():
            groups = f',"{",".join(user.groups)}"' if user.groups else ""
            lines.append(f"{user.token},{user.name},{user.name}{groups}\n")
        _write_private(self.workdir / "tokens.csv", "".join(lines).encode())
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY, encoding="utf-8")
        if self.kubelet_client:
            self.client_certificate("kube-apiserver-kubelet-client", ("system:masters",))

    def _start_processes(self, timeout: float) -> None:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        data_dir = self.workdir / f"etcd-{etcd_port}"
        self._etcd = Process.start("etcd", [
            str(self.assets / "etcd"), "--name=envtest", f"--data-dir={data_dir}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=envtest=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ], self.workdir / "etcd.log")
        plugins = ",".join(dict.fromkeys((*BASE_ADMISSION_PLUGINS, *self.admission_plugins)))
        w = self.workdir
        self._apiserver = Process.start("kube-apiserver", [
            str(self.assets / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}", f"--secure-port={api_port}",
            f"--cert-dir={w / 'certs'}", f"--tls-cert-file={w / TLS_CERT}", f"--tls-private-key-file={w / TLS_KEY}",
            f"--client-ca-file={self.ca_file}", f"--token-auth-file={w / 'tokens.csv'}",
            f"--service-account-key-file={w / 'sa.pub'}", f"--service-account-signing-key-file={w / 'sa.key'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}", f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--authorization-mode={self.authorization}", f"--enable-admission-plugins={plugins}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            # On loopback no Pod could reach the endpoint it would keep for the kubernetes Service.
            f"--endpoint-reconciler-type={'none' if self.address == '127.0.0.1' else 'lease'}", "--profiling=false",
            f"--audit-policy-file={w / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            *((f"--kubelet-client-certificate={w / 'kube-apiserver-kubelet-client.crt'}",
               f"--kubelet-client-key={w / 'kube-apiserver-kubelet-client.key'}") if self.kubelet_client else ()),
            *self.apiserver_args,
        ], self.workdir / "kube-apiserver.log")
        self.host = f"https://{self.address}:{api_port}"
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            for process in (self._etcd, self._apiserver):
                if process is not None and not process.alive:
                    raise _EarlyExit(f"{process.name} exited ({process.popen.returncode}):\n{process.log(tail=30)}")
            answer = https_get(f"{self.host}/readyz", self.ca_file, headers={"Authorization": f"Bearer {self.token()}"})
            return answer == (200, b"ok")

        wait_until(ready, timeout, "kube-apiserver /readyz", log=lambda: self._apiserver.log(tail=30) if self._apiserver else "")

    def restart_apiserver(self, timeout: float = 60.0) -> float:
        """Kill kube-apiserver and start it again on the same port and etcd, as a control plane's restart
        looks to its clients (watches cut, connections refused, then a server with a new watch cache);
        returns the seconds until ``/readyz`` said ok again."""
        assert self._apiserver is not None, "not started"
        started = time.monotonic()
        argv = list(self._apiserver.popen.args)  # type: ignore[arg-type]
        self._apiserver.popen.kill()
        self._apiserver.popen.wait()
        self._apiserver = Process.start("kube-apiserver", argv, self.workdir / "kube-apiserver.log")
        self.wait_ready(timeout)
        return time.monotonic() - started

    # Access ------------------------------------------------------------------------------------

    def token(self, user: str = ADMIN) -> str:
        """The bearer token of ``user`` (:data:`ADMIN` or one of ``users``); KeyError for others."""
        return self._tokens[user].token

    def configuration(self, user: str = ADMIN) -> client.Configuration:
        """A client Configuration for ``user``: host, bearer token, the API server's CA."""
        configuration = client.Configuration()
        configuration.host = self.host
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": self.token(user)}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return configuration

    def api_client(self, user: str = ADMIN) -> client.ApiClient:
        """A new official ApiClient acting as ``user``; closed by :meth:`stop`."""
        api = client.ApiClient(self.configuration(user))
        self._clients.append(api)
        return api

    def client_certificate(self, user: str, groups: Sequence[str] = ()) -> tuple[Path, Path]:
        """``(cert, key)`` files of a client certificate for ``user`` in ``groups`` (its kubelet client takes no token)."""
        cert, key = _make_client_cert(self.ca_file.read_bytes(), (self.workdir / CA_KEY).read_bytes(), user, groups)
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", user)
        (self.workdir / f"{stem}.crt").write_bytes(cert)
        _write_private(self.workdir / f"{stem}.key", key)
        return self.workdir / f"{stem}.crt", self.workdir / f"{stem}.key"

    def kubeconfig(self, user: str = ADMIN) -> Path:
        """A kubeconfig file for ``user`` (written once), for ``--kubeconfig`` of a subprocess."""
        path = self.workdir / f"kubeconfig-{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}.yaml"
        if not path.exists():
            write_kubeconfig(path, self.host, user, {"token": self.token(user)}, self.ca_file)
        return path

    def audit_events(self, user: str | None = None, since: datetime | None = None) -> list[AuditEvent]:
        """Every request so far, oldest first (of ``user``, received since ``since``, when given); a watch
        has a ``code`` once it has ended. Written as requests complete: poll for a request just made."""
        by_id: dict[str, AuditEvent] = {}
        if not self.audit_log.exists():
            return []
        with self.audit_log.open(encoding="utf-8") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:  # the last line, half written
                    continue
                username = event.get("user", {}).get("username", "")
                if user is not None and username != user:
                    continue
                received = datetime.fromisoformat(event["requestReceivedTimestamp"])
                if since is not None and received < since:
                    continue
                ref = event.get("objectRef") or {}
                code = (event.get("responseStatus") or {}).get("code")
                by_id[event["auditID"]] = AuditEvent(
                    user=username, verb=event.get("verb", ""), api_group=ref.get("apiGroup", ""),
                    resource=ref.get("resource", ""), subresource=ref.get("subresource", ""),
                    namespace=ref.get("namespace", ""), name=ref.get("name", ""),
                    code=None if event.get("stage") == "ResponseStarted" else code, received=received,
                    uri=event.get("requestURI", ""),
                )
        return list(by_id.values())

    def install_prerequisites(self) -> None:
        """What the product needs of a cluster before it is installed: the Job CRD and the manifests' RBAC."""
        api = self.api_client()
        install_job_crd(api)
        install_rbac(api)


# tests/conftest.py's ``apiserver_factory`` fixture: ``apiserver_factory(admission_plugins=())`` gives a running EnvTest.
ApiServerFactory = Callable[..., EnvTest]


def write_kubeconfig(path: Path, server: str, user: str, credentials: Mapping[str, str] | None = None,
                     ca_file: Path | None = None, namespace: str | None = None) -> Path:
    """A kubeconfig (mode 0600) whose one context is ``user``@envtest on ``server``: for a subprocess's
    ``--kubeconfig``, on envtest and on the API double alike."""
    cluster = {"server": server, **({"certificate-authority": str(ca_file)} if ca_file else {})}
    context = {"cluster": "envtest", "user": user, **({"namespace": namespace} if namespace else {})}
    _write_private(path, yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [{"name": "envtest", "cluster": cluster}],
        "users": [{"name": user, "user": dict(credentials or {})}],
        "contexts": [{"name": f"{user}@envtest", "context": context}], "current-context": f"{user}@envtest",
    }).encode())
    return path


class _EarlyExit(RuntimeError):
    """etcd or kube-apiserver exited before the API server was ready."""


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# Talking to it -----------------------------------------------------------------------------------

_discovery: dict[tuple[str, str], dict[str, tuple[str, bool]]] = {}


def request(api: client.ApiClient, method: str, path: str, *, body: Any = None,
            query: Iterable[tuple[str, str]] = (), content_type: str = "application/json",
            warnings: list[str] | None = None) -> Any:
    """One call to the API server as ``api``'s user; the decoded JSON answer. Raises
    ``ApiException`` (``.status``, ``.body`` a JSON Status) for an error answer. The texts of the
    answer's ``Warning`` headers (what kubectl prints as ``Warning: ...``, e.g. from an admission
    webhook) are appended to ``warnings`` when it is given."""
    method, url, headers, payload, _ = api.param_serialize(
        method, path, query_params=list(query),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body, auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, header_params=headers, body=payload)
    response.read()
    if warnings is not None:
        warnings.extend(_warning_text(h) for h in response.headers.getlist("Warning"))
    return api.response_deserialize(response, {"2XX": "object"}).data


def _warning_text(header: str) -> str:
    # RFC 7234 warn-value as the API server writes it: 299 - "text" (quotes and backslashes escaped).
    code, _, rest = header.partition(" - ")
    text = rest.strip()
    if text.startswith('"') and text.endswith('"'):
        text = re.sub(r"\\(.)", r"\1", text[1:-1])
    return text if code == "299" else header


def status_message(exc: ApiException) -> str:
    """The ``message`` of the Status an error answer carries (the body itself when it is not one)."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body)


def _resources(api: client.ApiClient, api_version: str, refresh: bool) -> dict[str, tuple[str, bool]]:
    key = (api.configuration.host, api_version)
    if refresh or key not in _discovery:
        path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        listing = request(api, "GET", path)
        _discovery[key] = {r["kind"]: (r["name"], r["namespaced"]) for r in listing["resources"] if "/" not in r["name"]}
    return _discovery[key]


def resource_path(api: client.ApiClient, api_version: str, kind: str, namespace: str | None = None,
                  name: str | None = None) -> str:
    """The REST path of a kind (its collection, or one object with ``name``), found by discovery
    (cached; refreshed once on a miss, e.g. right after a CRD is installed)."""
    resources = _resources(api, api_version, refresh=False)
    if kind not in resources:
        resources = _resources(api, api_version, refresh=True)
    if kind not in resources:
        raise LookupError(f"the API server serves no {kind} in {api_version}")
    plural, namespaced = resources[kind]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced:
        if not namespace:
            raise ValueError(f"{kind} is namespaced: give a namespace")
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


def _path_of(api: client.ApiClient, obj: Mapping[str, Any], with_name: bool) -> str:
    meta = obj.get("metadata") or {}
    return resource_path(api, obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"] if with_name else None)


def apply(api: client.ApiClient, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
    """Server-side apply of ``obj`` (created or updated; conflicts forced), as ``kubectl apply
    --server-side --force-conflicts`` does. Returns the object as stored."""
    result: dict[str, Any] = request(
        api, "PATCH", _path_of(api, obj, with_name=True), body=dict(obj), content_type="application/apply-patch+yaml",
        query=[("fieldManager", field_manager), ("force", "true")],
    )
    return result


def create(api: client.ApiClient, obj: Mapping[str, Any], *, dry_run: bool = False,
           warnings: list[str] | None = None) -> dict[str, Any]:
    """POST ``obj`` (through admission, webhooks included); ``dry_run`` stores nothing. Warnings
    of the answer are appended to ``warnings`` when given (see :func:`request`)."""
    query = [("dryRun", "All")] if dry_run else []
    result: dict[str, Any] = request(api, "POST", _path_of(api, obj, with_name=False), body=dict(obj), query=query,
                                     warnings=warnings)
    return result


def replace(api: client.ApiClient, obj: Mapping[str, Any]) -> dict[str, Any]:
    """PUT ``obj`` (its ``metadata.resourceVersion`` makes it a compare-and-swap)."""
    result: dict[str, Any] = request(api, "PUT", _path_of(api, obj, with_name=True), body=dict(obj))
    return result


def read_path(api: client.ApiClient, path: str) -> dict[str, Any] | None:
    """The object at ``path``, or None when it does not exist."""
    try:
        result: dict[str, Any] = request(api, "GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return result


def read(api: client.ApiClient, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    """The object, or None when it does not exist."""
    return read_path(api, resource_path(api, api_version, kind, namespace, name))


def delete(api: client.ApiClient, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
    """Delete the object; False when it did not exist. (Nothing garbage-collects its dependents.)"""
    try:
        request(api, "DELETE", resource_path(api, api_version, kind, namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def new_namespace(api: client.ApiClient, prefix: str = "test-", labels: Mapping[str, str] | None = None) -> str:
    """Create a namespace named ``prefix`` + a random suffix, and its ``default`` ServiceAccount
    (no controller-manager makes it, and Pods cannot be created without it). Returns the name."""
    ns = create(api, {"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"generateName": prefix, "labels": dict(labels or {})}})
    name: str = ns["metadata"]["name"]
    create(api, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": name}})
    return name


# This project's prerequisites ------------------------------------------------------------------

# JobSet's CRD, permissive (docs/workloads.md): what the tests need of it is that the API server
# serves the kind; its schema is JobSet's business.
JOBSET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "jobsets.jobset.x-k8s.io"},
    "spec": {"group": "jobset.x-k8s.io", "scope": "Namespaced",
             "names": {"plural": "jobsets", "singular": "jobset", "kind": "JobSet", "listKind": "JobSetList"},
             "versions": [{"name": "v1alpha2", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def install_crds(api: client.ApiClient, crds: Iterable[Mapping[str, Any]], timeout: float = 30.0) -> None:
    """Apply ``crds`` and return once the API server serves each kind: discovery names it and a list answers."""
    crds = list(crds)
    for crd in crds:
        apply(api, crd)
    for crd in crds:
        spec = crd["spec"]
        api_version = f"{spec['group']}/{next(v['name'] for v in spec['versions'] if v.get('storage'))}"

        def served(api_version: str = api_version, kind: str = spec["names"]["kind"]) -> bool:
            try:
                request(api, "GET", resource_path(api, api_version, kind, "default"))
            except (LookupError, ApiException):
                return False
            return True

        wait_until(served, timeout, f"CRD {crd['metadata']['name']} to be served")


def install_jobset_crd(api: client.ApiClient, timeout: float = 20.0) -> None:
    install_crds(api, [JOBSET_CRD], timeout)


def wait_for_owner_kind(api: client.ApiClient, namespace: str, api_version: str, kind: str, timeout: float = 45.0) -> None:
    """Until an API server with :data:`OWNER_REFERENCES_ENFORCEMENT` lets ``api``'s user set a
    ``blockOwnerDeletion`` reference to a ``kind`` (a dry-run ConfigMap in ``namespace``). The plugin
    learns a CRD installed after its first use only when its RESTMapper is next reset, every 30 s;
    until then it refuses such a reference from any user but one who may finalize everything."""
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "owner-kind-probe", "namespace": namespace,
        "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "probe", "uid": "00000000-0000-0000-0000-000000000000",
                             "controller": True, "blockOwnerDeletion": True}]}}

    def mapped() -> bool:
        try:
            create(api, probe, dry_run=True)
        except ApiException as exc:
            if exc.status == 403 and "cannot find RESTMapping" in status_message(exc):
                return False
            raise
        return True

    wait_until(mapped, timeout, f"the API server's owner-reference admission to know {kind}", interval=0.5)


def install_job_crd(api: client.ApiClient, timeout: float = 30.0) -> None:
    install_crds(api, [yaml.safe_load(JOB_CRD.read_text(encoding="utf-8"))], timeout)


RBAC_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})


def rbac_objects(variant: str = DEFAULT_VARIANT) -> list[dict[str, Any]]:
    """The install variant's Roles, ClusterRoles and bindings, every ServiceAccount subject replaced by
    the token user of its name, so that user is granted exactly what the manifests grant the ServiceAccount."""
    out = []
    for obj in build_variant(variant):
        if obj["kind"] not in RBAC_KINDS:
            continue
        if obj["kind"].endswith("Binding"):
            obj = {**obj, "subjects": [
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": s["name"]}
                if s.get("kind") == "ServiceAccount" else s
                for s in obj.get("subjects") or []
            ]}
        out.append(obj)
    return out


def can(api: client.ApiClient, user: str, verb: str, resource: str, *, group: str = "", namespace: str = "",
        name: str = "", subresource: str = "") -> bool:
    """Whether the API server's authorizer lets ``user`` do this now (a SubjectAccessReview; ``api``
    must be allowed to create those, as the admin is)."""
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
                  "namespace": namespace, "name": name}
    review = create(api, {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                          "spec": {"user": user, "resourceAttributes": attributes}})
    return bool(review["status"].get("allowed"))


def wait_for_bindings(api: client.ApiClient, objects: Iterable[Mapping[str, Any]], timeout: float = 10.0) -> None:
    """Return once every User subject of the bindings among ``objects`` holds the first permission of
    its role: the RBAC authorizer works from a cache, so a binding just written may not count yet."""
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref, namespace = binding["roleRef"], binding["metadata"].get("namespace") or ""
        role = roles.get((ref["kind"], namespace or None if ref["kind"] == "Role" else None, ref["name"]))
        if role is None or not role.get("rules"):
            continue
        rule = role["rules"][0]
        resource, _, subresource = rule["resources"][0].partition("/")
        for subject in binding.get("subjects") or []:
            if subject.get("kind") != "User":
                continue
            check = functools.partial(
                can, api, subject["name"], rule["verbs"][0], resource, group=rule["apiGroups"][0],
                namespace=namespace, name=(rule.get("resourceNames") or [""])[0], subresource=subresource,
            )
            wait_until(check, timeout, f"{binding['kind']} {binding['metadata']['name']} to apply to {subject['name']}")


def grant_role(api: client.ApiClient, user: str, namespace: str, name: str, rules: list[dict[str, Any]]) -> None:
    """A Role ``name`` in ``namespace`` of ``rules``, bound to token user ``user``; in force when
    this returns (``delete`` the RoleBinding ``name`` to revoke it)."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "namespace": namespace},
            "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]}
    for obj in (role, binding):
        apply(api, obj)
    wait_for_bindings(api, [role, binding])


def install_rbac(api: client.ApiClient, variant: str = DEFAULT_VARIANT) -> list[dict[str, Any]]:
    """Apply the variant's Namespace (``volcano-job-webhook``, for its Roles) and :func:`rbac_objects`,
    and wait until the bindings are in force. Returns the RBAC objects applied."""
    for obj in build_variant(variant):
        if obj["kind"] == "Namespace":
            apply(api, obj)
    objects = rbac_objects(variant)
    for obj in objects:
        apply(api, obj)
    wait_for_bindings(api, objects)
    return objects


# The product -------------------------------------------------------------------------------------


KCM_CONTROLLERS = ("job-controller", "garbage-collector-controller")


@contextmanager
def controller_manager(envtest: EnvTest, workdir: Path, controllers: Sequence[str] = KCM_CONTROLLERS,
                       timeout: float = 30.0, *, user: str = ADMIN, args: Sequence[str] = (),
                       env: Mapping[str, str] | None = None) -> Iterator[Process]:
    """kube-controller-manager (``KUBEBUILDER_ASSETS``) running ``controllers`` against ``envtest`` as
    ``user`` (its admin by default), with ``args`` added, once ``/healthz`` answers; stopped at the
    end. Skips when the directory has none. Register custom kinds first: its garbage collector
    learns them at start (then every 30 s)."""
    import pytest

    binary = envtest.assets / "kube-controller-manager"
    if not binary.exists():
        pytest.skip(f"{ASSETS_ENV} has no kube-controller-manager (the Job controller and garbage collector)")
    port = free_port()
    process = Process.start("kube-controller-manager", [
        str(binary), f"--kubeconfig={envtest.kubeconfig(user)}", f"--controllers={','.join(controllers)}",
        "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
        "--kube-api-qps=200", "--kube-api-burst=400", *args,
    ], workdir / "kube-controller-manager.log", env=env)
    try:
        process.wait_for(lambda: http_ok(f"https://127.0.0.1:{port}/healthz"), timeout, "kube-controller-manager's /healthz")
        yield process
    finally:
        process.stop()


def product_env() -> dict[str, str]:
    """This environment minus what would change the product's settings or cluster behind the
    test's back (``VOLCANO_WEBHOOK_*``, ``KUBECONFIG``); output unbuffered for the log file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLCANO_WEBHOOK_") and k != "KUBECONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_product(args: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> Process:
    """``python -m volcano_job_webhook ARGS`` with this interpreter, output to ``log_path``."""
    return Process.start("volcano_job_webhook", [sys.executable, "-m", "volcano_job_webhook", *args], log_path,
                         env=env if env is not None else product_env())


@dataclass
class ProductWebhook:
    """The product's webhook server, running: where it listens and the CA that signed its certificate."""

    process: Process
    base_url: str
    ca_bundle: bytes


@contextmanager
def serving_webhook(workdir: Path, kubeconfig: Path, *args: str, timeout: float = 30.0,
                    port: int | None = None) -> Iterator[ProductWebhook]:
    """``volcano-webhook serve --job-source=kube`` (plus ``args``) through ``kubeconfig``, on 127.0.0.1
    (``port``, else a free one) with the certificate it makes itself in ``workdir``/certs (kept from
    an earlier run there), once ``/readyz`` says its Job cache is synced; stopped at the end."""
    workdir.mkdir(parents=True, exist_ok=True)
    certs, port = workdir / "certs", port or free_port()
    process = start_product(["serve", "--host=127.0.0.1", f"--port={port}", f"--certs-dir={certs}", "--job-source=kube",
                             f"--kubeconfig={kubeconfig}", "--log-level=debug", *args], workdir / "serve.log")
    base_url = f"https://127.0.0.1:{port}"
    try:
        process.wait_for(lambda: (certs / CA_CERT).exists() and http_ok(f"{base_url}/readyz", certs / CA_CERT), timeout,
                         "the webhook's /readyz (Job cache synced)")
        yield ProductWebhook(process, base_url, (certs / CA_CERT).read_bytes())
    finally:
        process.stop()


def https_get(url: str, ca_file: Path | None = None, timeout: float = 2.0,
              headers: Mapping[str, str] | None = None) -> tuple[int, bytes] | None:
    """``(status, body)`` of a GET; None when nothing answers. HTTPS is checked against ``ca_file``, or
    not at all without one (a component's own self-signed certificate); plain HTTP works too."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if ca_file is None:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), context=context,
                                    timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def http_ok(url: str, ca_file: Path | None = None) -> bool:
    """Whether a GET of ``url`` answers 200 (see :func:`https_get`)."""
    answer = https_get(url, ca_file)
    return answer is not None and answer[0] == 200


def webhook_configurations(base_url: str, ca_bundle: bytes, variant: str = DEFAULT_VARIANT) -> list[dict[str, Any]]:
    """The variant's Mutating- and ValidatingWebhookConfigurations as the reconciler registers them
    (``webhooks.yaml`` of its settings ConfigMap), with each ``clientConfig.service`` replaced by
    ``url: base_url + its path`` and ``caBundle`` set — the only way an envtest API server reaches a
    webhook. Everything else (rules, selectors, failure policy, timeouts) is the manifests'."""
    out = []
    for obj in registered_configurations(build_variant(variant)):
        webhooks = []
        for hook in obj["webhooks"]:
            service = hook["clientConfig"]["service"]
            webhooks.append({**hook, "clientConfig": {
                "url": base_url.rstrip("/") + service.get("path", "/"),
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }})
        out.append({**obj, "webhooks": webhooks})
    return out

