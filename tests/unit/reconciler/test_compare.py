"""What the reconciler decides from its cache alone: nothing, an apply, or fields to remove. The
live objects here are shaped as kube-apiserver v1.36 stores them (tests/apiserver/test_reconciler.py checks
the same decisions against a real one: a steady state sends nothing)."""

from __future__ import annotations

from tests.helpers.jobs import owner_reference
from volcano_job_webhook.reconciler.compare import (
    OUR_FIELDS,
    Changes,
    changes,
    covered,
    our_fields,
)

OWNER = owner_reference("j", "u1")
META = {"name": "j", "namespace": "ns", "labels": {"app.kubernetes.io/managed-by": "volcano-job-webhook"}, "ownerReferences": [OWNER]}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": META,
           "spec": {"clusterIP": "None", "selector": {"volcano.sh/job-name": "j"}, "publishNotReadyAddresses": False}}
# The POST's update entry: what the server defaulted is in it too.
POSTED = [{"manager": "volcano-job-webhook", "operation": "Update", "fieldsV1": {
    "f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {}}, "f:ownerReferences": {".": {}, 'k:{"uid":"u1"}': {}}},
    "f:spec": {"f:clusterIP": {}, "f:internalTrafficPolicy": {}, "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}},
}}]


def stored_service(**spec: object) -> dict:
    return {"metadata": {**META, "resourceVersion": "7", "uid": "s1"}, OUR_FIELDS: our_fields(POSTED, "volcano-job-webhook"),
            "spec": {"clusterIP": "None", "clusterIPs": ["None"], "internalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4"],
                     "ipFamilyPolicy": "SingleStack", "selector": {"volcano.sh/job-name": "j"}, "sessionAffinity": "None",
                     "type": "ClusterIP", **spec}}


def test_a_stored_object_with_defaults_and_dropped_zero_values_needs_nothing():
    assert changes(stored_service(), SERVICE) == Changes()


def test_drift_needs_an_apply():
    assert changes(stored_service(publishNotReadyAddresses=True), SERVICE) == Changes(apply=True)
    assert changes(stored_service(selector={"volcano.sh/job-name": "other"}), SERVICE).apply


def test_go_zero_values_cover_a_missing_field_and_nothing_else():
    assert covered(None, False) and covered(None, 0) and covered(None, "") and covered(None, []) and covered(None, {})
    assert covered({}, {"a": {"b": False}})
    assert not covered(None, True) and not covered({}, {"a": "x"}) and not covered(1, 0)


def test_another_owners_reference_is_not_drift_but_a_missing_one_of_ours_is():
    theirs = {**OWNER, "uid": "u2", "controller": False}
    assert covered([theirs, OWNER], [OWNER], ("metadata", "ownerReferences"))
    assert not covered([theirs], [OWNER], ("metadata", "ownerReferences"))
    # Elsewhere lists are atomic: an extra entry is drift.
    assert not covered(["Ingress", "Egress"], ["Ingress"], ("spec", "policyTypes"))


def test_an_atomic_map_with_a_key_added_needs_an_apply():
    # A Service's selector is one value to the API: an extra key someone added is drift (it would
    # select none of the job's Pods), though every key we set is there.
    live = stored_service(selector={"volcano.sh/job-name": "j", "extra": "x"})
    assert changes(live, SERVICE) == Changes(apply=True)
    assert covered({"labels": {"a": "1", "b": "2"}}, {"labels": {"a": "1"}}), "other maps: keys of others are theirs"


def test_data_keys_we_set_and_no_longer_want_are_removed_but_not_defaulted_fields():
    posted = [{"manager": "volcano-job-webhook", "operation": "Update", "fieldsV1": {
        "f:data": {".": {}, "f:a.host": {}, "f:b.host": {}}, "f:type": {}}}]
    live = {"metadata": META, "type": "Opaque", "data": {"a.host": "x", "b.host": "y", "note": "theirs"},
            OUR_FIELDS: our_fields(posted, "volcano-job-webhook")}
    desired = {"apiVersion": "v1", "kind": "Secret", "metadata": META, "data": {"a.host": "x"}}
    todo = changes(live, desired)
    assert todo == Changes(remove=(("data", "b.host"),))
    assert todo.removal_patch() == {"data": {"b.host": None}}


def test_our_fields_read_all_of_an_apply_entry_and_only_data_and_labels_of_an_update_entry():
    entries = [*POSTED, {"manager": "volcano-job-webhook", "operation": "Apply", "fieldsV1": {"f:spec": {"f:publishNotReadyAddresses": {}}}},
               {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:data": {"f:x": {}}}}]
    assert our_fields(entries, "volcano-job-webhook") == {
        ("metadata", "labels", "app.kubernetes.io/managed-by"), ("spec", "publishNotReadyAddresses")}
