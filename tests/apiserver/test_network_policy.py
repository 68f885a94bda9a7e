"""svc's NetworkPolicy flags of this project (docs/plugins.md#network-policy): what each shape of
policy admits, judged by an exact evaluator of the NetworkPolicy API (tests/helpers/network_policy.py, itself
checked on the API's documented cases first); that the real API server accepts every shape (server-
side dry run, then the stored object judged again); the label selectors the flags take; and what the
flags are where Volcano's controller runs svc (its flag error, never ours to refuse a Pod for)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.helpers import envtest
from tests.helpers.jobs import task, volcano_job
from tests.helpers.network_policy import Cluster, Pod, Source, selects
from volcano_job_webhook.cli import main
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.keys import JOB_NAME_KEY, JOB_NAMESPACE_KEY, TASK_SPEC_KEY, VOLCANO_PLUGINS
from volcano_job_webhook.plugins.selectors import parse_selector
from volcano_job_webhook.plugins.workloads import read_workload

ANNOTATION = "volcano-job-webhook/plugins"
CLUSTER_VIEW = WebhookSettings(volcano_controller_plugins=list(VOLCANO_PLUGINS)).chain(on_cluster=True)

# ---------------------------------------------------------------------------------------------
# The evaluator, on the API's own documented cases: it must be right before it judges ours.

NAMESPACES = {"ml": {"team": "ml"}, "monitoring": {}, "notebooks": {}, "observability": {}, "other": {"team": "web"}}
DB = Pod("ml", {"role": "db"}, (("postgres", 5432, "TCP"),))


def _policy(spec: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec}


def test_a_pod_no_policy_selects_admits_everything() -> None:
    cluster = Cluster(NAMESPACES, [_policy({"podSelector": {"matchLabels": {"role": "web"}}, "policyTypes": ["Ingress"]})])
    assert cluster.admits(Source("outside"), DB, 5432)
    assert Cluster(NAMESPACES, [_policy({"podSelector": {}}, namespace="other")]).admits(Source("outside"), DB, 5432)


def test_deny_all_and_allow_all() -> None:
    deny = _policy({"podSelector": {}, "policyTypes": ["Ingress"]})
    allow = _policy({"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]})
    anyone = Source("web", Pod("ml", {"role": "web"}))
    assert not Cluster(NAMESPACES, [deny]).admits(anyone, DB, 5432)
    assert Cluster(NAMESPACES, [deny, allow]).admits(anyone, DB, 5432)  # additive
    assert Cluster(NAMESPACES, [deny, allow]).admits(Source("outside"), DB, 1)


def test_policy_types() -> None:
    egress_only = _policy({"podSelector": {}, "policyTypes": ["Egress"]})
    assert Cluster(NAMESPACES, [egress_only]).admits(Source("outside"), DB, 5432)
    implied = _policy({"podSelector": {}, "egress": [{}]})  # no policyTypes: Ingress (and Egress)
    assert not Cluster(NAMESPACES, [implied]).admits(Source("outside"), DB, 5432)


def test_peers_are_or_and_selectors_in_one_peer_are_and() -> None:
    """The API documentation's own example: a namespace and a Pod selector in one element versus two."""
    ns = {"matchLabels": {"team": "web"}}
    pods = {"matchLabels": {"role": "client"}}
    both = _policy({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": ns, "podSelector": pods}]}]})
    either = _policy({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": ns}, {"podSelector": pods}]}]})
    client_in_web = Source("a", Pod("other", {"role": "client"}))
    server_in_web = Source("b", Pod("other", {"role": "server"}))
    client_in_ml = Source("c", Pod("ml", {"role": "client"}))
    client_in_monitoring = Source("d", Pod("monitoring", {"role": "client"}))
    assert [Cluster(NAMESPACES, [both]).admits(s, DB, 5432) for s in (client_in_web, server_in_web, client_in_ml, client_in_monitoring)] \
        == [True, False, False, False]
    assert [Cluster(NAMESPACES, [either]).admits(s, DB, 5432) for s in (client_in_web, server_in_web, client_in_ml, client_in_monitoring)] \
        == [True, True, True, False]


def test_empty_selectors_and_outside_sources() -> None:
    every_namespace = _policy({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]})
    own_namespace = _policy({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]})
    block = _policy({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.9/32"]}}]}]})
    inside = Source("in", Pod("other"))
    assert Cluster(NAMESPACES, [every_namespace]).admits(inside, DB, 5432)
    assert not Cluster(NAMESPACES, [every_namespace]).admits(Source("outside"), DB, 5432)
    assert not Cluster(NAMESPACES, [own_namespace]).admits(inside, DB, 5432)
    assert Cluster(NAMESPACES, [own_namespace]).admits(Source("same", Pod("ml")), DB, 5432)
    assert Cluster(NAMESPACES, [block]).admits(Source("outside"), DB, 5432)
    assert not Cluster(NAMESPACES, [block]).admits(Source("excepted", ip="203.0.113.9"), DB, 5432)


def test_ports() -> None:
    def only(*ports: dict[str, Any]) -> Cluster:
        return Cluster(NAMESPACES, [_policy({"podSelector": {}, "ingress": [{"ports": list(ports)}]})])

    outside = Source("outside")
    assert only({"port": 5432}).admits(outside, DB, 5432) and not only({"port": 5432}).admits(outside, DB, 5433)
    assert not only({"port": 5432}).admits(outside, DB, 5432, "UDP")
    assert only({"protocol": "UDP"}).admits(outside, DB, 53, "UDP") and not only({"protocol": "UDP"}).admits(outside, DB, 53)
    assert only({"port": "postgres"}).admits(outside, DB, 5432)  # named: the target's own port of that name
    assert not only({"port": "postgres"}).admits(outside, DB, 5433)
    assert not only({"port": "postgres", "protocol": "UDP"}).admits(outside, DB, 5432, "UDP")
    assert only({"port": 30000, "endPort": 30010}).admits(outside, DB, 30010)
    assert not only({"port": 30000, "endPort": 30010}).admits(outside, DB, 30011)


def test_label_selectors() -> None:
    labels = {"app": "grafana", "tier": "frontend"}
    assert selects({}, {})
    assert selects({"matchLabels": {"app": "grafana"}}, labels) and not selects({"matchLabels": {"app": "loki"}}, labels)
    for operator, values, held in (("In", ["frontend", "backend"], True), ("In", ["db"], False), ("NotIn", ["db"], True),
                                   ("NotIn", ["frontend"], False), ("Exists", [], True), ("DoesNotExist", [], False)):
        assert selects({"matchExpressions": [{"key": "tier", "operator": operator, "values": values}]}, labels) is held
    assert selects({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, labels)
    assert selects({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, labels)


# ---------------------------------------------------------------------------------------------
# The shapes svc makes, and exactly whom each admits.


def _job(svc: list[str] | None, *, in_spec: bool = False, ray: bool = False) -> dict[str, Any]:
    """Job ``np`` in namespace ``ml``: a head, two workers and a TensorBoard task; svc (and ray) from
    the annotation, or svc from spec.plugins."""
    def pods(container: dict[str, Any]) -> dict[str, Any]:
        return {"restartPolicy": "OnFailure", "containers": [container]}

    annotated: dict[str, list[str]] = {"ray": []} if ray else {}
    if svc is not None and not in_spec:
        annotated["svc"] = svc
    return volcano_job("np", namespace="ml", uid="e0000000-0000-4000-8000-000000002850", annotation=annotated or None,
                       plugins={"svc": svc or []} if in_spec else None, tasks=[
                           task("head", 1, pod=pods({"name": "head", "image": "rayproject/ray:2.52.0"})),
                           task("worker", 2, pod=pods({"name": "worker", "image": "rayproject/ray:2.52.0"})),
                           task("board", 1, pod=pods({"name": "tensorboard", "image": "tensorflow/tensorflow:2.16.1",
                                                       "ports": [{"name": "tensorboard", "containerPort": 6006}]})),
                       ])


def _policies(job: dict[str, Any], chain: Chain = CLUSTER_VIEW) -> list[dict[str, Any]]:
    return [o for o in chain.resources(Job.from_object(job)) if o["kind"] == "NetworkPolicy"]


def _member(task: str, ports: tuple[tuple[str, int, str], ...] = ()) -> Pod:
    return Pod("ml", {JOB_NAME_KEY: "np", JOB_NAMESPACE_KEY: "ml", TASK_SPEC_KEY: task}, ports)


RAY_PORTS = (("gcs", 6379, "TCP"), ("dashboard", 8265, "TCP"), ("client-server", 10001, "TCP"))
HEAD, WORKER, BOARD = _member("head", RAY_PORTS), _member("worker"), _member("board", (("tensorboard", 6006, "TCP"),))
SOURCES = {
    "own": Source("own", _member("worker")),
    "ml-prometheus": Source("ml-prometheus", Pod("ml", {"app.kubernetes.io/name": "prometheus"})),
    "ml-web": Source("ml-web", Pod("ml", {"app": "web"})),
    "monitoring": Source("monitoring", Pod("monitoring", {"app": "alertmanager"})),
    "notebooks": Source("notebooks", Pod("notebooks", {"app": "jupyter"})),
    "grafana-frontend": Source("grafana-frontend", Pod("observability", {"app": "grafana", "tier": "frontend"})),
    "grafana-db": Source("grafana-db", Pod("observability", {"app": "grafana", "tier": "db"})),
    "loki": Source("loki", Pod("observability", {"app": "loki", "tier": "frontend"})),
    "other-scraper": Source("other-scraper", Pod("other", {"role": "scraper"})),
    "other-web": Source("other-web", Pod("other", {"app": "web"})),
    # The job's labels in another namespace: Volcano's peer is a Pod selector alone, its own namespace only.
    "lookalike": Source("lookalike", Pod("other", {JOB_NAME_KEY: "np", JOB_NAMESPACE_KEY: "ml"})),
    "outside": Source("outside"),
}
EVERYONE_IN_CLUSTER = set(SOURCES) - {"outside"}

SHAPES: dict[str, tuple[list[str], set[str]]] = {
    "volcano's": ([], {"own"}),
    "namespaces": (["--allow-namespaces=monitoring,notebooks"], {"own", "monitoring", "notebooks"}),
    "namespaces-repeated": (["--allow-namespaces=monitoring", "--allow-namespaces=notebooks,monitoring"], {"own", "monitoring", "notebooks"}),
    "pods-here": (["--allow-pods=app.kubernetes.io/name=prometheus"], {"own", "ml-prometheus"}),
    "pods-there": (["--allow-pods=observability:app=grafana,tier in (frontend, backend)"], {"own", "grafana-frontend"}),
    "pods-there-negated": (["--allow-pods=observability,ml:tier,tier notin (db),!role"], {"own", "grafana-frontend", "loki"}),
    "pods-anywhere": (["--allow-pods=*:role=scraper"], {"own", "other-scraper"}),
    "every-namespace": (["--allow-namespaces=*"], EVERYONE_IN_CLUSTER),
    "together": (
        ["--allow-namespaces=monitoring,notebooks", "--allow-pods=app.kubernetes.io/name=prometheus",
         "--allow-pods=observability:app=grafana,tier in (frontend, backend)", "--allow-pods=*:role=scraper"],
        {"own", "monitoring", "notebooks", "ml-prometheus", "grafana-frontend", "other-scraper"},
    ),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_admits_exactly_its_clients(shape: str) -> None:
    flags, admitted = SHAPES[shape]
    cluster = Cluster(NAMESPACES, _policies(_job(flags)))
    for target in (HEAD, WORKER, BOARD):
        got = {name for name, source in SOURCES.items() if cluster.admits(source, target, 6006)}
        assert got == admitted, (target.labels[TASK_SPEC_KEY], sorted(got ^ admitted))


def test_opened_task_ports_admit_anyone_there_and_nowhere_else() -> None:
    flags = ["--open-task-ports=head:dashboard,client-server", "--open-task-ports=board:6006,9000/UDP"]
    cluster = Cluster(NAMESPACES, _policies(_job(flags, ray=True)))
    outside, own, web = SOURCES["outside"], SOURCES["own"], SOURCES["other-web"]
    for source in (outside, web):
        assert cluster.admits(source, HEAD, 8265) and cluster.admits(source, HEAD, 10001)
        assert not cluster.admits(source, HEAD, 6379)  # the GCS port stays the job's own
        assert not cluster.admits(source, HEAD, 8265, "UDP")
        assert not any(cluster.admits(source, WORKER, port) for port in (8265, 10001, 6006))
        assert cluster.admits(source, BOARD, 6006) and cluster.admits(source, BOARD, 9000, "UDP")
        assert not cluster.admits(source, BOARD, 9000) and not cluster.admits(source, BOARD, 8265)
    assert cluster.admits(own, HEAD, 6379) and cluster.admits(own, WORKER, 12345)


def test_a_task_opened_on_every_port() -> None:
    cluster = Cluster(NAMESPACES, _policies(_job(["--open-task-ports=board"])))
    assert all(cluster.admits(SOURCES["outside"], BOARD, port, protocol) for port in (1, 6006, 65535) for protocol in ("TCP", "UDP"))
    assert not cluster.admits(SOURCES["outside"], HEAD, 8265)


def test_no_policy_admits_everyone_and_the_flags_refuse_it() -> None:
    assert _policies(_job(["--disable-network-policy"])) == []
    with pytest.raises(PluginError, match="give one of --disable-network-policy and --allow-pods"):
        _policies(_job(["--disable-network-policy", "--allow-pods=app=x"]))


def test_without_flags_the_policy_is_volcanos_byte_for_byte() -> None:
    """The default shape as Volcano's svc writes it (docs/volcano-behaviour.md#svc-service-and-networkpolicy)."""
    selector = {JOB_NAME_KEY: "np", JOB_NAMESPACE_KEY: "ml"}
    [policy] = _policies(_job([]))
    assert json.dumps(policy["spec"]) == json.dumps({"podSelector": {"matchLabels": selector},
                                                     "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
                                                     "policyTypes": ["Ingress"]})


def test_a_jobset_task_is_opened_by_its_replicated_job_label() -> None:
    jobset = read_workload({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "ml", "uid": "u", "annotations": {ANNOTATION: '{"svc": ["--open-task-ports=driver:4040"]}'}},
        "spec": {"replicatedJobs": [{"name": name, "replicas": 1, "template": {"spec": {"completions": 1, "parallelism": 1, "template": {
            "metadata": {"labels": {"volcano-job-webhook/enabled": "true"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}} for name in ("driver", "executor")]},
    })
    opened = [o for o in Chain().resources(jobset) if o["metadata"]["name"] == "js-driver-open"]
    assert [o["spec"]["podSelector"] for o in opened] == [{"matchLabels": {
        "jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": "driver"}}]


# ---------------------------------------------------------------------------------------------
# The label selectors the flags take.


@pytest.mark.parametrize(("text", "selector"), [
    ("app=x", {"matchLabels": {"app": "x"}}),
    (" app == x , tier!=db ", {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}),
    ("app=x,app=y", {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "app", "operator": "In", "values": ["y"]}]}),
    ("app=", {"matchLabels": {"app": ""}}),
    ("example.com/tier in (a, b,a),zone notin (z1)", {"matchExpressions": [
        {"key": "example.com/tier", "operator": "In", "values": ["a", "b"]}, {"key": "zone", "operator": "NotIn", "values": ["z1"]}]}),
    ("gpu,!spot", {"matchExpressions": [{"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "DoesNotExist"}]}),
    ("", {}),
])
def test_selectors_parse_as_kubectl_writes_them(text: str, selector: dict[str, Any]) -> None:
    assert parse_selector(text) == selector


@pytest.mark.parametrize(("text", "reason"), [
    ("app in (a", "expected ',' or ')'"),
    ("app in ()", "expected a value in the set of 'app'"),
    ("app=x,", "a requirement is missing after the last ','"),
    ("app=x y", "expected ',' between requirements"),
    ("replicas>1", "no numeric comparison"),
    ("App_=x", "label key 'App_'"),
    ("-bad.example/x=y", "its prefix '-bad.example' is not a DNS-1123 subdomain"),
    ("app=" + "v" * 64, "label value"),
    ("app=(x)", "expected a value for 'app'"),
    ("!", "expected a label key after '!'"),
])
def test_selectors_the_api_server_would_refuse_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=__import__("re").escape(reason)):
        parse_selector(text)


# ---------------------------------------------------------------------------------------------
# Where Volcano's controller runs svc: the flags are Volcano's flag error.


def test_where_volcano_runs_svc_the_flags_are_its_flag_error() -> None:
    job = Job.from_object(_job(["--allow-pods=app=x", "--disable-network-policy"], in_spec=True))
    with pytest.raises(PluginError, match=r"--allow-pods: flag provided but not defined .*this project's svc only"):
        CLUSTER_VIEW.check(job)  # /validate of a new Job
    lineup = CLUSTER_VIEW.prepare(job)
    [svc] = [p for p in lineup.plugins if p.name == "svc"]
    # As Go's flag reads it: nothing from the unknown flag on, so Volcano makes its NetworkPolicy.
    assert svc.options["disable-network-policy"] is False and svc.options["allow-pods"] == ()
    assert any("Volcano's controller only logs this" in w for w in lineup.warnings)
    assert CLUSTER_VIEW.resources(job) == []
    # Where this project runs svc, the same arguments are its own, judged strictly.
    with pytest.raises(PluginError, match="give one of --disable-network-policy and --allow-pods"):
        Chain().check(job)


# ---------------------------------------------------------------------------------------------
# The real API server takes every shape.


def _all_shapes() -> list[dict[str, Any]]:
    shapes = [policy for flags, _ in SHAPES.values() for policy in _policies(_job(flags))]
    shapes += _policies(_job(["--open-task-ports=head:dashboard,client-server", "--open-task-ports=board:6006,9000/UDP,7000/SCTP"], ray=True))
    shapes += _policies(_job(["--open-task-ports=board"]))
    return shapes


def test_the_api_server_accepts_every_shape_and_stores_what_we_judged(kube_admin, kube_namespace) -> None:
    for policy in _all_shapes():
        moved = {**policy, "metadata": {**policy["metadata"], "namespace": kube_namespace}}
        stored = envtest.create(kube_admin, moved, dry_run=True)
        assert stored["metadata"]["namespace"] == kube_namespace
        # The stored object (the server's defaults added) admits exactly what the one we made does.
        back = {**stored, "metadata": {**stored["metadata"], "namespace": "ml"}}
        targets = (HEAD, WORKER, BOARD)
        for source in SOURCES.values():
            for target in targets:
                for port, protocol in ((6006, "TCP"), (8265, "TCP"), (9000, "UDP")):
                    assert Cluster(NAMESPACES, [policy]).admits(source, target, port, protocol) \
                        == Cluster(NAMESPACES, [back]).admits(source, target, port, protocol)


@pytest.mark.parametrize(("key", "value", "ours"), [
    ("App_", "x", "label key 'App_'"),
    ("-bad.example/x", "y", "is not a DNS-1123 subdomain"),
    ("app", "v" * 64, "label value"),
    ("app", "-x", "label value"),
    ("app", "", None),
    ("example.com/app.name_1", "A.b-c_9", None),
])
def test_selectors_are_refused_exactly_where_the_api_server_refuses_them(kube_admin, kube_namespace, key: str, value: str,
                                                                         ours: str | None) -> None:
    """The same pair, raw in a NetworkPolicy, is what the API server takes or refuses."""
    peer = {"podSelector": {"matchLabels": {key: value}}}
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "probe", "namespace": kube_namespace},
              "spec": {"podSelector": {}, "ingress": [{"from": [peer]}], "policyTypes": ["Ingress"]}}
    try:
        envtest.create(kube_admin, policy, dry_run=True)
        refused = None
    except envtest.ApiException as exc:
        assert exc.status == 422, exc
        refused = envtest.status_message(exc)
    if ours is None:
        assert parse_selector(f"{key}={value}") == {"matchLabels": {key: value}} and refused is None
    else:
        with pytest.raises(ValueError, match=__import__("re").escape(ours)):
            parse_selector(f"{key}={value}")
        assert refused is not None


# ---------------------------------------------------------------------------------------------
# The CLI shows them.


def test_resources_shows_the_policies(capsys, tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job(["--allow-namespaces=monitoring", "--open-task-ports=board"])))
    code = main(["resources", "--job", str(path), "--cluster", "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    policies = {o["metadata"]["name"]: o["spec"] for o in json.loads(out) if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"np", "np-board-open"}
    assert policies["np"]["ingress"][0]["from"][1] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert policies["np-board-open"]["ingress"] == [{}]
