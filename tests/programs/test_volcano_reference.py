"""Differential test against Volcano's own plugin code: live (vcref, ``VOLCANO_REF``; skipped
without it) and from Volcano's recorded answers (``../shared/volcano-reference/``, every run).

Live: generated jobs (``tests/helpers/volcano_reference.py``: 1-4 tasks, 1-5 replicas, any subset of the eight
plugins with valid flags in every Go spelling, templates with and without env, ports, mounts and
init containers), plus one job per documented difference, go through vcref in one process and
through our chain; Pods and side objects must match field by field, up to the normalisations and
documented differences listed in that module. ``VCREF_SEED`` and ``VCREF_JOBS`` change the batch;
``bench/volcano_reference.py`` is the long run.

Recorded: the 4,000 jobs of ``RECORDED_FILE``, each with the answer Volcano's same code gave, go
through our chain in batches of 100 and are compared by the same :func:`volcano_reference.compare`
(``VOLCANO_REFERENCE_DATA`` names another copy; skipped when the file is missing).
"""

from __future__ import annotations

import copy
import glob
import json
import os
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import volcano_reference as vr
from volcano_job_webhook.plugins.builtin import pytorch as pytorch_module
from volcano_job_webhook.plugins.builtin import ray as ray_module
from volcano_job_webhook.plugins.builtin import svc as svc_module

VCREF = vr.vcref_path()
HAVE_VCREF = VCREF is not None and os.access(VCREF, os.X_OK)
NO_VCREF = f"{vr.VOLCANO_REF_ENV} is not set to Volcano's reference binary (vcref)"
needs_vcref = pytest.mark.skipif(not HAVE_VCREF, reason=NO_VCREF)

SEED = int(os.environ.get("VCREF_SEED", "20260820"))
JOBS = int(os.environ.get("VCREF_JOBS", "300"))
SPEC_FIXTURES = Path(__file__).parents[1] / "fixtures" / "plugins" / "spec"


@pytest.fixture(scope="module")
def reference() -> vr.Reference:
    if not HAVE_VCREF or VCREF is None:
        pytest.skip(NO_VCREF)
    jobs = vr.generate_jobs(SEED, JOBS) + list(vr.documented_examples().values())
    return vr.run_reference(jobs, VCREF)


@pytest.fixture(scope="module")
def report(reference: vr.Reference) -> vr.Report:
    return vr.compare(reference)


def test_generated_jobs_match_volcano(report: vr.Report) -> None:
    assert not report.mismatches, vr.summary(report.mismatches)


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
        assert not single.mismatches, vr.summary(single.mismatches)
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


drifts = pytest.mark.parametrize(
    ("mutate", "kind"),
    [
        (_dash_in_host_file_key, "object ConfigMap"),
        (_worker_rank_off_by_one, "pod spec.containers.env.RANK"),
        (_ray_port_name, "pod spec.containers.ports.name"),
    ],
    ids=["svc-host-file-key", "pytorch-rank", "ray-port-name"],
)


@drifts
def test_drift_is_caught(reference: vr.Reference, monkeypatch: pytest.MonkeyPatch, mutate: Any, kind: str) -> None:
    mutate(monkeypatch)
    drifted = vr.compare(reference)
    assert any(m.kind == kind for m in drifted.mismatches), vr.summary(drifted.mismatches)


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
# ("Host lists that scale"); tests/apiserver/test_budgets_apiserver.py shows the API server rejecting Volcano's there.
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


@needs_vcref
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


# ---------------------------------------------------------------------------------------------
# Volcano's recorded answers, replayed on every run: the same comparison as above, no vcref needed.

RECORDED = vr.recorded_path()
BATCH = 100
BATCHES = -(-vr.RECORDED_JOBS // BATCH)
needs_recorded = pytest.mark.skipif(
    not RECORDED.is_file(), reason=f"Volcano's recorded answers are not at {RECORDED} (or set {vr.RECORDED_ENV} to the file or its directory)"
)


@cache
def _recorded_lines() -> list[bytes]:
    return vr.read_recorded(RECORDED)


def _recorded(start: int, stop: int) -> vr.Reference:
    return vr.recorded_reference(_recorded_lines()[start:stop])


@dataclass(frozen=True)
class Replayed:
    """One batch of recorded jobs compared: the report, and what the batch held."""

    report: vr.Report
    plugins: Counter[str]
    denied: int
    stale: list[str]


@cache
def _replayed(batch: int) -> Replayed:
    """A batch through today's chain (once per session: the coverage test reuses what the batch tests did)."""
    reference = _recorded(batch * BATCH, (batch + 1) * BATCH)
    return Replayed(
        report=vr.compare(reference),
        plugins=Counter(p for job in reference.jobs for p in (job["spec"].get("plugins") or {})),
        denied=sum(1 for r in reference.results if r.get("error")),
        stale=vr.stale_inputs(reference),
    )


@needs_recorded
@pytest.mark.parametrize("batch", range(BATCHES), ids=[f"records-{b * BATCH:04d}-{(b + 1) * BATCH - 1:04d}" for b in range(BATCHES)])
def test_recorded_jobs_match_volcano(batch: int) -> None:
    report = _replayed(batch).report
    assert report.jobs == BATCH, f"{report.jobs} records in this batch, {BATCH} expected"
    if report.mismatches:
        pytest.fail(vr.summary(report.mismatches))


@needs_recorded
def test_the_recording_is_whole_and_of_todays_inputs() -> None:
    """Every record replayed, and each recorded for the input today's rewrites give its job: after a
    change to a rewrite in DIFFERENCES, Volcano's answer is to another job and must be recorded again."""
    assert len(_recorded_lines()) == vr.RECORDED_JOBS, (RECORDED, len(_recorded_lines()))
    stale = [s for b in range(BATCHES) for s in _replayed(b).stale]
    assert not stale, f"{len(stale)} records of another input:\n" + "\n".join(stale[:10])


@needs_recorded
def test_the_recording_covers_what_it_claims() -> None:
    """As for the live batch: enough compared, every plugin, some denials, every documented difference met."""
    total, plugins, denied = vr.Report(), Counter[str](), 0
    for b in range(BATCHES):
        replayed = _replayed(b)
        total.add(replayed.report)
        plugins.update(replayed.plugins)
        denied += replayed.denied
    jobs = vr.RECORDED_JOBS
    assert total.jobs == jobs
    assert total.pods >= 4 * jobs and total.objects >= jobs, (total.pods, total.objects)
    assert all(plugins[p] >= jobs // 10 for p in vr.VOLCANO_PLUGINS), plugins
    assert set(total.documented) == {d.key for d in vr.DIFFERENCES}, total.documented
    assert 0 < denied < jobs // 4, denied


@needs_recorded
@drifts
def test_drift_is_caught_by_the_recording(monkeypatch: pytest.MonkeyPatch, mutate: Any, kind: str) -> None:
    mutate(monkeypatch)
    drifted = vr.compare(_recorded(0, 2 * BATCH))
    assert any(m.kind == kind for m in drifted.mismatches), vr.summary(drifted.mismatches)
