"""The recorded cases of ``tests/fixtures/plugins``: every plugin, its flags and the error cases.

Each wired Pod must equal the recorded one, validate against the Kubernetes Pod schema, come out of
a second run unchanged, and patch cleanly; each error must be the recorded message.
"""

from __future__ import annotations

from pathlib import Path

import jsonpatch
import pytest
import yaml

from plugins import Chain, Job, PluginError
from tests.schema import validate_object, validate_pod
from webhook.patch import make_patch

CASES = sorted((Path(__file__).parent / "fixtures" / "plugins").glob("*.yaml"))
PLUGINS = ("env", "svc", "ssh", "pytorch", "tensorflow", "mpi", "ray", "hcclrank")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case(path):
    case = load(path)
    job = Job.from_object(case["job"])
    chain = Chain()
    if "error" in case:
        with pytest.raises(PluginError) as info:
            chain.mutate(job, case["pod"])
        assert str(info.value) == case["error"]
        return
    result = chain.mutate(job, case["pod"])
    assert result.pod == case["expected"]
    assert result.warnings == case.get("warnings", [])
    validate_pod(result.pod)
    assert jsonpatch.apply_patch(case["pod"], make_patch(case["pod"], result.pod)) == result.pod
    assert chain.mutate(job, result.pod).pod == result.pod, "idempotent"
    for obj in chain.resources(job):
        validate_object(obj)


def test_every_plugin_and_the_error_cases_are_covered():
    cases = [load(p) for p in CASES]
    used = {name for c in cases for name in c["job"]["spec"]["plugins"]}
    assert set(PLUGINS) <= used
    assert sum("error" in c for c in cases) >= 7
    assert any(c["name"] == "volcano-wired-after-defaulting" and c["expected"] == c["pod"] for c in cases)
