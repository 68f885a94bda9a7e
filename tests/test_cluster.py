"""The cluster fixtures themselves (tests/cluster.py): the product's webhook registered the same way on
both backends is called for the Pods Volcano's controller creates, and no more once unregistered.
Why the API double: the emulated backend runs on it (coverage without the real parts), and its
record of webhook calls shows each call and none after."""

from __future__ import annotations

from pathlib import Path

from tests.cluster import VolcanoCluster, crds_dir, names, product_webhook, real_missing
from tests.jobs import scheduled_job
from tests.test_volcano_controller import JOB, PLUGINS, PODS, plugin_objects


def test_the_registered_product_webhook_sees_every_pod_volcano_creates(cluster: VolcanoCluster, tmp_path: Path) -> None:
    with product_webhook(cluster, tmp_path) as webhook:
        configurations = cluster.register_webhooks(webhook.base_url, webhook.ca_bundle)
        assert {c["kind"] for c in configurations} == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
        cluster.create(scheduled_job(JOB, plugins=PLUGINS))
        cluster.wait(lambda: all(plugin_objects(cluster).values()), "Volcano's plugin objects")
        cluster.inqueue(JOB)
        cluster.wait(lambda: names(cluster.pods(JOB)) == PODS, "the Pods, admitted")
        if cluster.api is not None:
            calls = [(c.webhook, c.resource, c.name, c.allowed, c.error) for c in cluster.api.webhook_calls]
            assert calls == [("jobs.volcano-job-webhook.io", "jobs", JOB, True, None)] + [
                ("pods.volcano-job-webhook.io", "pods", pod, True, None) for pod in sorted(PODS, key=lambda p: ("worker" in p, p))]
        cluster.unregister_webhooks()
        if cluster.api is not None:
            before = len(cluster.api.webhook_calls)
            cluster.create(scheduled_job("after", plugins=PLUGINS))
            cluster.inqueue("after")
            cluster.wait(lambda: len(cluster.pods("after")) == 3, "the Pods of a Job created after")
            assert len(cluster.api.webhook_calls) == before


def test_what_the_real_backend_lacks_is_named() -> None:
    missing = real_missing({})
    assert missing is not None and "VOLCANO_CONTROLLER" in missing and "KUBEBUILDER_ASSETS" in missing
    assert ("VOLCANO_CRDS" in missing) == (crds_dir({}) is None)
