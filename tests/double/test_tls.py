"""A real uvicorn HTTPS server on loopback: TLS versions and ciphers, no plaintext, certificate swap
under load (files replaced, and a Secret volume updated as the kubelet does), half-written pairs
ignored, client certificates, the expiry metric, what runs while it serves, a port already taken."""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import logging
import os
import shutil
import socket
import ssl
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import generate_latest

from tests.helpers.envtest import wait_until
from tests.helpers.paths import EXAMPLES, ROOT
from tests.helpers.servers import files, in_thread
from volcano_job_webhook.certs import ensure_certs, generate_ca, generate_serving_cert
from volcano_job_webhook.certs.issue import Policy
from volcano_job_webhook.certs.reload import CertReloader, make_server_context
from volcano_job_webhook.server.https import HTTPSServer, ListenError, build_server
from volcano_job_webhook.server.metrics import WebhookMetrics


async def tiny_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: 200 ``{"status": "ok"}`` for every request."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"status": "ok"}'})


def client_cert(ca_pem: bytes, ca_key_pem: bytes) -> tuple[bytes, bytes]:
    """A client certificate (extendedKeyUsage clientAuth), as the API server presents."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


@contextmanager
def running(certs: Path, app: Any = tiny_app, client_ca: Path | None = None, interval: float = 3600.0) -> Iterator[HTTPSServer]:
    """The server on 127.0.0.1, an ephemeral port (``server.port``), in a thread; stopped on exit.
    The default interval is long so only ``reload_now()`` reloads unless a test asks for polling."""
    reloader = CertReloader.from_files(certs / "tls.crt", certs / "tls.key", client_ca, interval)
    server = build_server(app, "127.0.0.1", 0, reloader, log_level="warning", lifespan="off" if app is tiny_app else "auto")
    with in_thread(server):
        yield server


def trusting(ca: Path, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if version is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1 are deprecated: that is the point
            context.minimum_version = context.maximum_version = version
    return context


def handshake(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        return context.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def served_serial(port: int, ca: Path) -> int:
    """The serial number of the certificate the server presents to a fresh raw TLS connection."""
    with handshake(port, trusting(ca)) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    ensure_certs(tmp_path / "certs")
    return tmp_path / "certs"


def test_the_context_allows_tls12_plus_with_forward_secret_aead_ciphers_only(certs):
    context = make_server_context(certs / "tls.crt", certs / "tls.key")
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION
    assert context.options & getattr(ssl, "OP_NO_RENEGOTIATION", 0) == getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    assert context.verify_mode == ssl.CERT_NONE
    tls12 = [c for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 and all(c["kea"] == "kx-ecdhe" and c["aead"] for c in tls12), tls12
    with_clients = make_server_context(certs / "tls.crt", certs / "tls.key", certs / "ca.crt")
    assert with_clients.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ssl.SSLError, match="KEY_VALUES_MISMATCH"):
        make_server_context(certs / "tls.crt", certs / "ca.key")  # not the certificate's key


def tls11_client_works_somewhere(certs: Path) -> bool:
    """Control for the refusal below: does this OpenSSL speak TLS 1.1 at all (to a permissive
    server)? Only then does a failed TLS 1.1 handshake prove that *our* server refused it."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        server_context.minimum_version = ssl.TLSVersion.TLSv1_1
        server_context.maximum_version = ssl.TLSVersion.TLSv1_1
    server_context.set_ciphers("DEFAULT:@SECLEVEL=0")
    server_context.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        conn, _ = listener.accept()
        try:
            with server_context.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    client = tls11_client(certs)
    try:
        with handshake(listener.getsockname()[1], client) as tls:
            return tls.version() == "TLSv1.1"
    except (ssl.SSLError, OSError):
        return False
    finally:
        thread.join(5)
        listener.close()


def tls11_client(certs: Path) -> ssl.SSLContext:
    context = trusting(certs / "ca.crt", ssl.TLSVersion.TLSv1_1)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer TLS 1.1's ciphers
    return context


def test_tls13_and_tls12_are_accepted_tls11_and_weak_ciphers_refused_and_no_plaintext(certs):
    with running(certs) as server:
        for version, name in ((ssl.TLSVersion.TLSv1_3, "TLSv1.3"), (ssl.TLSVersion.TLSv1_2, "TLSv1.2")):
            context = trusting(certs / "ca.crt", version)
            reply = httpx.get(f"https://localhost:{server.port}/healthz", verify=context)
            assert reply.status_code == 200 and reply.json() == {"status": "ok"}
            with handshake(server.port, context) as tls:
                assert tls.version() == name
                cipher = tls.cipher()
                assert cipher is not None and ("GCM" in cipher[0] or "CHACHA20" in cipher[0]), cipher

        if not tls11_client_works_somewhere(certs):
            pytest.skip("this OpenSSL cannot speak TLS 1.1 at all, so its refusal proves nothing")
        with pytest.raises((ssl.SSLError, OSError)):
            handshake(server.port, tls11_client(certs)).close()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://localhost:{server.port}/healthz", verify=tls11_client(certs))

        cbc_only = trusting(certs / "ca.crt", ssl.TLSVersion.TLSv1_2)
        cbc_only.set_ciphers("ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA256:@SECLEVEL=0")
        with pytest.raises((ssl.SSLError, OSError)):
            handshake(server.port, cbc_only).close()

        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP to the port: not an HTTP server
            httpx.get(f"http://127.0.0.1:{server.port}/healthz")
        assert len(server.addresses) == 1, "exactly one listener, the TLS one"


class Load:
    """Requests over a fresh connection each (so each one makes a handshake) until stopped."""

    def __init__(self, port: int, ca: Path) -> None:
        self.url, self.context = f"https://localhost:{port}/healthz", trusting(ca)
        self.ok, self.failures = 0, []  # type: ignore[var-annotated]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                with httpx.Client(verify=self.context) as c:
                    assert c.get(self.url).status_code == 200
                self.ok += 1
            except Exception as exc:
                self.failures.append(exc)

    def __enter__(self) -> Load:
        self._thread.start()

        def under_way() -> bool:  # before the swap
            assert not self.failures, self.failures
            return self.ok >= 5

        wait_until(under_way, 5, "five requests answered", interval=0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(10)


def swap_in_new_cert(certs: Path, dns: list[str] | None = None) -> int:
    """Renew as a rotation would: same CA, new key and cert (new serial), each file replaced
    atomically, key first. Returns the new serial."""
    cert, key = generate_serving_cert((certs / "ca.crt").read_bytes(), (certs / "ca.key").read_bytes(),
                                      dns or ["localhost"], ["127.0.0.1"])
    for name, data in (("tls.key", key), ("tls.crt", cert)):
        (certs / f".{name}.new").write_bytes(data)
        (certs / f".{name}.new").replace(certs / name)
    return x509.load_pem_x509_certificate(cert).serial_number


@pytest.fixture
def reloads(caplog: pytest.LogCaptureFixture) -> Callable[[], int]:
    """How many new pairs the reloaders loaded since the test began: the line each reload logs."""
    caplog.set_level(logging.INFO, logger="volcano_job_webhook.certs.reload")
    return lambda: sum(r.getMessage().startswith("reloaded TLS certificate") for r in caplog.records)


def test_reload_now_serves_the_new_cert_without_a_failed_request(certs, reloads):
    with running(certs) as server:
        old = served_serial(server.port, certs / "ca.crt")
        assert old == serial_of(certs / "tls.crt")
        with Load(server.port, certs / "ca.crt") as load:
            new = swap_in_new_cert(certs)
            assert served_serial(server.port, certs / "ca.crt") == old, "nothing changes before a reload"
            assert server.reloader.reload_now() is True  # from this thread: handed to the server's loop
            assert served_serial(server.port, certs / "ca.crt") == new
            before = load.ok
            wait_until(lambda: load.ok >= before + 5, 10, "five more requests answered", interval=0.01)
        assert load.failures == [] and load.ok > 10
        assert server.reloader.reload_now() is False, "nothing new on disk"
        assert reloads() == 1


def test_the_poll_picks_up_a_renewal_by_ensure_certs_under_load(certs, reloads):
    with running(certs, interval=0.05) as server:
        old = served_serial(server.port, certs / "ca.crt")
        with Load(server.port, certs / "ca.crt") as load:
            # ensure_certs writes the key, then the certificate: the poll may see the new key with
            # the old certificate in between, which must be skipped without a failed handshake.
            assert ensure_certs(certs, policy=Policy(renew_before=timedelta(days=400))).created
            new = serial_of(certs / "tls.crt")
            assert new != old
            wait_until(lambda: served_serial(server.port, certs / "ca.crt") == new, 5, "the new certificate served", interval=0.02)
            before = load.ok
            wait_until(lambda: load.ok >= before + 5, 10, "five more requests answered", interval=0.01)
        assert load.failures == [] and load.ok > 10
        assert reloads() >= 1


def test_half_written_mismatched_or_missing_pairs_are_ignored_then_retried(certs, caplog, reloads):
    caplog.set_level(logging.INFO, logger="volcano_job_webhook.certs.reload")
    with running(certs, interval=0.05) as server:
        old = served_serial(server.port, certs / "ca.crt")
        ca_cert, ca_key = (certs / "ca.crt").read_bytes(), (certs / "ca.key").read_bytes()
        new_cert, new_key = generate_serving_cert(ca_cert, ca_key, ["localhost"], [])

        (certs / "tls.crt").write_bytes(new_cert)  # its key has not arrived: a mismatched pair
        assert server.reloader.reload_now() is False
        (certs / "tls.key").write_bytes(new_key[: len(new_key) // 2])  # half-written key
        assert server.reloader.reload_now() is False
        time.sleep(0.2)  # several polls
        assert served_serial(server.port, certs / "ca.crt") == old
        assert httpx.get(f"https://localhost:{server.port}/", verify=trusting(certs / "ca.crt")).status_code == 200

        (certs / "tls.key").unlink()  # a missing file, as during some rotations
        assert server.reloader.reload_now() is False
        assert served_serial(server.port, certs / "ca.crt") == old
        assert reloads() == 0

        (certs / "tls.key").write_bytes(new_key)  # the write completes: picked up on a later look
        wait_until(lambda: served_serial(server.port, certs / "ca.crt") == serial_of(certs / "tls.crt"), 5,
                   "the completed pair picked up", interval=0.02)
        assert reloads() == 1
    assert "PRIVATE KEY" not in caplog.text
    assert any("not loaded" in r.getMessage() for r in caplog.records)
    assert any("reloaded TLS certificate" in r.getMessage() for r in caplog.records)


def test_reloader_without_a_server(certs, reloads):
    """Off any loop, reload_now works directly; touching files without new content is no reload."""
    reloader = CertReloader.from_files(certs / "tls.crt", certs / "tls.key", interval=1)
    cert = (certs / "tls.crt").read_bytes()
    (certs / "tls.crt").write_bytes(cert)  # new mtime, same content
    assert reloader.reload_now() is False and reloads() == 0
    swap_in_new_cert(certs)
    assert reloader.reload_now() is True and reloader.reload_now() is False
    with pytest.raises(FileNotFoundError, match=r"absent\.crt"):
        CertReloader.from_files(certs / "absent.crt", certs / "tls.key")


def test_ssl_keywords_are_refused(certs):
    with pytest.raises(TypeError, match="ssl_certfile"):
        build_server(tiny_app, "127.0.0.1", 0, files(certs), ssl_certfile="x")


class Lifetime:
    """A background coroutine that says when it started and when it was cancelled."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self) -> None:
        self.seen.append("started")
        try:
            await asyncio.Event().wait()
        finally:
            self.seen.append("cancelled")


def test_the_reloaders_watch_and_the_background_tasks_run_while_it_serves(certs):
    background, watch = Lifetime(), Lifetime()
    server = build_server(tiny_app, "127.0.0.1", 0, files(certs), log_level="warning", lifespan="off", background=[background])
    server.reloader.poll = watch  # type: ignore[method-assign]  # what serve runs as the reloader's watch
    with in_thread(server):
        wait_until(lambda: watch.seen == ["started"], 5, "the reloader's watch started", interval=0.01)
        wait_until(lambda: background.seen == ["started"], 5, "the background task started", interval=0.01)
    assert watch.seen == ["started", "cancelled"], "the reloader's watch outlived the server"
    assert background.seen == ["started", "cancelled"]
    assert server.addresses == [], "the listening socket outlived the server"


def test_a_port_already_taken_is_a_listen_error_before_anything_starts(certs):
    background, watch = Lifetime(), Lifetime()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = build_server(tiny_app, "127.0.0.1", port, files(certs), log_level="warning", background=[background])
        server.reloader.poll = watch  # type: ignore[method-assign]
        with pytest.raises(ListenError) as raised:
            server.run()
    assert str(raised.value) == (f"cannot listen on 127.0.0.1:{port}: the address is already in use (another process "
                                 "listens there); choose another port with --port")
    assert background.seen == [] and watch.seen == [] and not server.started


def test_client_certificates_are_required_when_configured(certs, tmp_path):
    client_ca, client_ca_key = generate_ca("api-server-clients")
    (tmp_path / "clients.crt").write_bytes(client_ca)
    for prefix, (ca, key) in (("client", (client_ca, client_ca_key)), ("stranger", generate_ca("stranger-ca"))):
        cert, cert_key = client_cert(ca, key)
        (tmp_path / f"{prefix}.crt").write_bytes(cert)
        (tmp_path / f"{prefix}.key").write_bytes(cert_key)
    with running(certs, client_ca=tmp_path / "clients.crt") as server:
        url = f"https://localhost:{server.port}/healthz"
        failed = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)
        with pytest.raises(failed):
            httpx.get(url, verify=trusting(certs / "ca.crt"))
        stranger = trusting(certs / "ca.crt")
        stranger.load_cert_chain(tmp_path / "stranger.crt", tmp_path / "stranger.key")
        with pytest.raises(failed):
            httpx.get(url, verify=stranger)
        with_cert = trusting(certs / "ca.crt")
        with_cert.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
        assert httpx.get(url, verify=with_cert).status_code == 200
        # Still required after a certificate reload.
        swap_in_new_cert(certs)
        assert server.reloader.reload_now()
        with pytest.raises(failed):
            httpx.get(url, verify=trusting(certs / "ca.crt"))
        assert httpx.get(url, verify=with_cert).status_code == 200


def test_recorded_reviews_through_the_real_https_server(certs):
    from volcano_job_webhook.plugins import Chain
    from volcano_job_webhook.server.app import create_app
    from volcano_job_webhook.server.jobs import DirectoryJobSource

    app = create_app(DirectoryJobSource(EXAMPLES / "jobs"), Chain())
    with running(certs, app=app) as server, httpx.Client(verify=trusting(certs / "ca.crt"), base_url=f"https://localhost:{server.port}") as c:
        for path in sorted((EXAMPLES / "admission").glob("*.json")):
            review = json.loads(path.read_text())
            reply = c.post("/validate" if "validate" in path.stem else "/mutate", json=review)
            assert reply.status_code == 200
            body = reply.json()
            assert body["apiVersion"] == review["apiVersion"] and body["response"]["uid"] == review["request"]["uid"]
            recorded = ROOT / "tests" / "fixtures" / "admission" / f"{path.stem}.patch.json"
            if recorded.exists():
                assert json.loads(base64.b64decode(body["response"]["patch"])) == json.loads(recorded.read_text())
            else:
                assert body["response"]["allowed"] is (path.stem != "broken-job-validate")


def test_reload_without_memfd_uses_a_private_temporary_directory(certs, monkeypatch, reloads):
    def refused(*args):  # as under a seccomp profile without memfd_create
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "memfd_create", refused)
    reloader = files(certs)
    new = swap_in_new_cert(certs)
    assert reloader.reload_now() is True
    assert reloads() == 1 and new == serial_of(certs / "tls.crt")


# A Secret volume as the kubelet writes it ---------------------------------------------------------


def kubelet_write(volume: Path, files: dict[str, bytes], version: int) -> None:
    """What the kubelet's AtomicWriter does to a mounted Secret: the files go into a fresh hidden
    directory, ``..data`` is switched to it by renaming a new symlink over it (one atomic step for
    every file at once), the visible names are symlinks through ``..data``, and the old directory is
    removed afterwards."""
    volume.mkdir(exist_ok=True)
    fresh = volume / f"..2030_01_01_00_00_{version:02d}.{version}"
    fresh.mkdir()
    for name, data in files.items():
        (fresh / name).write_bytes(data)
    old = os.readlink(volume / "..data") if (volume / "..data").is_symlink() else None
    (volume / "..data_tmp").symlink_to(fresh.name)
    os.rename(volume / "..data_tmp", volume / "..data")
    for name in files:
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    if old is not None:
        shutil.rmtree(volume / old)


def secret_files(certs: Path, days: int = 365) -> dict[str, bytes]:
    """A serving Secret's files as ``certs --secret`` fills them: no CA key."""
    ca, ca_key = (certs / "ca.crt").read_bytes(), (certs / "ca.key").read_bytes()
    cert, key = generate_serving_cert(ca, ca_key, ["localhost"], ["127.0.0.1"], days=days)
    return {"ca.crt": ca, "tls.crt": cert, "tls.key": key}


def test_a_renewed_secret_swapped_in_by_the_kubelet_is_served_without_a_restart(certs, tmp_path, reloads):
    volume = tmp_path / "volume"
    kubelet_write(volume, secret_files(certs), 1)
    with running(volume, interval=0.05) as server:
        first = served_serial(server.port, volume / "ca.crt")
        assert first == serial_of(volume / "tls.crt")
        for version in (2, 3):  # and again: the second swap replaces a directory the first one made
            with Load(server.port, volume / "ca.crt") as load:
                kubelet_write(volume, secret_files(certs), version)
                new = serial_of(volume / "tls.crt")
                assert new != first
                wait_until(lambda new=new: served_serial(server.port, volume / "ca.crt") == new, 10, "the swapped-in certificate served")
                before = load.ok
                wait_until(lambda before=before: load.ok >= before + 5, 10, "requests after the swap")
            assert load.failures == []
            first = new
        assert reloads() == 2
        assert sorted(p.name for p in volume.iterdir() if p.name.startswith("..2030")) == ["..2030_01_01_00_00_03.3"]


def test_the_expiry_metric_follows_each_reload(certs):
    now = datetime(2031, 6, 1, tzinfo=UTC)
    files = secret_files(certs, days=3650)
    for name, blob in files.items():
        (certs / name).write_bytes(blob)
    reloader = CertReloader.from_files(certs / "tls.crt", certs / "tls.key", clock=lambda: now)
    metrics = WebhookMetrics()
    assert "volcano_webhook_certificate_expiry_seconds" not in generate_latest(metrics.registry).decode(), \
        "no certificate, no series (a 0 would read as expired)"
    metrics.watch_certificate(reloader.expiry_seconds)

    def exported() -> float | None:
        return metrics.registry.get_sample_value("volcano_webhook_certificate_expiry_seconds")

    expiry = x509.load_pem_x509_certificate(files["tls.crt"]).not_valid_after_utc
    assert exported() == (expiry - now).total_seconds() > 0
    swap_in_new_cert(certs)  # 365 days from today: before `now`, so expired
    assert reloader.reload_now() is True
    expiry = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).not_valid_after_utc
    assert exported() == (expiry - now).total_seconds() < 0


def test_certs_imports_nothing_of_the_server():
    """Imports go one way: the server serves the reloader's context; certificates know no HTTP."""
    forbidden = ("volcano_job_webhook.server", "volcano_job_webhook.cli", "uvicorn", "httptools", "fastapi", "starlette")
    for path in sorted((ROOT / "webhook" / "certs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # relative ones made absolute: ``from ..server`` too
                base = ["volcano_job_webhook", "certs"][: 3 - node.level] if node.level else []
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                continue
            bad = [name for name in names if name.startswith(forbidden)]
            assert not bad, f"{path.relative_to(ROOT)}:{node.lineno} imports {bad}"
