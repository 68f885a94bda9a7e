"""Certificates: files on disk, and the cluster Secret plus caBundle. Why the API double: its request
log showing a second run writes nothing (fault injection), and ``certs --secret`` on a machine
without kube-apiserver (coverage without the real parts; tests/apiserver/test_rbac.py runs it on one)."""

from __future__ import annotations

import base64
import os
import re
import ssl
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.helpers.apiserver import FakeApiServer
from volcano_job_webhook.certs.cluster import sync
from volcano_job_webhook.certs.files import ensure_certs, load_bundle
from volcano_job_webhook.certs.issue import (
    CertBundle,
    Policy,
    RenewBefore,
    bundle_is_good,
    cert_covers,
    default_sans,
    generate_ca,
    generate_serving_cert,
    needs_renewal,
)
from volcano_job_webhook.cli import main

SANS = ["localhost", "volcano-job-webhook.volcano-job-webhook.svc", "volcano-job-webhook.volcano-job-webhook.svc.cluster.local"]
FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file's bytes, mtime and inode: what "changed nothing" compares."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in sorted(directory.iterdir())}


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    """The signature check itself, with the CA's public key (raises InvalidSignature otherwise)."""
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert cert.issuer == ca.subject


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> None:
    """A TLS handshake over memory BIOs; raises ``ssl.SSLCertVerificationError`` if the client refuses."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=server_hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


@pytest.mark.parametrize("name", ["hook.ns.svc", "hook.ns.svc.cluster.local", "hook.ns", "localhost", "127.0.0.1", "::1"])
def test_default_certificate_is_accepted_where_clients_dial(tmp_path, name):
    """The API server dials ``<service>.<namespace>.svc``; local tools dial localhost or a loopback IP."""
    paths = ensure_certs(tmp_path, "hook", "ns")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(paths.cert, paths.key)
    client = ssl.create_default_context(cafile=str(paths.ca_cert))
    _handshake(server, client, name)


def test_default_certificate_is_refused_for_other_names(tmp_path):
    paths = ensure_certs(tmp_path, "hook", "ns")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(paths.cert, paths.key)
    client = ssl.create_default_context(cafile=str(paths.ca_cert))
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(server, client, "other.ns.svc")


def test_generate_ca_is_a_p256_ca_for_signing_certificates_only():
    cert_pem, key_pem = generate_ca("test-ca", days=10)
    cert = load(cert_pem)
    assert isinstance(serialization.load_pem_private_key(key_pem, None), ec.EllipticCurvePrivateKey)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    assert cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value == \
        x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    verify_signed_by(cert, cert)  # self-signed
    assert timedelta(days=9) < cert.not_valid_after_utc - datetime.now(UTC) <= timedelta(days=10)


def test_serving_cert_names_usages_and_issuer():
    ca_pem, ca_key = generate_ca()
    dns, ips = default_sans()
    cert_pem, _ = generate_serving_cert(ca_pem, ca_key, dns, ips)
    cert, ca = load(cert_pem), load(ca_pem)
    verify_signed_by(cert, ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == dns
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH])
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_encipherment and not usage.key_cert_sign  # EC key: no key transport
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    assert cert_covers(cert_pem, dns, ips) and cert_covers(cert_pem, ["LOCALHOST"], ["0:0::1"])
    assert not cert_covers(cert_pem, ["other.svc"], []) and not cert_covers(cert_pem, [], ["10.0.0.1"])
    assert timedelta(days=364) < cert.not_valid_after_utc - datetime.now(UTC) <= timedelta(days=365)


def test_serving_cert_never_outlives_its_ca_and_long_names_stay_out_of_the_cn():
    ca_pem, ca_key = generate_ca(days=20)
    dns, ips = default_sans("s" * 63, "n" * 63)
    cert = load(generate_serving_cert(ca_pem, ca_key, dns, ips)[0])
    assert cert.not_valid_after_utc == load(ca_pem).not_valid_after_utc
    assert len(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value) <= 64
    with pytest.raises(ValueError, match="needs at least one DNS name or IP address"):
        generate_serving_cert(ca_pem, ca_key, [], [])


def test_ensure_certs_creates_a_signed_cert_with_the_sans_and_private_keys_0600(tmp_path):
    paths = ensure_certs(tmp_path / "certs")
    assert paths.created
    assert (paths.ca_cert, paths.cert, paths.key) == tuple(tmp_path / "certs" / n for n in ("ca.crt", "tls.crt", "tls.key"))
    cert = load(paths.cert.read_bytes())
    ca = load(paths.ca_cert.read_bytes())
    verify_signed_by(cert, ca)
    cert.verify_directly_issued_by(ca)
    assert cert_covers(paths.cert.read_bytes(), *default_sans())
    for name, mode in (("tls.key", 0o600), ("ca.key", 0o600), ("tls.crt", 0o644), ("ca.crt", 0o644)):
        assert stat.S_IMODE(os.stat(tmp_path / "certs" / name).st_mode) == mode, name
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == sorted(FILES), "no temporary files left"


@pytest.mark.parametrize("umask", [0o077, 0o000, 0o027])
def test_file_modes_do_not_depend_on_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        ensure_certs(tmp_path)
    finally:
        os.umask(old)
    modes = {name: stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in FILES}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}


def test_ensure_certs_is_idempotent(tmp_path):
    ensure_certs(tmp_path)
    before = snapshot(tmp_path)
    assert not ensure_certs(tmp_path).created
    assert not ensure_certs(tmp_path, now=datetime.now(UTC) + timedelta(days=200)).created  # 165 of 365 days left
    assert snapshot(tmp_path) == before


def test_the_default_window_is_the_last_third_of_the_lifetime(tmp_path):
    ensure_certs(tmp_path)
    cert = load_bundle(tmp_path).cert
    start, end = load(cert).not_valid_before_utc, load(cert).not_valid_after_utc
    third = (end - start) / 3
    assert not needs_renewal(cert, now=end - third - timedelta(minutes=1))
    assert needs_renewal(cert, now=end - third)
    assert needs_renewal(cert, RenewBefore.parse("30d"), now=end - timedelta(days=29))
    assert not needs_renewal(cert, RenewBefore.parse("30d"), now=end - timedelta(days=31))
    assert needs_renewal(cert, RenewBefore.parse("10%"), now=end - third) is False  # 10% of 365 days is 36.5 days


@pytest.mark.parametrize("text, window", [
    ("33%", RenewBefore(fraction=0.33)), ("50.5%", RenewBefore(fraction=0.505)), ("30d", RenewBefore(period=timedelta(days=30))),
    ("720h", RenewBefore(period=timedelta(hours=720))), ("90m", RenewBefore(period=timedelta(minutes=90))),
])
def test_renewal_windows_parse(text, window):
    assert RenewBefore.parse(text) == window


@pytest.mark.parametrize("text", ["0%", "100%", "150%"])
def test_renewal_fractions_outside_the_lifetime_are_refused(text):
    with pytest.raises(ValueError, match=r"^a renewal fraction must be between 0 and 1 \(exclusive\), got "):
        RenewBefore.parse(text)


@pytest.mark.parametrize("text", ["-5%", "30", "30s", "1w", "", "d"])
def test_renewal_windows_in_other_units_are_refused(text):
    with pytest.raises(ValueError, match=r"^expected a percentage of the lifetime \(33%\) or a time \(30d, 720h, 90m\), got '"):
        RenewBefore.parse(text)


def test_renewal_keeps_the_ca_and_replaces_the_serving_cert(tmp_path):
    ensure_certs(tmp_path)
    old = load_bundle(tmp_path)
    expiry = load(old.cert).not_valid_after_utc
    assert not needs_renewal(old.cert, timedelta(days=30), now=expiry - timedelta(days=31))
    assert needs_renewal(old.cert, timedelta(days=30), now=expiry - timedelta(days=29))
    assert needs_renewal(old.cert, timedelta(days=0), now=expiry)
    later = datetime.now(UTC) + timedelta(days=340)
    assert needs_renewal(old.cert, now=later)
    assert ensure_certs(tmp_path, now=later).created
    new = load_bundle(tmp_path)
    assert new.ca_cert == old.ca_cert and new.ca_key == old.ca_key
    assert new.cert != old.cert and new.key != old.key
    assert load(new.cert).not_valid_before_utc > later - timedelta(minutes=10)
    verify_signed_by(load(new.cert), load(new.ca_cert))


def test_a_cert_missing_a_san_is_reissued_under_the_same_ca(tmp_path):
    ensure_certs(tmp_path, service="other")
    ca_before = (tmp_path / "ca.crt").read_bytes()
    assert ensure_certs(tmp_path).created
    assert cert_covers((tmp_path / "tls.crt").read_bytes(), SANS, [])
    assert (tmp_path / "ca.crt").read_bytes() == ca_before


def test_the_ca_is_reused_when_the_serving_files_are_gone(tmp_path):
    ensure_certs(tmp_path)
    ca_files = {n: (tmp_path / n).read_bytes() for n in ("ca.crt", "ca.key")}
    ca_mtime = (tmp_path / "ca.crt").stat().st_mtime_ns
    (tmp_path / "tls.crt").unlink()
    (tmp_path / "tls.key").unlink()
    assert ensure_certs(tmp_path).created
    assert {n: (tmp_path / n).read_bytes() for n in ca_files} == ca_files
    assert (tmp_path / "ca.crt").stat().st_mtime_ns == ca_mtime, "an unchanged file is not rewritten"
    verify_signed_by(load((tmp_path / "tls.crt").read_bytes()), load(ca_files["ca.crt"]))


def test_a_cert_not_signed_by_ca_crt_is_reissued(tmp_path):
    ensure_certs(tmp_path)
    ca_pem = (tmp_path / "ca.crt").read_bytes()
    foreign_ca, foreign_key = generate_ca("someone-else")
    cert, key = generate_serving_cert(foreign_ca, foreign_key, *default_sans())
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    assert ensure_certs(tmp_path).created
    assert (tmp_path / "ca.crt").read_bytes() == ca_pem
    verify_signed_by(load((tmp_path / "tls.crt").read_bytes()), load(ca_pem))


def test_a_ca_expiring_or_with_the_wrong_key_is_replaced(tmp_path):
    ensure_certs(tmp_path)
    first_ca = (tmp_path / "ca.crt").read_bytes()
    (tmp_path / "ca.key").write_bytes(generate_ca()[1])  # not ca.crt's key: cannot sign for it
    (tmp_path / "tls.crt").unlink()
    assert ensure_certs(tmp_path).created
    second_ca = (tmp_path / "ca.crt").read_bytes()
    assert second_ca != first_ca
    verify_signed_by(load((tmp_path / "tls.crt").read_bytes()), load(second_ca))
    # A CA due for renewal is replaced along with the serving certificate.
    assert ensure_certs(tmp_path, policy=Policy(ca_renew_before=timedelta(days=3650))).created
    assert (tmp_path / "ca.crt").read_bytes() != second_ca


def test_garbage_files_are_replaced_without_leaking_them(tmp_path):
    for name in FILES:
        (tmp_path / name).write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    assert ensure_certs(tmp_path).created
    bundle = load_bundle(tmp_path)
    assert bundle_is_good(bundle, *default_sans())
    assert "<unreadable>" in repr(CertBundle(b"junk", b"junk", b"junk"))


def test_a_bundle_issued_elsewhere_is_kept_while_valid(tmp_path):
    """cert-manager's Secret has no ca.key and its own names: serve it, do not reissue it."""
    ca_pem, ca_key = generate_ca("cert-manager")
    cert, key = generate_serving_cert(ca_pem, ca_key, ["hook.elsewhere.svc"], [])
    for name, data in (("ca.crt", ca_pem), ("tls.crt", cert), ("tls.key", key)):
        (tmp_path / name).write_bytes(data)
    before = snapshot(tmp_path)
    assert not ensure_certs(tmp_path).created
    assert snapshot(tmp_path) == before


def test_a_mounted_bundle_due_for_renewal_or_mid_rotation_is_served_not_rewritten(tmp_path, caplog):
    """The serving Secret as the certs CronJob leaves it: no ca.key, and during a CA rotation a
    ca.crt of two CAs with the certificate signed by the second. It is mounted read-only: a webhook
    that tried to renew it would not start, so it is kept — due or not — while it is valid at all."""
    old_ca, _ = generate_ca("old")
    new_ca, new_key = generate_ca("new")
    cert, key = generate_serving_cert(new_ca, new_key, *default_sans())
    for name, data in (("ca.crt", old_ca + new_ca), ("tls.crt", cert), ("tls.key", key)):
        (tmp_path / name).write_bytes(data)
    tmp_path.chmod(0o555)  # as a Secret volume: any write would fail
    try:
        before = snapshot(tmp_path)
        assert not ensure_certs(tmp_path).created
        expiry = load(cert).not_valid_after_utc
        assert not ensure_certs(tmp_path, now=expiry - timedelta(days=1)).created
        assert snapshot(tmp_path) == before
        assert "due for renewal" in caplog.text
        # Expired, it cannot be served: a new bundle is due, and the read-only mount refuses it.
        if os.geteuid() != 0:  # root writes through mode 0555
            with pytest.raises(PermissionError, match=re.escape(str(tmp_path))):
                ensure_certs(tmp_path, now=expiry + timedelta(days=1))
    finally:
        tmp_path.chmod(0o755)
    assert ensure_certs(tmp_path, now=expiry + timedelta(days=1)).created


def test_bundle_repr_hides_keys(tmp_path):
    ensure_certs(tmp_path)
    bundle = load_bundle(tmp_path)
    assert isinstance(bundle, CertBundle)
    for text in (repr(bundle), str(bundle), f"{bundle}", repr([bundle])):
        assert "PRIVATE" not in text and "redacted" in text
        for key in (bundle.key, bundle.ca_key):
            body = b"".join(key.splitlines()[1:-1]).decode()
            assert body[:24] not in text


def test_errors_do_not_quote_key_material():
    _, key = generate_ca()
    body = key.splitlines()[1].decode()
    with pytest.raises(ValueError) as raised:
        needs_renewal(key)
    assert body not in str(raised.value) and "PRIVATE" not in str(raised.value)


def test_certs_command_local(tmp_path, capsys):
    assert main(["certs", "--certs-dir", str(tmp_path)]) == 0
    assert main(["certs", "--certs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("created: ") and out[1].startswith("kept: ")


def test_certs_secret_and_patch_run_twice_create_once_then_change_nothing(certs_cluster, tmp_path, capsys):
    kubeconfig = certs_cluster.kubeconfig(str(tmp_path / "kubeconfig"))
    argv = ["certs", "--secret", "volcano-job-webhook/volcano-job-webhook-tls", "--ca-secret", "volcano-job-webhook-ca",
            "--patch-webhook", "volcano-job-webhook", "--kubeconfig", kubeconfig]
    certs_cluster.clear_requests()
    assert main(argv) == 0
    first = capsys.readouterr().out
    writes_first = [r for r in certs_cluster.requests if r.verb in ("create", "update", "patch")]
    # The CA's key is stored first, the webhooks trust the CA next, the served certificate comes last.
    assert [(r.verb, r.resource) for r in writes_first] == [
        ("create", "secrets"), ("patch", "mutatingwebhookconfigurations"), ("patch", "validatingwebhookconfigurations"),
        ("create", "secrets")]
    secret = certs_cluster.get_object("secrets", "volcano-job-webhook-tls", "volcano-job-webhook")
    assert secret["type"] == "kubernetes.io/tls"
    assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"], "no CA key in the Secret the webhook mounts"
    ca_secret = certs_cluster.get_object("secrets", "volcano-job-webhook-ca", "volcano-job-webhook")
    assert sorted(ca_secret["data"]) == ["ca.crt", "ca.key"]
    assert ca_secret["data"]["ca.crt"] == secret["data"]["ca.crt"]
    assert "app.kubernetes.io/managed-by" not in ca_secret["metadata"].get("labels", {}), "kept out of the reconciler's Secret cache"
    ca = secret["data"]["ca.crt"]
    for resource in ("mutatingwebhookconfigurations.admissionregistration.k8s.io", "validatingwebhookconfigurations.admissionregistration.k8s.io"):
        assert certs_cluster.get_object(resource, "volcano-job-webhook")["webhooks"][0]["clientConfig"]["caBundle"] == ca
    certs_cluster.clear_requests()
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert [r for r in certs_cluster.requests if r.verb in ("create", "update", "patch")] == []
    assert "written" in first
    assert second.splitlines() == ["Secret volcano-job-webhook/volcano-job-webhook-tls: unchanged",
                                   "Secret volcano-job-webhook/volcano-job-webhook-ca: unchanged",
                                   "caBundle of volcano-job-webhook: unchanged"]
    assert certs_cluster.get_object("secrets", "volcano-job-webhook-tls", "volcano-job-webhook")["data"] == secret["data"]


def test_certs_renews_a_secret_close_to_expiry_and_keeps_its_ca(certs_cluster):
    api = certs_cluster.api_client()
    args = (api, "volcano-job-webhook", "tls", "ca", "volcano-job-webhook", "volcano-job-webhook")
    first = sync(*args, webhook="volcano-job-webhook")
    assert first.serving_written and first.ca_written and len(first.patched) == 2
    bundle = first.outcome.serving
    ca = first.outcome.authority.current
    secret = certs_cluster.get_object("secrets", "tls", "volcano-job-webhook")
    # Put an old certificate in the Secret (issued 360 days ago: 5 days left).
    old_cert, old_key = generate_serving_cert(ca.cert, ca.key, ["x"], [], now=datetime.now(UTC) - timedelta(days=360))
    secret["data"]["tls.crt"] = base64.b64encode(old_cert).decode()
    secret["data"]["tls.key"] = base64.b64encode(old_key).decode()
    certs_cluster.put_object(secret)
    renewed = sync(*args, webhook="volcano-job-webhook")
    assert renewed.serving_written and not renewed.ca_written and renewed.patched == []
    assert renewed.outcome.serving.ca_cert == bundle.ca_cert and renewed.outcome.serving.cert != old_cert
    again = sync(*args, webhook="volcano-job-webhook")
    assert not (again.serving_written or again.ca_written or again.patched)


def test_certs_fails_clearly_before_the_webhook_configuration_exists(tmp_path, capsys):
    with FakeApiServer() as server:
        kubeconfig = server.kubeconfig(str(tmp_path / "kubeconfig"))
        code = main(["certs", "--secret", "default/tls", "--patch-webhook", "absent", "--kubeconfig", kubeconfig])
    assert code == 2
    assert "no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named 'absent' (yet)" in capsys.readouterr().err
