"""A real uvicorn HTTPS server on loopback: TLS versions, certificate swap under load, client certs."""

from __future__ import annotations

import socket
import ssl
import threading
import time
import warnings
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from plugins import Chain
from webhook.app import create_app
from webhook.certs import ensure_certs, generate_ca, generate_serving_cert
from webhook.jobsource import DirectoryJobSource
from webhook.tls import build_server

from tests.conftest import EXAMPLES


def client_cert(ca_pem: bytes, ca_key_pem: bytes) -> tuple[bytes, bytes]:
    """A client certificate (extendedKeyUsage clientAuth), as the API server presents."""
    from datetime import datetime, timedelta, timezone

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, certs: Path, client_ca: Path | None = None) -> None:
        self.port = free_port()
        app = create_app(DirectoryJobSource(EXAMPLES / "jobs"), Chain())
        self.server = build_server(app, "127.0.0.1", self.port, certs / "tls.crt", certs / "tls.key",
                                   client_ca_file=client_ca, reload_interval=0.1, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def served_serial(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port)) as raw, context.wrap_socket(raw, server_hostname="localhost") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    ensure_certs(tmp_path / "certs")
    return tmp_path / "certs"


def test_tls_versions_and_no_plaintext(certs):
    with Running(certs) as running:
        for version, ok in ((ssl.TLSVersion.TLSv1_1, False), (ssl.TLSVersion.TLSv1_2, True), (ssl.TLSVersion.TLSv1_3, True)):
            context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1 is deprecated: that is the point
                context.minimum_version = context.maximum_version = version
            if version == ssl.TLSVersion.TLSv1_1:
                context.set_ciphers("DEFAULT:@SECLEVEL=0")
            try:
                reply = httpx.get(f"https://localhost:{running.port}/healthz", verify=context)
                assert ok and reply.json() == {"status": "ok"}
            except (httpx.ConnectError, ssl.SSLError):
                assert not ok, version
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"http://127.0.0.1:{running.port}/healthz")


def test_a_renewed_cert_is_served_without_a_failed_request(certs):
    with Running(certs) as running:
        old = served_serial(running.port, certs / "ca.crt")
        failures, done, count = [], threading.Event(), [0]

        def load() -> None:
            context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            while not done.is_set():
                try:  # a fresh connection each time, so each request makes a handshake
                    with httpx.Client(verify=context) as c:
                        assert c.get(f"https://localhost:{running.port}/healthz").status_code == 200
                    count[0] += 1
                except Exception as exc:  # noqa: BLE001 - any failure counts
                    failures.append(exc)

        worker = threading.Thread(target=load)
        worker.start()
        time.sleep(0.3)
        # Renew as a rotation would: same CA, new serving cert and key, each file replaced atomically.
        new_cert, new_key = generate_serving_cert((certs / "ca.crt").read_bytes(), (certs / "ca.key").read_bytes(), ["localhost"], [])
        staging = certs.parent / "staging"
        staging.mkdir()
        (staging / "tls.key").write_bytes(new_key)
        (staging / "tls.crt").write_bytes(new_cert)
        for name in ("tls.key", "tls.crt"):
            (staging / name).replace(certs / name)
        deadline = time.monotonic() + 5
        while served_serial(running.port, certs / "ca.crt") == old:
            assert time.monotonic() < deadline, "new certificate not served"
            time.sleep(0.05)
        time.sleep(0.3)
        done.set()
        worker.join()
        assert failures == [] and count[0] > 5
        assert served_serial(running.port, certs / "ca.crt") == x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).serial_number


def test_a_mismatched_pair_is_ignored(certs):
    with Running(certs) as running:
        old = served_serial(running.port, certs / "ca.crt")
        ca_cert, ca_key = (certs / "ca.crt").read_bytes(), (certs / "ca.key").read_bytes()
        new_cert, _ = generate_serving_cert(ca_cert, ca_key, ["localhost"], [])
        (certs / "tls.crt").write_bytes(new_cert)  # its key never arrives
        time.sleep(0.4)
        assert served_serial(running.port, certs / "ca.crt") == old
        assert running.server.reloader.reloads == 0


def test_client_certificates_are_required_when_configured(certs, tmp_path):
    client_ca, client_ca_key = generate_ca("api-server-clients")
    (tmp_path / "clients.crt").write_bytes(client_ca)
    cert, key = client_cert(client_ca, client_ca_key)
    (tmp_path / "client.crt").write_bytes(cert)
    (tmp_path / "client.key").write_bytes(key)
    with Running(certs, client_ca=tmp_path / "clients.crt") as running:
        url = f"https://localhost:{running.port}/healthz"
        anonymous = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.get(url, verify=anonymous)
        with_cert = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with_cert.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        assert httpx.get(url, verify=with_cert).status_code == 200


def test_recorded_reviews_through_the_real_https_server(certs):
    import base64
    import json

    from tests.conftest import ROOT

    with Running(certs) as running:
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with httpx.Client(verify=context, base_url=f"https://localhost:{running.port}") as c:
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
