"""Certificates: files on disk, and the cluster Secret plus caBundle (against the API double)."""

from __future__ import annotations

import base64
import os
import stat
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from kubernetes import client

from tests.apiserver import FakeApiServer
from webhook.certs import CertBundle, cert_covers, ensure_certs, issue_bundle, load_bundle, needs_renewal
from webhook.certs_cmd import patch_webhooks, sync_secret
from webhook.cli import main

SANS = ["localhost", "volcano-job-webhook.volcano-job-webhook.svc", "volcano-job-webhook.volcano-job-webhook.svc.cluster.local"]


def test_ensure_certs_creates_a_signed_cert_with_the_sans_and_private_keys_0600(tmp_path):
    paths = ensure_certs(tmp_path / "certs")
    assert paths.created
    cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert cert_covers(paths.cert.read_bytes(), SANS, ["127.0.0.1"])
    for name, mode in (("tls.key", 0o600), ("ca.key", 0o600), ("tls.crt", 0o644), ("ca.crt", 0o644)):
        assert stat.S_IMODE(os.stat(tmp_path / "certs" / name).st_mode) == mode, name


def test_ensure_certs_is_idempotent(tmp_path):
    ensure_certs(tmp_path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert not ensure_certs(tmp_path).created
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before


def test_renewal_keeps_the_ca_and_replaces_the_serving_cert(tmp_path):
    ensure_certs(tmp_path)
    old = load_bundle(tmp_path)
    later = datetime.now(timezone.utc) + timedelta(days=340)
    assert needs_renewal(old.cert, now=later)
    assert ensure_certs(tmp_path, now=later).created
    new = load_bundle(tmp_path)
    assert new.ca_cert == old.ca_cert and new.cert != old.cert and new.key != old.key


def test_a_cert_missing_a_san_is_reissued(tmp_path):
    ensure_certs(tmp_path, service="other")
    assert ensure_certs(tmp_path).created
    assert cert_covers((tmp_path / "tls.crt").read_bytes(), SANS, [])


def test_bundle_repr_hides_keys(tmp_path):
    bundle, _ = issue_bundle(None, SANS, [])
    assert "PRIVATE" not in repr(bundle) and "redacted" in repr(bundle)
    assert isinstance(bundle, CertBundle)


def test_certs_command_local(tmp_path, capsys):
    assert main(["certs", "--certs-dir", str(tmp_path)]) == 0
    assert main(["certs", "--certs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("created: ") and out[1].startswith("kept: ")


@pytest.fixture
def cluster():
    with FakeApiServer() as server:
        api = server.api_client()
        admission = client.AdmissionregistrationV1Api(api)
        hook = {"name": "pods.volcano-job-webhook.io", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": "volcano-job-webhook", "name": "volcano-job-webhook", "path": "/mutate"}}}
        admission.create_mutating_webhook_configuration({"metadata": {"name": "volcano-job-webhook"}, "webhooks": [hook]})
        admission.create_validating_webhook_configuration(
            {"metadata": {"name": "volcano-job-webhook"}, "webhooks": [{**hook, "name": "jobs.volcano-job-webhook.io"}]})
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "volcano-job-webhook"}})
        yield server


def test_certs_secret_and_patch_run_twice_create_once_then_change_nothing(cluster, tmp_path, capsys):
    kubeconfig = cluster.kubeconfig(str(tmp_path / "kubeconfig"))
    argv = ["certs", "--secret", "volcano-job-webhook/volcano-job-webhook-tls", "--patch-webhook", "volcano-job-webhook",
            "--kubeconfig", kubeconfig]
    cluster.clear_requests()
    assert main(argv) == 0
    first = capsys.readouterr().out
    writes_first = [r for r in cluster.requests if r.verb in ("create", "update", "patch")]
    assert [(r.verb, r.resource) for r in writes_first] == [
        ("create", "secrets"), ("patch", "mutatingwebhookconfigurations"), ("patch", "validatingwebhookconfigurations")]
    secret = cluster.get_object("secrets", "volcano-job-webhook-tls", "volcano-job-webhook")
    assert secret["type"] == "kubernetes.io/tls"
    ca = secret["data"]["ca.crt"]
    for resource in ("mutatingwebhookconfigurations.admissionregistration.k8s.io", "validatingwebhookconfigurations.admissionregistration.k8s.io"):
        assert cluster.get_object(resource, "volcano-job-webhook")["webhooks"][0]["clientConfig"]["caBundle"] == ca
    cluster.clear_requests()
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert [r for r in cluster.requests if r.verb in ("create", "update", "patch")] == []
    assert "written" in first and "unchanged" in second.splitlines()[0] and second.splitlines()[1].endswith("unchanged")
    assert cluster.get_object("secrets", "volcano-job-webhook-tls", "volcano-job-webhook")["data"] == secret["data"]


def test_certs_renews_a_secret_close_to_expiry_and_keeps_its_ca(cluster):
    api = cluster.api_client()
    bundle, written = sync_secret(api, "volcano-job-webhook", "tls", "volcano-job-webhook", "volcano-job-webhook")
    assert written
    secret = cluster.get_object("secrets", "tls", "volcano-job-webhook")
    # Put an old certificate in the Secret (issued 360 days ago: 5 days left).
    old, _ = issue_bundle(CertBundle(bundle.ca_cert, bundle.cert, bundle.key, bundle.ca_key), ["x"], [],
                          now=datetime.now(timezone.utc) - timedelta(days=360))
    secret["data"]["tls.crt"] = base64.b64encode(old.cert).decode()
    secret["data"]["tls.key"] = base64.b64encode(old.key).decode()
    cluster.put_object(secret)
    renewed, written = sync_secret(api, "volcano-job-webhook", "tls", "volcano-job-webhook", "volcano-job-webhook")
    assert written and renewed.ca_cert == bundle.ca_cert and renewed.cert != old.cert
    assert patch_webhooks(api, "volcano-job-webhook", renewed.ca_cert) == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert patch_webhooks(api, "volcano-job-webhook", renewed.ca_cert) == []


def test_certs_fails_clearly_before_the_webhook_configuration_exists(tmp_path, capsys):
    with FakeApiServer() as server:
        kubeconfig = server.kubeconfig(str(tmp_path / "kubeconfig"))
        code = main(["certs", "--secret", "default/tls", "--patch-webhook", "absent", "--kubeconfig", kubeconfig])
    assert code == 2
    assert "no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named 'absent' (yet)" in capsys.readouterr().err
