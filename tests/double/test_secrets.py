"""Key material never reaches logs, metrics, admission answers, error messages or exceptions. Why the
API double: the reconciler's failed writes are injected 500s (fault injection)."""

from __future__ import annotations

import base64
import json
import logging
import time

import pytest
import yaml
from kubernetes import client
from prometheus_client import generate_latest

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.envtest import wait_until
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.builtin.ssh import generate_key_pair
from volcano_job_webhook.reconciler import Reconciler
from volcano_job_webhook.server.admission import admission_review

pytestmark = pytest.mark.anyio


def fragments(secret_values: list[bytes]) -> list[str]:
    """Pieces that would give a key away, in every encoding it could appear in."""
    out = []
    for value in secret_values:
        text = value.decode()
        body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
        out += [body[10:50], text.split()[1][20:60] if text.startswith("ssh-rsa") else body[100:140]]
        out.append(base64.b64encode(value).decode()[20:60])
    return [f for f in out if f]


def assert_clean(haystack: str, secret_values: list[bytes]) -> None:
    assert "PRIVATE KEY" not in haystack
    for fragment in fragments(secret_values):
        assert fragment not in haystack


def test_reconciler_logs_and_metrics_hold_no_key(caplog):
    caplog.set_level(logging.DEBUG)
    with FakeApiServer() as server:
        job = yaml.safe_load((EXAMPLES / "jobs" / "mpi-job.yaml").read_text())
        client.CustomObjectsApi(server.api_client()).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", job)
        server.fail_next(2, status=500, method="POST", path_contains="/secrets")
        rec = Reconciler(server.api_client(), WebhookSettings(resync_seconds=0.2, workloads=[]), Chain())
        rec.start()
        wait_until(lambda: server.objects("secrets"), 10, "the Secret", interval=0.05)
        time.sleep(0.3)
        rec.stop()
        secret = server.objects("secrets")[0]
        keys = [base64.b64decode(secret["data"][k]) for k in ("id_rsa", "id_rsa.pub")]
        haystack = caplog.text + generate_latest(rec.metrics.registry).decode()
    assert "created Secret default/mpi-demo-ssh" in caplog.text
    assert_clean(haystack, keys)


async def test_webhook_answers_logs_and_errors_hold_no_user_key(client, jobs_dir, caplog):
    caplog.set_level(logging.DEBUG)
    pair = generate_key_pair()
    private, public = pair.private_pem.decode(), pair.public_openssh.decode()
    job = yaml.safe_load((EXAMPLES / "jobs" / "ssh-job.yaml").read_text())
    job["spec"]["plugins"]["ssh"] = [f"--ssh-private-key={private}", f"--ssh-public-key={public}"]
    (jobs_dir / "ssh-job.yaml").write_text(yaml.safe_dump(job))
    broken = json.loads(json.dumps(job))
    broken["metadata"]["name"] = "ssh-broken"
    # A key pasted as its own list element: the parse fails and the message must not quote it.
    broken["spec"]["plugins"]["ssh"] = ["--ssh-private-key=", private]
    (jobs_dir / "ssh-broken.yaml").write_text(yaml.safe_dump(broken))

    from volcano_job_webhook.plugins import Job
    from volcano_job_webhook.plugins.podgen import make_pod

    answers = []
    for obj in (job, broken):
        pod = make_pod(Job.from_object(obj), "node", 0)
        answers.append((await client.post("/mutate", json=admission_review(pod, uid="s"))).text)
        answers.append((await client.post("/validate", json=admission_review(obj, uid="v"))).text)
    assert '"allowed":false' in answers[2] and f"argument '-----BEGIN RSA P…' ({len(private)} characters): bad flag syntax" in answers[2]
    metrics = (await client.get("/metrics")).text
    assert_clean("\n".join(answers) + caplog.text + metrics, [pair.private_pem])


def test_key_pair_repr_is_redacted():
    pair = generate_key_pair()
    assert repr(pair) == "KeyPair(<redacted>)" and "PRIVATE" not in str(pair)
