"""The cluster fixtures themselves (tests/helpers/cluster.py): the product's webhook, registered, is called
for the Pods Volcano's controller creates, and no more once unregistered (its own /metrics count
the calls)."""

from __future__ import annotations

from pathlib import Path

from tests.apiserver.test_volcano_controller import JOB, PLUGINS, PODS, plugin_objects
from tests.helpers.cluster import VolcanoCluster, crds_dir, names, product_webhook, real_missing, total
from tests.helpers.jobs import scheduled_job

MUTATE, VALIDATE = (f'volcano_webhook_admission_requests_total{{endpoint="{e}"' for e in ("mutate", "validate"))


def test_the_registered_product_webhook_sees_every_pod_volcano_creates(cluster: VolcanoCluster, tmp_path: Path) -> None:
    with product_webhook(cluster, tmp_path) as webhook:
        configurations = cluster.register_webhooks(webhook.base_url, webhook.ca_bundle)
        assert {c["kind"] for c in configurations} == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
        before = total(webhook.base_url, MUTATE), total(webhook.base_url, VALIDATE)
        cluster.create(scheduled_job(JOB, plugins=PLUGINS))
        cluster.wait(lambda: all(plugin_objects(cluster).values()), "Volcano's plugin objects")
        cluster.inqueue(JOB)
        cluster.wait(lambda: names(cluster.pods(JOB)) == PODS, "the Pods, admitted")
        assert total(webhook.base_url, MUTATE) - before[0] == len(PODS)
        assert total(webhook.base_url, VALIDATE) > before[1], "the Job went through /validate"
        cluster.unregister_webhooks()
        before = total(webhook.base_url, MUTATE), total(webhook.base_url, VALIDATE)
        cluster.create(scheduled_job("after", plugins=PLUGINS))
        cluster.inqueue("after")
        cluster.wait(lambda: len(cluster.pods("after")) == 3, "the Pods of a Job created after")
        assert (total(webhook.base_url, MUTATE), total(webhook.base_url, VALIDATE)) == before


def test_what_the_real_backend_lacks_is_named() -> None:
    missing = real_missing({})
    assert missing is not None and "VOLCANO_CONTROLLER" in missing and "KUBEBUILDER_ASSETS" in missing
    assert ("VOLCANO_CRDS" in missing) == (crds_dir({}) is None)
