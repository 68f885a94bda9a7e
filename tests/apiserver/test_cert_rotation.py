"""Renewal and CA rotation of the self-managed certificates: the decisions (``certs.rotation.plan``,
with an injected clock and lifetimes) and one run of ``certs --secret`` against a cluster: what is
written, in which order, and that a Secret of the old layout is migrated. Why the API double: its
request log says which calls a run made, in order (fault injection), over a whole CA rotation that
tests/apiserver/test_rbac.py, running install and renewal on kube-apiserver with the install's RBAC, does not
reach. Last, on kube-apiserver: ``serve`` following its Secret by a watch — each good pair served,
anything else skipped — and the time from a Secret's update to its certificate served
(docs/benchmarks.md)."""

from __future__ import annotations

import base64
import itertools
import logging
import socket
import ssl
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes_validate.utils import latest_version, major_minor

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.envtest import WEBHOOK_USER, EnvTest, create, delete, free_port, replace, start_product, wait_until
from tests.helpers.kustomize import build_variant
from tests.helpers.manifests_util import RECONCILER_SERVICE_ACCOUNT, Grant, rbac_grants
from tests.helpers.servers import in_thread
from volcano_job_webhook.certs.cluster import CertsError, patch_webhooks, read_webhooks, sync
from volcano_job_webhook.certs.issue import (
    CertBundle,
    Policy,
    RenewBefore,
    default_sans,
    generate_ca,
    generate_serving_cert,
    issuer_in,
    key_matches,
    split_pems,
)
from volcano_job_webhook.certs.reload import CertReloader
from volcano_job_webhook.certs.rotation import Authority, KeyPair, authority_from_serving, certificates_of, plan
from volcano_job_webhook.certs.secret import ServingSecret
from volcano_job_webhook.cli import main
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.server.https import build_server

DNS, IPS = default_sans()
T0 = datetime(2030, 1, 1, tzinfo=UTC)
# Short lives so a whole CA rotation fits in a few simulated weeks: a 30-day CA is due from day 20,
# a 9-day serving certificate from day 6.
SHORT = Policy(serving_days=9, ca_days=30, renew_before=RenewBefore(fraction=1 / 3), ca_renew_before=RenewBefore(fraction=1 / 3))


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def serial(pem: bytes) -> int:
    return load(pem).serial_number


def cas(bundle: bytes) -> list[int]:
    return [serial(pem) for pem in split_pems(bundle)]


def trusts(bundle: bytes, cert: bytes) -> bool:
    return issuer_in(cert, bundle) is not None


# The decisions ------------------------------------------------------------------------------------


def test_a_first_run_makes_a_ca_and_a_serving_certificate_and_no_ca_key_goes_to_the_serving_secret():
    out = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    assert out.authority.current is not None and out.authority.next is None and out.authority.retired == ()
    assert out.serving.ca_key is None
    assert out.serving.ca_cert == out.authority.current.cert
    assert issuer_in(out.serving.cert, out.authority.current.cert) is not None and key_matches(out.serving.cert, out.serving.key)
    assert load(out.serving.cert).not_valid_after_utc - T0 <= timedelta(days=9)
    assert [c.split(" (")[0] for c in out.changes] == ["made a new CA", "issued the serving certificate"]


def test_nothing_due_changes_nothing():
    first = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    for days in (1, 5):
        again = plan(first.authority, first.serving, DNS, IPS, published=certificates_of(first.serving.ca_cert), policy=SHORT,
                     now=T0 + timedelta(days=days))
        assert again.changes == ()
        assert again.authority == first.authority and again.serving == first.serving


def test_a_serving_certificate_in_its_last_third_is_renewed_under_the_same_ca():
    first = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    kept = plan(first.authority, first.serving, DNS, IPS, policy=SHORT, now=T0 + timedelta(days=5, hours=23))
    assert kept.serving.cert == first.serving.cert
    renewed = plan(first.authority, first.serving, DNS, IPS, policy=SHORT, now=T0 + timedelta(days=6, hours=1))
    assert renewed.serving.cert != first.serving.cert and renewed.serving.key != first.serving.key
    assert renewed.authority == first.authority and renewed.serving.ca_cert == first.serving.ca_cert
    assert load(renewed.serving.cert).not_valid_before_utc > T0 + timedelta(days=6)


def test_a_fixed_window_renews_that_long_before_expiry():
    policy = Policy(serving_days=9, ca_days=30, renew_before=RenewBefore.parse("2d"))
    first = plan(Authority(), None, DNS, IPS, policy=policy, now=T0)
    expiry = load(first.serving.cert).not_valid_after_utc
    assert plan(first.authority, first.serving, DNS, IPS, policy=policy, now=expiry - timedelta(days=2, minutes=1)).changes == ()
    assert plan(first.authority, first.serving, DNS, IPS, policy=policy, now=expiry - timedelta(days=2)).changes


def test_a_serving_certificate_missing_a_name_or_with_a_foreign_key_is_reissued():
    first = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    widened = plan(first.authority, first.serving, [*DNS, "extra.example"], IPS, policy=SHORT, now=T0)
    assert widened.serving.cert != first.serving.cert
    stranger = CertBundle(first.serving.ca_cert, first.serving.cert, generate_ca()[1])
    assert plan(first.authority, stranger, DNS, IPS, policy=SHORT, now=T0).serving.cert != first.serving.cert


def daily_runs(days: int, start: Any = None) -> list[dict[str, Any]]:
    """Run plan() once a day as the CronJob would, each run seeing what the last one published."""
    out = start or plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    runs = [{"day": 0, "outcome": out}]
    for day in range(1, days + 1):
        out = plan(out.authority, out.serving, DNS, IPS, published=certificates_of(out.serving.ca_cert), policy=SHORT,
                   now=T0 + timedelta(days=day))
        runs.append({"day": day, "outcome": out})
    return runs


def test_a_ca_rotation_announces_switches_and_retires_a_day_apart_and_no_client_ever_breaks():
    runs = daily_runs(70)
    steps = [(r["day"], c.split(" (")[0]) for r in runs[1:] for c in r["outcome"].changes if "CA" in c]
    # The first CA is due on day 20 (the last third of 30 days); its successor made that day is
    # due on day 40, and so on.
    assert steps[:3] == [(20, "announced the next CA"), (21, "switched to the next CA"), (22, "1 retired CA(s) left the trust bundle")]
    assert steps[3:6] == [(40, "announced the next CA"), (41, "switched to the next CA"), (42, "1 retired CA(s) left the trust bundle")]
    first_ca = runs[0]["outcome"].authority.current
    announced, switched, retired = (runs[d]["outcome"] for d in (20, 21, 22))
    assert cas(announced.serving.ca_cert) == [serial(first_ca.cert), serial(announced.authority.next.cert)]
    assert announced.serving.cert == runs[19]["outcome"].serving.cert, "announcing signs nothing"
    assert switched.serving.ca_cert == announced.serving.ca_cert, "switching does not change the bundle"
    assert switched.authority.current == announced.authority.next and switched.authority.retired == (first_ca.cert,)
    assert issuer_in(switched.serving.cert, switched.authority.current.cert) is not None
    assert cas(retired.serving.ca_cert) == [serial(switched.authority.current.cert)]
    for before, after in itertools.pairwise(runs):
        old, new = before["outcome"], after["outcome"]
        at = T0 + timedelta(days=after["day"])
        where = f"day {after['day']}"
        # Clients holding the bundle of the last run already trust the new certificate, and clients
        # holding the new bundle still trust the certificate Pods may serve until they reload.
        assert trusts(old.serving.ca_cert, new.serving.cert), where
        assert trusts(new.serving.ca_cert, old.serving.cert), where
        assert load(new.serving.cert).not_valid_after_utc > at, where
        assert load(new.authority.current.cert).not_valid_after_utc > at, where
        assert new.serving.ca_key is None
        assert len(split_pems(new.serving.ca_cert)) <= 2


def test_the_switch_waits_until_every_client_trusts_the_next_ca():
    runs = daily_runs(20)
    announced = runs[20]["outcome"]
    assert announced.authority.next is not None
    # The webhooks were never patched (say the patch failed): the next CA is not published.
    stale = certificates_of(runs[19]["outcome"].serving.ca_cert)
    for day in (21, 23):
        waiting = plan(announced.authority, announced.serving, DNS, IPS, published=stale, policy=SHORT, now=T0 + timedelta(days=day))
        assert waiting.authority == announced.authority and waiting.changes == ()
    published = certificates_of(announced.serving.ca_cert)
    switched = plan(announced.authority, announced.serving, DNS, IPS, published=published, policy=SHORT, now=T0 + timedelta(days=23))
    assert switched.authority.current == announced.authority.next


def test_the_switch_and_the_retirement_each_wait_for_the_overlap():
    runs = daily_runs(20)
    announced = runs[20]["outcome"]
    published = certificates_of(announced.serving.ca_cert)
    made = load(announced.authority.next.cert).not_valid_before_utc
    early = plan(announced.authority, announced.serving, DNS, IPS, published=published, policy=SHORT, now=made + timedelta(minutes=30))
    assert early.authority == announced.authority
    switched = plan(announced.authority, announced.serving, DNS, IPS, published=published, policy=SHORT, now=made + timedelta(hours=2))
    assert switched.authority.current == announced.authority.next
    issued = load(switched.serving.cert).not_valid_before_utc
    kept = plan(switched.authority, switched.serving, DNS, IPS, published=published, policy=SHORT, now=issued + timedelta(minutes=30))
    assert len(kept.authority.retired) == 1 and kept.changes == ()
    dropped = plan(switched.authority, switched.serving, DNS, IPS, published=published, policy=SHORT, now=issued + timedelta(hours=2))
    assert dropped.authority.retired == () and cas(dropped.serving.ca_cert) == [serial(switched.authority.current.cert)]


def test_even_without_an_overlap_a_ca_is_retired_only_after_the_run_that_replaced_its_certificate():
    policy = Policy(serving_days=9, ca_days=30, overlap=timedelta(0))
    runs = daily_runs(20)
    announced = runs[20]["outcome"]
    at = T0 + timedelta(days=20, minutes=1)
    switched = plan(announced.authority, announced.serving, DNS, IPS, published=certificates_of(announced.serving.ca_cert),
                    policy=policy, now=at)
    assert switched.authority.current == announced.authority.next
    assert trusts(switched.serving.ca_cert, announced.serving.cert), "Pods still serve the old certificate until they reload"


def test_a_lost_ca_is_replaced_and_the_old_one_stays_trusted_until_the_new_certificate_is_out():
    """The CA Secret was deleted: the serving Secret is all there is."""
    first = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    at = T0 + timedelta(days=2)
    found = authority_from_serving(first.serving, at)
    assert found.current is None and found.retired == (first.authority.current.cert,)
    recovered = plan(found, first.serving, DNS, IPS, published=certificates_of(first.serving.ca_cert), policy=SHORT, now=at)
    assert recovered.authority.current.cert != first.authority.current.cert
    assert trusts(recovered.serving.ca_cert, first.serving.cert) and trusts(recovered.serving.ca_cert, recovered.serving.cert)
    later = plan(recovered.authority, recovered.serving, DNS, IPS, policy=SHORT, now=at + timedelta(days=1))
    assert cas(later.serving.ca_cert) == [serial(recovered.authority.current.cert)]


def test_an_expired_ca_is_replaced_and_expired_cas_leave_the_bundle():
    first = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    at = T0 + timedelta(days=31)  # the cluster was off for a month: the CA and the certificate expired
    out = plan(first.authority, first.serving, DNS, IPS, policy=SHORT, now=at)
    assert out.authority.current.cert != first.authority.current.cert
    assert out.authority.retired == () and cas(out.serving.ca_cert) == [serial(out.authority.current.cert)]
    assert load(out.serving.cert).not_valid_before_utc <= at < load(out.serving.cert).not_valid_after_utc


def test_an_unusable_next_ca_is_dropped_and_a_usable_one_replaces_an_unusable_current():
    first = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    ca = first.authority.current
    broken = KeyPair(ca.cert, generate_ca()[1])  # not the certificate's key
    out = plan(Authority(current=ca, next=broken), first.serving, DNS, IPS, policy=SHORT, now=T0)
    assert out.authority.next is None and out.changes == ("dropped an unusable next CA",)
    spare = KeyPair(*generate_ca(days=30, now=T0))
    out = plan(Authority(current=broken, next=spare), first.serving, DNS, IPS, policy=SHORT, now=T0)
    assert out.authority.current == spare and out.authority.next is None
    assert trusts(out.serving.ca_cert, first.serving.cert), "the broken CA's certificate still vouches for what is served now"


def test_the_old_layout_is_read_as_the_current_ca_and_its_certificate_is_kept():
    ca_cert, ca_key = generate_ca(days=3650, now=T0)
    cert, key = generate_serving_cert(ca_cert, ca_key, DNS, IPS, now=T0)
    old = CertBundle(ca_cert, cert, key, ca_key)
    found = authority_from_serving(old, T0 + timedelta(days=1))
    assert found == Authority(current=KeyPair(ca_cert, ca_key))
    out = plan(found, old, DNS, IPS, published=certificates_of(ca_cert), now=T0 + timedelta(days=1))
    assert out.changes == () and out.serving == CertBundle(ca_cert, cert, key)


def test_authority_repr_shows_no_key():
    out = plan(Authority(), None, DNS, IPS, policy=SHORT, now=T0)
    text = repr(out.authority)
    assert "PRIVATE" not in text and "serial=" in text
    assert b"".join(out.authority.current.key.splitlines()[1:2]).decode() not in text


# Against a cluster --------------------------------------------------------------------------------

NS, TLS, CA = "volcano-job-webhook", "volcano-job-webhook-tls", "volcano-job-webhook-ca"
HOOK = "volcano-job-webhook"


def data(server: FakeApiServer, name: str) -> dict[str, bytes]:
    secret = server.get_object("secrets", name, NS)
    assert secret is not None, name
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def ca_bundles(server: FakeApiServer) -> list[bytes]:
    out = []
    for resource in ("mutatingwebhookconfigurations.admissionregistration.k8s.io", "validatingwebhookconfigurations.admissionregistration.k8s.io"):
        out += [base64.b64decode(h["clientConfig"]["caBundle"]) for h in server.get_object(resource, HOOK)["webhooks"]]
    return out


def writes(server: FakeApiServer) -> list[tuple[str, str, str | None]]:
    return [(r.verb, r.resource, r.name) for r in server.requests if r.verb in ("create", "update", "patch", "delete")]


def run_sync(server: FakeApiServer, day: float, policy: Policy = SHORT) -> Any:
    server.clear_requests()
    return sync(server.api_client(), NS, TLS, CA, "volcano-job-webhook", NS, webhook=HOOK, policy=policy, now=T0 + timedelta(days=day))


def test_a_ca_rotation_through_the_cluster(certs_cluster):
    run_sync(certs_cluster, 0)
    first_ca = data(certs_cluster, CA)["ca.crt"]
    assert ca_bundles(certs_cluster) == [first_ca] * 3 and data(certs_cluster, TLS)["ca.crt"] == first_ca

    run_sync(certs_cluster, 19.5)  # the serving certificate was renewed on the way; the CA is not due yet
    assert writes(certs_cluster) == [("update", "secrets", TLS)]

    run_sync(certs_cluster, 20)  # announce: the CA Secret gains the next CA, every client trusts both
    assert writes(certs_cluster) == [("update", "secrets", CA), ("patch", "mutatingwebhookconfigurations", HOOK),
                               ("patch", "validatingwebhookconfigurations", HOOK), ("update", "secrets", TLS)]
    ca_secret = data(certs_cluster, CA)
    assert sorted(ca_secret) == ["ca.crt", "ca.key", "next-ca.crt", "next-ca.key"]
    both = first_ca + ca_secret["next-ca.crt"]
    assert ca_bundles(certs_cluster) == [both] * 3 and data(certs_cluster, TLS)["ca.crt"] == both

    served = data(certs_cluster, TLS)["tls.crt"]
    run_sync(certs_cluster, 21)  # switch: the new CA signs, the old one is retired (its key is gone)
    assert writes(certs_cluster) == [("update", "secrets", CA), ("update", "secrets", TLS)]
    ca_secret = data(certs_cluster, CA)
    assert sorted(ca_secret) == ["ca.crt", "ca.key", "retired-ca.crt"] and ca_secret["retired-ca.crt"] == first_ca
    assert issuer_in(data(certs_cluster, TLS)["tls.crt"], ca_secret["ca.crt"]) is not None
    assert all(trusts(b, served) and trusts(b, data(certs_cluster, TLS)["tls.crt"]) for b in ca_bundles(certs_cluster))

    run_sync(certs_cluster, 22)  # retire
    assert writes(certs_cluster) == [("update", "secrets", CA), ("patch", "mutatingwebhookconfigurations", HOOK),
                               ("patch", "validatingwebhookconfigurations", HOOK), ("update", "secrets", TLS)]
    assert sorted(data(certs_cluster, CA)) == ["ca.crt", "ca.key"]
    assert ca_bundles(certs_cluster) == [data(certs_cluster, CA)["ca.crt"]] * 3

    run_sync(certs_cluster, 22.5)
    assert writes(certs_cluster) == []


def test_the_switch_waits_for_webhooks_that_missed_the_new_bundle(certs_cluster):
    run_sync(certs_cluster, 0)
    run_sync(certs_cluster, 20)
    both = data(certs_cluster, TLS)["ca.crt"]
    # Someone re-applied an old caBundle to the validating webhook (or our patch never landed).
    rest = Rest(certs_cluster.api_client())
    configs = read_webhooks(rest, HOOK)
    patch_webhooks(rest, [c for c in configs if c.kind == "ValidatingWebhookConfiguration"], split_pems(both)[0])
    run_sync(certs_cluster, 21)
    assert "next-ca.crt" in data(certs_cluster, CA), "not switched: one client does not trust the next CA yet"
    assert ca_bundles(certs_cluster) == [both] * 3, "but the bundle was put back"
    run_sync(certs_cluster, 22)
    assert "retired-ca.crt" in data(certs_cluster, CA)


def test_losing_both_secrets_keeps_the_old_ca_trusted_until_the_new_certificate_is_out(certs_cluster):
    run_sync(certs_cluster, 0)
    old_ca, old_cert = data(certs_cluster, CA)["ca.crt"], data(certs_cluster, TLS)["tls.crt"]
    for name in (TLS, CA):
        certs_cluster.delete_object("secrets", name, NS)
    run_sync(certs_cluster, 1)
    new_ca, new_cert = data(certs_cluster, CA)["ca.crt"], data(certs_cluster, TLS)["tls.crt"]
    assert new_ca != old_ca and data(certs_cluster, CA)["retired-ca.crt"] == old_ca
    # The webhooks were patched before the new certificate was written, and still trust the old one.
    assert writes(certs_cluster)[1:3] == [("patch", "mutatingwebhookconfigurations", HOOK), ("patch", "validatingwebhookconfigurations", HOOK)]
    assert all(trusts(b, old_cert) and trusts(b, new_cert) for b in ca_bundles(certs_cluster))
    run_sync(certs_cluster, 2)
    assert ca_bundles(certs_cluster) == [new_ca] * 3


def test_a_webhook_configuration_changed_since_it_was_read_is_not_overwritten(certs_cluster):
    api = certs_cluster.api_client()
    configs = read_webhooks(Rest(api), HOOK)
    admission = client.AdmissionregistrationV1Api(api)
    admission.patch_mutating_webhook_configuration(HOOK, {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as raised:
        patch_webhooks(Rest(api), configs, generate_ca()[0])
    assert raised.value.status == 422
    assert all("caBundle" not in h["clientConfig"]
               for h in certs_cluster.get_object("mutatingwebhookconfigurations.admissionregistration.k8s.io", HOOK)["webhooks"])


def old_layout_secret(now: datetime) -> tuple[dict[str, Any], CertBundle]:
    """A Secret as ``certs --secret`` wrote it before the CA Secret existed: ca.key inside."""
    ca_cert, ca_key = generate_ca(now=now)
    cert, key = generate_serving_cert(ca_cert, ca_key, DNS, IPS, now=now)
    body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": TLS, "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "volcano-job-webhook"}},
            "data": {k: base64.b64encode(v).decode() for k, v in
                     (("ca.crt", ca_cert), ("ca.key", ca_key), ("tls.crt", cert), ("tls.key", key))}}
    return body, CertBundle(ca_cert, cert, key, ca_key)


def test_a_secret_of_the_old_layout_is_migrated_by_the_command(certs_cluster, tmp_path, capsys):
    body, old = old_layout_secret(datetime.now(UTC) - timedelta(days=10))
    client.CoreV1Api(certs_cluster.api_client()).create_namespaced_secret(NS, body)
    rest = Rest(certs_cluster.api_client())
    patch_webhooks(rest, read_webhooks(rest, HOOK), old.ca_cert)  # as the old Job left it
    argv = ["certs", "--secret", f"{NS}/{TLS}", "--ca-secret", CA, "--patch-webhook", HOOK,
            "--kubeconfig", certs_cluster.kubeconfig(str(tmp_path / "kubeconfig"))]
    certs_cluster.clear_requests()
    assert main(argv) == 0
    # The key is stored in the CA Secret before it leaves the serving Secret.
    assert writes(certs_cluster) == [("create", "secrets", None), ("update", "secrets", TLS)]
    assert data(certs_cluster, CA) == {"ca.crt": old.ca_cert, "ca.key": old.ca_key}
    assert data(certs_cluster, TLS) == {"ca.crt": old.ca_cert, "tls.crt": old.cert, "tls.key": old.key}, "same certificate, no CA key"
    assert certs_cluster.get_object("secrets", TLS, NS)["metadata"]["labels"] == body["metadata"]["labels"]
    assert ca_bundles(certs_cluster) == [old.ca_cert] * 3
    capsys.readouterr()
    certs_cluster.clear_requests()
    assert main(argv) == 0
    assert writes(certs_cluster) == []


def test_an_old_layout_secret_with_an_expired_certificate_is_migrated_and_renewed(certs_cluster):
    body, old = old_layout_secret(T0 - timedelta(days=400))
    client.CoreV1Api(certs_cluster.api_client()).create_namespaced_secret(NS, body)
    result = run_sync(certs_cluster, 0, Policy())
    assert result.ca_written and result.serving_written
    assert data(certs_cluster, CA) == {"ca.crt": old.ca_cert, "ca.key": old.ca_key}, "the CA (ten years) is still good: kept"
    assert "ca.key" not in data(certs_cluster, TLS) and data(certs_cluster, TLS)["tls.crt"] != old.cert
    assert issuer_in(data(certs_cluster, TLS)["tls.crt"], old.ca_cert) is not None


def test_a_serving_secret_of_another_type_is_refused_before_anything_is_written(certs_cluster):
    client.CoreV1Api(certs_cluster.api_client()).create_namespaced_secret(NS, {"metadata": {"name": TLS}, "type": "Opaque", "data": {}})
    certs_cluster.clear_requests()
    with pytest.raises(CertsError, match=r"not kubernetes\.io/tls"):
        run_sync(certs_cluster, 0)
    assert writes(certs_cluster) == []


def test_the_command_takes_the_renewal_windows(certs_cluster, tmp_path, capsys):
    argv = ["certs", "--secret", f"{NS}/{TLS}", "--kubeconfig", certs_cluster.kubeconfig(str(tmp_path / "kubeconfig"))]
    assert main(argv) == 0
    capsys.readouterr()
    # 365 days left: renewed only when the window reaches back that far.
    assert main([*argv, "--renew-before", "300d"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [f"Secret {NS}/{TLS}: unchanged", f"Secret {NS}/{CA}: unchanged"]
    assert main([*argv, "--renew-before", "366d"]) == 0
    assert f"Secret {NS}/{TLS}: written" in capsys.readouterr().out
    assert main([*argv, "--ca-renew-before", "3651d"]) == 0
    out = capsys.readouterr().out
    assert "announced the next CA" in out and f"Secret {NS}/{CA}: written" in out
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--renew-before", "soon"])
    assert refused.value.code == 2 and "expected a percentage" in capsys.readouterr().err
    assert main([*argv, "--ca-secret", "other/ca"]) == 2
    assert main([*argv, "--ca-secret", TLS]) == 2


# What the certs Job may do ------------------------------------------------------------------------


def allowed(grants: list[Grant], record: Any) -> bool:
    """RBAC's rule: some grant names the verb, group and resource, covers the namespace (a
    ClusterRole's grant covers all), and either names no object or names this one (a create has no
    name, so only a grant without resourceNames allows it)."""
    return any(
        g.verb == record.verb and g.api_group == record.group and g.resource == record.resource
        and (g.namespace is None or g.namespace == record.namespace)
        and (not g.resource_names or record.name in g.resource_names)
        for g in grants
    )


def test_every_call_of_the_certificates_is_granted_by_name_and_every_grant_is_used(certs_cluster):
    """Install, renewal, a whole CA rotation and an old-layout migration, as the reconciler does them
    (no webhook patched: the registration carries ca.crt into the caBundle): each request must be
    allowed by the grants of the reconciler's identity in the install's namespace, as written
    (resourceNames included), and each of them must be needed by some request. (Its cluster-wide
    Secret rules, for SSH keys, would allow more; the split variant's Role is what says why.)
    tests/apiserver/test_rbac.py runs install and renewal as that identity on kube-apiserver in both layouts,
    held by verb and resource; the rotation, the migration and the Role's grants one by one by name
    are held only here."""
    grants = [g for g in rbac_grants(build_variant("split"), RECONCILER_SERVICE_ACCOUNT) if g.resource == "secrets" and g.namespace == NS]
    requests = []
    for day in (0, 7, 20, 21, 22, 23):
        certs_cluster.clear_requests()
        sync(certs_cluster.api_client(), NS, TLS, CA, "volcano-job-webhook", NS, policy=SHORT, now=T0 + timedelta(days=day))
        requests += certs_cluster.requests
    client.CoreV1Api(certs_cluster.api_client()).delete_namespaced_secret(CA, NS)
    client.CoreV1Api(certs_cluster.api_client()).delete_namespaced_secret(TLS, NS)
    client.CoreV1Api(certs_cluster.api_client()).create_namespaced_secret(NS, old_layout_secret(T0)[0])
    certs_cluster.clear_requests()
    sync(certs_cluster.api_client(), NS, TLS, CA, "volcano-job-webhook", NS, policy=SHORT, now=T0 + timedelta(days=24))
    requests += certs_cluster.requests
    assert [(r.verb, r.resource, r.name) for r in requests if not allowed(grants, r)] == []
    # list and watch of the serving Secret by name are the registration's (its caBundle), held by test_rbac.
    unused = [g for g in grants if g.verb not in ("list", "watch") and not any(allowed([g], r) for r in requests)]
    assert unused == []
    # The control: a request the Role does not name is refused by this check.
    assert not allowed(grants, type("R", (), {"verb": "get", "group": "", "resource": "secrets", "namespace": NS, "name": "other"})())


@pytest.mark.parametrize("version", ["1.30", major_minor(latest_version())])
def test_the_secrets_written_validate_against_the_kubernetes_schema(certs_cluster, version):
    run_sync(certs_cluster, 20)  # a CA Secret with every key
    for name in (TLS, CA):
        secret = certs_cluster.get_object("secrets", name, NS)
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Secret", **secret}, version, strict=True)
    bad = {"apiVersion": "v1", "kind": "Secret", **certs_cluster.get_object("secrets", TLS, NS), "typo": 1}
    with pytest.raises(kubernetes_validate.ValidationError, match="'typo' was unexpected"):
        kubernetes_validate.validate(bad, version, strict=True)


# serve following its Secret, on kube-apiserver -----------------------------------------------------


def tls_secret(namespace: str, ca: bytes, pair: tuple[bytes, bytes] | None, **data: bytes) -> dict[str, Any]:
    """Serving Secret ``TLS`` holding ``ca`` and ``pair`` (``data`` over them)."""
    files = {"ca.crt": ca, **({"tls.crt": pair[0], "tls.key": pair[1]} if pair else {}), **data}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": {"name": TLS, "namespace": namespace},
            "data": {k.replace("_", "."): base64.b64encode(v).decode() for k, v in files.items()}}


def issued(ca: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    return generate_serving_cert(*ca, ["localhost"], ["127.0.0.1"])


def served(port: int, ca: bytes) -> bytes | None:
    """The certificate (DER) a fresh TLS handshake with the server gets, checked against ``ca``; None
    while nothing listens. A failed handshake raises."""
    context = ssl.create_default_context(cadata=ca.decode())
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    except ConnectionRefusedError:
        return None
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        return tls.getpeercert(binary_form=True)


def der(pem: bytes) -> bytes:
    return load(pem).public_bytes(serialization.Encoding.DER)


def secret_requests(server: EnvTest, user: str, namespace: str, since: datetime) -> list[str]:
    return [e.verb for e in server.audit_events(user, since) if e.resource == "secrets" and e.namespace == namespace]


async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_serve_follows_its_secret_by_a_watch_and_serves_only_good_pairs(envtest, kube_admin, kube_namespace, caplog):
    """Before the Secret exists serve waits; then each complete, matching pair is served, and a
    mismatched pair, an empty key and a deleted Secret leave the last good one served.
    All through a list and a watch of the one Secret as the webhook's identity: no GET."""
    caplog.set_level(logging.INFO, logger="volcano_job_webhook.certs")
    ns, ca = kube_namespace, generate_ca()
    since = datetime.now(UTC)
    secret = ServingSecret(envtest.api_client(WEBHOOK_USER), ns, TLS)
    try:
        followed: list[CertReloader] = []  # a daemon thread: a failed test leaves no follow() blocking the exit
        threading.Thread(target=lambda: followed.append(secret.follow()), daemon=True).start()
        wait_until(lambda: secret.informer.synced, 10, "the first list")
        time.sleep(0.2)
        assert not followed, "nothing to serve yet"
        first, second = issued(ca), issued(ca)
        create(kube_admin, tls_secret(ns, ca[0], first))
        (reloader,) = wait_until(lambda: followed, 10, "follow() serving the Secret's first pair")
        server = build_server(answer, "127.0.0.1", 0, reloader, log_level="warning", lifespan="off")
        with in_thread(server):
            assert served(server.port, ca[0]) == der(first[0])
            for change, says in (
                (lambda: replace(kube_admin, tls_secret(ns, ca[0], (second[0], first[1]))), "not loaded (KEY_VALUES_MISMATCH)"),
                (lambda: replace(kube_admin, tls_secret(ns, ca[0], None, tls_crt=second[0], tls_key=b"")), "has no tls.crt or tls.key"),
                (lambda: delete(kube_admin, "v1", "Secret", TLS, ns), "deleted"),
            ):
                change()
                wait_until(lambda says=says: says in caplog.text, 10, says, interval=0.02)
                assert served(server.port, ca[0]) == der(first[0])
            create(kube_admin, tls_secret(ns, ca[0], second))
            wait_until(lambda: served(server.port, ca[0]) == der(second[0]), 10, "the new pair served", interval=0.02)
            assert sum(r.getMessage().startswith("reloaded TLS certificate") for r in caplog.records) == 1
    finally:
        secret.informer.stop()
    time.sleep(0.5)  # the audit log is written as requests complete
    assert set(secret_requests(envtest, WEBHOOK_USER, ns, since)) == {"list", "watch"}
    assert "PRIVATE KEY" not in caplog.text


ROTATIONS = 10


def test_a_renewed_secret_is_served_by_serve_within_a_second(envtest, kube_admin, kube_namespace, tmp_path):
    """The whole path: ``serve`` (certs_from_secret) running as the webhook's identity, its Secret
    renewed as the reconciler and cert-manager do it (one PUT of a new pair under the same CA),
    ROTATIONS times; each time, from just before the PUT to the first TLS handshake that gets the new
    certificate, every handshake checked against the CA. The figures are in docs/benchmarks.md; the
    files' poll that this replaced took up to 20 s (a GET every 10 s, a look at the files every 10 s)."""
    ns, ca = kube_namespace, generate_ca()
    pair = issued(ca)
    create(kube_admin, tls_secret(ns, ca[0], pair))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"certs_from_secret": True, "tls_secret": TLS, "service_namespace": ns}))
    port = free_port()
    since = datetime.now(UTC)
    process = start_product(["serve", "--host=127.0.0.1", f"--port={port}", f"--kubeconfig={envtest.kubeconfig(WEBHOOK_USER)}",
                             f"--config={config}", f"--certs-dir={tmp_path / 'certs'}"], tmp_path / "serve.log")
    took = []
    try:
        process.wait_for(lambda: served(port, ca[0]) == der(pair[0]), 30, "serve's first certificate")
        for _ in range(ROTATIONS):
            pair = issued(ca)
            want = der(pair[0])
            start = time.monotonic()
            replace(kube_admin, tls_secret(ns, ca[0], pair))
            process.wait_for(lambda want=want: served(port, ca[0]) == want, 5, "the renewed certificate served", interval=0.005)
            took.append(time.monotonic() - start)
    finally:
        process.stop()
    print(f"\nSecret update to its certificate served, {ROTATIONS} renewals: min {min(took) * 1000:.0f} ms, "
          f"median {statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms")
    assert max(took) < 1.0
    assert not (tmp_path / "certs").exists(), "no certificate file written"
    time.sleep(0.5)
    assert set(secret_requests(envtest, WEBHOOK_USER, ns, since)) == {"list", "watch"}, "no GET of the Secret"
