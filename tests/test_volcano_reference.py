"""Differential test against Volcano's own plugin code (vcref, ``VOLCANO_REF``; skipped without it).

Generated jobs (``tests/volcano_reference.py``: 1-4 tasks, 1-5 replicas, any subset of the eight
plugins with valid flags in every Go spelling, templates with and without env, ports, mounts and
init containers), plus one job per documented difference, go through vcref in one process and
through our chain; Pods and side objects must match field by field, up to the normalisations and
documented differences listed in that module. ``VCREF_SEED`` and ``VCREF_JOBS`` change the batch;
``bench/volcano_reference.py`` is the long run.
"""

from __future__ import annotations

import copy
import glob
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import volcano_reference as vr
from volcano_job_webhook.plugins import pytorch as pytorch_module
from volcano_job_webhook.plugins import ray as ray_module
from volcano_job_webhook.plugins import svc as svc_module

VCREF = vr.vcref_path()
if not VCREF or not os.access(VCREF, os.X_OK):
    pytest.skip(f"{vr.VOLCANO_REF_ENV} is not set to Volcano's reference binary (vcref)", allow_module_level=True)

SEED = int(os.environ.get("VCREF_SEED", "20260820"))
JOBS = int(os.environ.get("VCREF_JOBS", "300"))
SPEC_FIXTURES = Path(__file__).parent / "fixtures" / "plugins" / "spec"


@pytest.fixture(scope="module")
def reference() -> vr.Reference:
    assert VCREF is not None
    jobs = vr.generate_jobs(SEED, JOBS) + list(vr.documented_examples().values())
    return vr.run_reference(jobs, VCREF)


@pytest.fixture(scope="module")
def report(reference: vr.Reference) -> vr.Report:
    return vr.compare(reference)


def _listing(mismatches: list[vr.Mismatch], limit: int = 25) -> str:
    kinds = Counter(m.kind for m in mismatches)
    return f"{len(mismatches)} mismatches {dict(kinds)}:\n" + "\n".join(str(m) for m in mismatches[:limit])


def test_generated_jobs_match_volcano(report: vr.Report) -> None:
    assert not report.mismatches, _listing(report.mismatches)


def test_the_batch_covers_what_it_claims(reference: vr.Reference, report: vr.Report) -> None:
    """A batch that compared little would pass for the wrong reason."""
    assert report.jobs == JOBS + len(vr.documented_examples())
    assert report.pods >= 4 * JOBS and report.objects >= JOBS, (report.pods, report.objects)
    per_plugin = Counter(p for job in reference.jobs for p in (job["spec"].get("plugins") or {}))
    assert all(per_plugin[p] >= JOBS // 10 for p in vr.VOLCANO_PLUGINS), per_plugin
    assert set(report.documented) == {d.key for d in vr.DIFFERENCES}, report.documented
    denied = sum(1 for r in reference.results if r.get("error"))
    assert 0 < denied < JOBS // 4, denied


def test_each_documented_example_shows_its_difference(reference: vr.Reference) -> None:
    """Each example job is taken out by its own entry of DIFFERENCES and by no other."""
    examples = vr.documented_examples()
    results = dict(zip((json.dumps(j, sort_keys=True) for j in reference.jobs), zip(reference.rewrites, reference.results, strict=True), strict=True))
    for key, job in examples.items():
        rewrites, ref = results[json.dumps(job, sort_keys=True)]
        single = vr.compare_job(job, ref, vr.run_ours(job), rewrites)
        assert not single.mismatches, _listing(single.mismatches)
        assert set(single.documented) == {key}, (key, single.documented)


# Our plugins changed on purpose, one way each: the comparison must catch every one.
def _dash_in_host_file_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(svc_module, "task_key", lambda task: task)


def _worker_rank_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    real = pytorch_module.ensure_envs

    def ensure_envs(container: dict[str, Any], entries: list[tuple[str, str | None, Any]]) -> None:
        real(container, [(n, str(int(v) - 1) if n == "RANK" and v not in (None, "0") else v, f) for n, v, f in entries])

    monkeypatch.setattr(pytorch_module, "ensure_envs", ensure_envs)


def _ray_port_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_module.RayPlugin, "ports", lambda self: [("gcs", self.options["port"]), ("dash", self.options["dashboardPort"]), ("client-server", self.options["clientPort"])])


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (_dash_in_host_file_key, "object ConfigMap"),
        (_worker_rank_off_by_one, "pod spec.containers.env.RANK"),
        (_ray_port_name, "pod spec.containers.ports.name"),
    ],
    ids=["svc-host-file-key", "pytorch-rank", "ray-port-name"],
)
def test_drift_is_caught(reference: vr.Reference, monkeypatch: pytest.MonkeyPatch, mutate: Any, kind: str) -> None:
    mutate(monkeypatch)
    drifted = vr.compare(reference)
    assert any(m.kind == kind for m in drifted.mismatches), _listing(drifted.mismatches)


# The recorded fixture cases whose plugins are all Volcano's, run through Volcano with the same Pod:
# they equal Volcano's Pod except these, each for the reason given.
FIXTURES_THAT_DIFFER = {
    "chain-annotation-merged-over-spec-plugins": "plugins from our job annotation, which Volcano does not read",
    "chain-annotation-only-plugin-brings-svc": "plugins from our job annotation, which Volcano does not read",
    "env-index-from-label-when-name-has-no-index": "hand-made Pod: we read the index label, Volcano only the name",
    "env-index-from-annotation-before-name-task-from-label": "hand-made Pod: we read the index annotation, Volcano only the name",
    "idempotent-volcano-wired-pytorch-worker-pytorch-ran-first": "a Pod Volcano already wired: we add nothing, Volcano adds again",
    "idempotent-volcano-wired-pytorch-worker-pytorch-ran-last": "a Pod Volcano already wired: we add nothing, Volcano adds again",
    "idempotent-volcano-wired-mpi-master-mpi-ran-first": "a Pod Volcano already wired: we add nothing, Volcano adds again",
    "idempotent-volcano-wired-ray-head": "a Pod Volcano already wired: we add nothing, Volcano adds again",
    "idempotent-volcano-wired-tensorflow-and-hcclrank": "a Pod Volcano already wired: we add nothing, Volcano adds again",
    "ray-custom-flags-client-server-port-alias-head": "DIFFERENCES: ray-client-server-port-alias",
}
# Where the difference is one of the three of issue #14, exactly which fields differ:
# (path, Volcano's value, ours).
EXACT = {
    "ray-head-and-worker-one-container-keeps-the-head": [
        (
            "spec.containers[0].command[2]",
            "ray start --block --address=rhw1-master-0.rhw1:6379",
            "ray start --head --block --dashboard-host=0.0.0.0 --port=6379 --dashboard-port=8265 --ray-client-server-port=10001",
        )
    ],
    "hcclrank-template-rank-replaced-by-pytorch": [("metadata.annotations.hccl/rankIndex", "x", "2")],
    "hcclrank-duplicate-rank-takes-the-last": [("metadata.annotations.hccl/rankIndex", "3", "4")],
}

# Jobs we deny where Volcano's head Service would carry one port number twice.
DUPLICATE_PORT_CASES = {"error-ray-dashboard-port-equals-gcs-port", "error-ray-client-port-equals-dashboard-port"}


# The size-budget cases (thousands of replicas) take vcref most of a minute and differ by design
# ("Host lists that scale"); tests/test_budgets_apiserver.py shows the API server rejecting Volcano's there.
MAX_REPLICAS = 1000


def _volcano_cases() -> list[dict[str, Any]]:
    cases = []
    for path in sorted(glob.glob(str(SPEC_FIXTURES / "*.yaml"))):
        for case in yaml.safe_load(Path(path).read_text())["cases"]:
            job = case["job"]
            plugins = set(job["spec"].get("plugins") or {}) | set(json.loads((job["metadata"].get("annotations") or {}).get("volcano-job-webhook/plugins", "{}")))
            replicas = sum(t.get("replicas") or 0 for t in job["spec"]["tasks"])
            if plugins <= set(vr.VOLCANO_PLUGINS) and replicas <= MAX_REPLICAS:
                cases.append(copy.deepcopy(case))
    return cases


def test_fixture_cases_against_volcano() -> None:
    assert VCREF is not None
    cases = _volcano_cases()
    results = vr.run_vcref([{"job": c["job"], "pods": [c["pod"]]} for c in cases], VCREF)
    seen = set()
    for case, ref in zip(cases, results, strict=True):
        name = case["name"]
        if "error" in case:
            if name in DUPLICATE_PORT_CASES:
                # Volcano admits the job, and its head Service carries one port number twice,
                # which the real API server rejects ("spec.ports[1]: Duplicate value").
                assert not ref.get("error") and not ref.get("pod_errors"), ref
                service = next(o for o in ref["resources"] if o["metadata"]["name"].endswith("-head-svc"))
                numbers = [p["port"] for p in service["spec"]["ports"]]
                assert len(set(numbers)) < len(numbers), numbers
                seen.add(name)
            continue
        differences = vr.diff(vr.normalise_pod(ref["pods"][0]), vr.normalise_pod(case["expected"])) if ref.get("pods") else [("", ref, None)]
        if name in EXACT:
            assert differences == EXACT[name], (name, differences)
        elif name in FIXTURES_THAT_DIFFER:
            assert differences, f"{name} now matches Volcano: drop it from FIXTURES_THAT_DIFFER"
        else:
            assert not differences, (name, differences[:5])
        seen.add(name)
    assert set(EXACT) | set(FIXTURES_THAT_DIFFER) <= seen
    assert seen >= DUPLICATE_PORT_CASES
