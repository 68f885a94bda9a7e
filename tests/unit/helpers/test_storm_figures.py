"""The storm's arithmetic (tests/helpers/storm.py), alone: Prometheus's text read, counters' increase across an
API server restart, histogram quantiles as ``histogram_quantile`` computes them, percentiles of raw
latencies, rates, and the wiring a Pod is compared by."""

from __future__ import annotations

import math

import pytest

from tests.helpers.storm import (
    ADMISSION_HISTOGRAM,
    REJECTIONS,
    api_requests,
    buckets,
    histogram_quantile,
    increase,
    named,
    parse_metrics,
    peak_rate,
    percentile,
    plugin_set_of,
    rate,
    storm_job,
    task_and_index,
    windowed_quantiles,
    wiring,
)

EXPOSITION = """\
# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] Admission webhook latency
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.volcano-job-webhook.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 10
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.volcano-job-webhook.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 60
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.volcano-job-webhook.io",operation="CREATE",rejected="false",type="admit",le="0.1"} 90
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.volcano-job-webhook.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 100
apiserver_admission_webhook_admission_duration_seconds_sum{name="pods.volcano-job-webhook.io",operation="CREATE",rejected="false",type="admit"} 2.5
apiserver_admission_webhook_admission_duration_seconds_bucket{name="mutatepod.volcano.sh",operation="CREATE",rejected="false",type="admit",le="0.005"} 50
apiserver_admission_webhook_admission_duration_seconds_bucket{name="mutatepod.volcano.sh",operation="CREATE",rejected="false",type="admit",le="0.025"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="mutatepod.volcano.sh",operation="CREATE",rejected="false",type="admit",le="0.1"} 100
apiserver_admission_webhook_admission_duration_seconds_bucket{name="mutatepod.volcano.sh",operation="CREATE",rejected="false",type="admit",le="+Inf"} 100
apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",name="pods.volcano-job-webhook.io",operation="CREATE",rejection_code="0",type="admit"} 2
apiserver_request_total{code="200",verb="GET"} 5
something_with_a_timestamp{a="x \\"quoted\\""} 3 1700000000000
"""
OURS = named(["pods.volcano-job-webhook.io"])


def test_parse_metrics_reads_names_labels_and_values() -> None:
    samples = parse_metrics(EXPOSITION)
    key = (REJECTIONS, (("error_type", "calling_webhook_error"), ("name", "pods.volcano-job-webhook.io"), ("operation", "CREATE"),
                        ("rejection_code", "0"), ("type", "admit")))
    assert samples[key] == 2.0
    assert samples[("something_with_a_timestamp", (("a", 'x "quoted"'),))] == 3.0
    assert len(parse_metrics(EXPOSITION, ("apiserver_admission_webhook",))) == 10


def test_buckets_sum_the_series_of_a_webhook() -> None:
    samples = parse_metrics(EXPOSITION)
    assert buckets(samples, ADMISSION_HISTOGRAM, OURS) == {0.005: 10, 0.025: 60, 0.1: 90, math.inf: 100}
    both = buckets(samples, ADMISSION_HISTOGRAM, named(["pods.volcano-job-webhook.io", "mutatepod.volcano.sh"]))
    assert both == {0.005: 60, 0.025: 160, 0.1: 190, math.inf: 200}


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    cumulative = {0.005: 10.0, 0.025: 60.0, 0.1: 90.0, math.inf: 100.0}
    # rank 50 falls in (0.005, 0.025]: 0.005 + 0.02 * (50 - 10) / 50
    assert histogram_quantile(0.5, cumulative) == pytest.approx(0.021)
    # rank 5 in the first bucket: from 0
    assert histogram_quantile(0.05, cumulative) == pytest.approx(0.0025)
    # rank 99 in +Inf: the highest finite bound
    assert histogram_quantile(0.99, cumulative) == 0.1
    assert histogram_quantile(0.9, cumulative) == pytest.approx(0.1)
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None


def test_increase_across_a_restart_counts_from_zero() -> None:
    a = ("c", ())
    b = ("d", ())
    snapshots = [{a: 10.0}, {a: 15.0}, {a: 3.0, b: 4.0}, {a: 5.0, b: 4.0}]
    # 10 → 15 (+5), restart → 3 (+3), → 5 (+2); b appeared after the first snapshot: from zero
    assert increase(snapshots) == {a: 10.0, b: 4.0}
    assert increase([{a: 1.0}]) == {}
    assert increase([{}, {a: 3.0}]) == {a: 3.0}
    assert increase([]) == {}


def test_percentile_is_linear_between_ranks() -> None:
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile(range(101), 0.99) == pytest.approx(99)
    assert percentile([7], 0.99) == 7
    assert percentile([], 0.5) is None


def test_rates() -> None:
    assert rate([0.0, 1.0, 2.0, 3.0, 4.0]) == 1.0
    assert rate([5.0]) is None
    assert rate([1.0, 1.0]) is None
    assert peak_rate([0, 0.1, 0.2, 5, 20, 20.5, 21, 21.5, 22], window=2.0) == 2.0
    assert peak_rate([], window=1.0) == 0.0


def test_windowed_quantiles_take_each_window_alone() -> None:
    def snap(fast: float, slow: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        labels = (("name", "pods.volcano-job-webhook.io"),)
        return {(f"{ADMISSION_HISTOGRAM}_bucket", (*labels, ("le", "0.01"))): fast,
                (f"{ADMISSION_HISTOGRAM}_bucket", (*labels, ("le", "1"))): fast + slow,
                (f"{ADMISSION_HISTOGRAM}_bucket", (*labels, ("le", "+Inf"))): fast + slow}

    snapshots = [(0.0, snap(0, 0)), (5.0, snap(50, 0)), (10.0, snap(100, 0)), (15.0, snap(100, 50)), (20.0, snap(100, 100))]
    windows = windowed_quantiles(snapshots, ADMISSION_HISTOGRAM, OURS, 0.99, window=10.0)
    assert [(start, calls) for start, calls, _ in windows] == [(0.0, 100.0), (10.0, 100.0)]
    assert windows[0][2] == pytest.approx(0.0099)
    assert windows[1][2] == pytest.approx(0.99 * 1 + 0.01 * 0.01, rel=0.02)


def test_storm_jobs_land_on_hollow_nodes_with_their_plugin_set() -> None:
    job = storm_job("storm-00001", "torchrun", "ns")
    assert [t["replicas"] for t in job["spec"]["tasks"]] == [1, 7]
    assert job["spec"]["minAvailable"] == 8
    assert job["spec"]["plugins"] == {"svc": ["--publish-not-ready-addresses"]}
    assert "torchrun" in job["metadata"]["annotations"]["volcano-job-webhook/plugins"]
    spec = job["spec"]["tasks"][1]["template"]["spec"]
    assert spec["nodeSelector"] == {"vjw-storm/hollow": "true"}
    assert spec["tolerations"][0]["key"] == "vjw-storm/hollow"
    assert [plugin_set_of(i) for i in range(5)] == ["svc-env", "torchrun", "jax", "waitfor", "svc-env"]


def test_a_held_storm_job_holds_only_a_waitfor_masters_pod_in_init() -> None:
    held = storm_job("storm-00003", "waitfor", "ns", held=True)
    assert [c["name"] for c in held["spec"]["tasks"][0]["template"]["spec"]["initContainers"]] == ["held"]
    assert "initContainers" not in held["spec"]["tasks"][1]["template"]["spec"]
    assert "initContainers" not in storm_job("storm-00003", "waitfor", "ns")["spec"]["tasks"][0]["template"]["spec"]
    assert "initContainers" not in storm_job("storm-00001", "torchrun", "ns", held=True)["spec"]["tasks"][0]["template"]["spec"]


def test_task_and_index_of_a_volcano_pod_name() -> None:
    assert task_and_index("storm-00001-worker-6", "storm-00001") == ("worker", 6)
    assert task_and_index("a-b-master-0", "a-b") == ("master", 0)


def test_wiring_leaves_out_what_the_api_server_adds() -> None:
    made = {"spec": {"hostname": "j-worker-0", "subdomain": "j", "containers": [{
        "name": "c", "env": [{"name": "B", "value": "2"}, {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "volumeMounts": [{"name": "svc", "mountPath": "/etc/volcano"}]}], "volumes": [{"name": "svc", "configMap": {"name": "j-svc"}}]}}
    stored = {"spec": {"hostname": "j-worker-0", "subdomain": "j", "containers": [{
        "name": "c", "env": [{"name": "A", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                             {"name": "B", "value": "2"}],
        "volumeMounts": [{"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                         {"name": "svc", "mountPath": "/etc/volcano"}]}],
        "volumes": [{"name": "kube-api-access-x1", "projected": {}}, {"name": "svc", "configMap": {"name": "j-svc", "defaultMode": 420}}]}}
    assert wiring(made) == wiring(stored)
    stored["spec"]["containers"][0]["env"][1]["value"] = "3"
    assert wiring(made) != wiring(stored)


def test_api_requests_add_up_codes_and_clients_by_verb_and_resource_the_most_first() -> None:
    text = "\n".join([
        'apiserver_request_total{code="201",component="apiserver",resource="pods",subresource="",verb="POST"} 5',
        'apiserver_request_total{code="200",component="apiserver",resource="pods",subresource="status",verb="PATCH"} 7',
        'apiserver_request_total{code="409",component="apiserver",resource="pods",subresource="status",verb="PATCH"} 2',
        'apiserver_request_total{code="200",component="apiserver",resource="configmaps",verb="GET"} 1',
        'apiserver_request_total_other{resource="pods",verb="GET"} 100',
    ])
    before = parse_metrics(text.replace("} 5", "} 1").replace("} 7", "} 0"), ("apiserver_request_total",))
    after = parse_metrics(text, ("apiserver_request_total",))
    assert list(api_requests(increase([before, after])).items()) == [("PATCH pods status", 7.0), ("POST pods", 4.0)]
