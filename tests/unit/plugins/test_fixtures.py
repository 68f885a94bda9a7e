"""Fixture cases for the plugin chain, derived from docs/volcano-behaviour.md (see
``tests/fixtures/README.md`` for the format).

Two sources, one parametrised test:

* ``tests/fixtures/plugins/spec/*.yaml`` — cases derived from docs/volcano-behaviour.md, several per
  file (``cases:``); errors are lists of substrings. Where the code departs from Volcano, the
  document says so and the case expects what the code does: no case is expected to fail.
* ``tests/fixtures/plugins/*.yaml`` — the earlier recorded cases, one per file, exact error messages.

A case may give ``settings``, as config.yaml would (``cluster_domain``, ``volcano_controller_plugins``
for the cluster view: which plugins Volcano's controller runs); the chain is built from them as every
command builds it, else with the defaults (every plugin ours).

For every case that expects a Pod: the chain's Pod equals the expected one (input untouched), the
warnings match, the Pod passes :func:`tests.helpers.schema.validate_pod`, a JSON patch from input to output
applies, a second run on the output changes nothing (docs/volcano-behaviour.md#idempotency), and every side resource
validates against the Kubernetes schema and carries Volcano's owner reference plus our managed-by
label (docs/volcano-behaviour.md#side-objects). Generated SSH keys are checked for format, not bytes.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.helpers.jobs import job_owner
from tests.helpers.schema import validate_object, validate_pod
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.registry import BUILTINS
from volcano_job_webhook.server.patch import make_patch

FIXTURES = Path(__file__).parents[2] / "fixtures" / "plugins"
MANAGED_BY = {"app.kubernetes.io/managed-by": "volcano-job-webhook"}
_KNOWN = re.compile(r" \(known: [^)]*\)$")
CASE_KEYS = {"name", "spec", "description", "job", "pod", "expected", "error", "warnings", "resources", "handmade", "settings"}


def _load_cases() -> list[dict[str, Any]]:
    cases = []
    for path in sorted((FIXTURES / "spec").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["cases"]:
            case = copy.deepcopy(case)  # YAML aliases share objects between cases
            case["_file"] = f"spec/{path.name}"
            cases.append(case)
    for path in sorted(FIXTURES.glob("*.yaml")):  # recorded single-case files
        case = yaml.safe_load(path.read_text())
        case["_file"] = path.name
        case["_recorded"] = True
        cases.append(case)
    return cases


CASES = _load_cases()




def _diff(expected: Any, actual: Any) -> str:
    """The JSON patch that turns the expected object into the actual one, for failure messages."""
    ops = jsonpatch.make_patch(expected, actual).patch
    return "expected -> actual:\n" + "\n".join(json.dumps(op, sort_keys=True) for op in ops)


# ---------------------------------------------------------------------------------------------
# Side resources


def _check_generated_keys(name: str, data: dict[str, bytes]) -> None:
    key = serialization.load_pem_private_key(data["id_rsa"], password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048, f"{name}: id_rsa is not an RSA 2048 key"
    assert key.public_key().public_numbers().e == 65537
    assert data["id_rsa"].startswith(b"-----BEGIN RSA PRIVATE KEY-----\n"), f"{name}: id_rsa is not PKCS#1 PEM"
    assert data["id_rsa"].endswith(b"-----END RSA PRIVATE KEY-----\n")
    body = data["id_rsa"].decode().splitlines()[1:-1]
    assert all(len(line) == 64 for line in body[:-1]) and 0 < len(body[-1]) <= 64, f"{name}: PEM lines are not 64 wide"
    pub = data["id_rsa.pub"]
    assert pub.startswith(b"ssh-rsa ") and pub.endswith(b"\n") and pub.count(b" ") == 1, f"{name}: id_rsa.pub is not 'ssh-rsa <b64>\\n'"
    assert data["authorized_keys"] == pub, f"{name}: authorized_keys differs from id_rsa.pub"
    loaded = serialization.load_ssh_public_key(pub.strip())
    assert loaded.public_numbers() == key.public_key().public_numbers(), f"{name}: id_rsa.pub does not match id_rsa"


def _check_resources(job_obj: dict[str, Any], produced: list[dict[str, Any]], expected: list[dict[str, Any]] | None) -> None:
    meta = job_obj["metadata"]
    owner = job_owner(job_obj)
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in produced:
        validate_object(obj)
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in by_key, f"side resource {key} produced twice"
        by_key[key] = obj
        m = obj["metadata"]
        assert m.get("namespace") == meta.get("namespace", "default"), f"{key}: namespace {m.get('namespace')!r}"
        assert m.get("ownerReferences") == [owner], f"{key}: ownerReferences {m.get('ownerReferences')!r}"
        assert MANAGED_BY.items() <= (m.get("labels") or {}).items(), f"{key}: no managed-by label"
        if obj["kind"] == "Secret":
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            assert set(data) == {"id_rsa", "id_rsa.pub", "authorized_keys", "config"}, f"{key}: keys {sorted(data)}"
    if expected is None:
        return
    assert sorted(by_key) == sorted((e["kind"], e["name"]) for e in expected), f"side resources {sorted(by_key)}"
    for want in expected:
        key = (want["kind"], want["name"])
        obj = by_key[key]
        if want["kind"] == "Secret":
            data = {k: base64.b64decode(v) for k, v in obj["data"].items()}
            wanted = {k: v.encode() for k, v in want["data"].items()}
            if "id_rsa" not in wanted:  # generated: random bytes, check the format instead
                _check_generated_keys(want["name"], data)
            got = {k: data[k] for k in wanted}
            assert got == wanted, f"{key} data:\n{_diff(wanted, got)}"
        elif "data" in want:
            assert obj.get("data") == want["data"], f"{key} data:\n{_diff(want['data'], obj.get('data'))}"
        if "spec" in want:
            assert obj.get("spec") == want["spec"], f"{key} spec:\n{_diff(want['spec'], obj.get('spec'))}"


# ---------------------------------------------------------------------------------------------
# The cases


def _chain(case: dict[str, Any]) -> Chain:
    """The chain the case's settings make (``WebhookSettings``, as from config.yaml), else the default one."""
    return WebhookSettings(**case["settings"]).chain(on_cluster=False) if "settings" in case else Chain()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_case(case):
    job = Job.from_object(case["job"])
    chain = _chain(case)
    pod = case["pod"]
    before = copy.deepcopy(pod)

    if "error" in case:
        with pytest.raises(PluginError) as info:
            chain.mutate(job, pod)
        message = str(info.value)
        if case.get("_recorded"):
            # Exact, except the list of installed plugins an unknown-plugin message ends with,
            # which depends on what is installed.
            assert _KNOWN.sub("", message) == _KNOWN.sub("", case["error"])
        else:
            missing = [s for s in case["error"] if s not in message]
            assert not missing, f"error message {message!r} lacks {missing}"
        assert pod == before, "the chain modified its input"
        return

    result = chain.mutate(job, pod)
    assert pod == before, "the chain modified its input"
    assert result.pod == case["expected"], _diff(case["expected"], result.pod)

    if case.get("_recorded"):
        assert result.warnings == case.get("warnings", [])
    elif "warnings" in case:
        assert len(result.warnings) == len(case["warnings"]), f"warnings {result.warnings}"
        for want in case["warnings"]:
            assert any(want in w for w in result.warnings), f"no warning contains {want!r}: {result.warnings}"

    validate_pod(result.pod)
    assert jsonpatch.apply_patch(pod, make_patch(pod, result.pod)) == result.pod

    again = _chain(case).mutate(Job.from_object(case["job"]), result.pod)
    assert again.pod == result.pod, "not idempotent: " + _diff(result.pod, again.pod)
    assert make_patch(result.pod, again.pod) == []

    _check_resources(case["job"], chain.resources(job), case.get("resources"))


# ---------------------------------------------------------------------------------------------
# The fixtures themselves


SPEC_CASES = [c for c in CASES if not c.get("_recorded")]
_POD_LABELS = ("volcano.sh/task-index", "volcano.sh/job-name", "volcano.sh/task-spec", "volcano.sh/job-namespace", "volcano.sh/queue-name")


@pytest.mark.parametrize("case", SPEC_CASES, ids=lambda c: c["name"])
def test_fixture_is_well_formed(case):
    """Each recorded case is complete, and its Pod is the one ``createJobPod`` builds (docs/volcano-behaviour.md#the-pod-before-plugins)
    unless it says it is hand-made: a typo in a fixture must not pass for a plugin result."""
    unknown = set(case) - CASE_KEYS - {"_file"}
    assert not unknown, f"unknown keys {sorted(unknown)}"
    assert case.get("spec") and case.get("description"), "every case says where its behaviour is specified and what it checks"
    assert ("expected" in case) != ("error" in case), "exactly one of expected / error"
    if "error" in case:
        job_key = f"{case['job']['metadata'].get('namespace', 'default')}/{case['job']['metadata']['name']}"
        assert job_key in case["error"], "an expected error names the job"
    if case.get("handmade"):
        return
    job, pod = case["job"], case["pod"]
    jm, pm = job["metadata"], pod["metadata"]
    task, index = pm["annotations"]["volcano.sh/task-spec"], pm["labels"]["volcano.sh/task-index"]
    ns = jm.get("namespace", "default")
    assert pm["name"] == f"{jm['name']}-{task}-{index}"
    assert pm["namespace"] == ns
    queue = job["spec"].get("queue", "default")
    assert {k: pm["labels"][k] for k in _POD_LABELS} == dict(zip(_POD_LABELS, (index, jm["name"], task, ns, queue), strict=True))
    ann = pm["annotations"]
    assert ann["volcano.sh/task-index"] == index
    assert ann["scheduling.k8s.io/group-name"] == f"{jm['name']}-{jm['uid']}"
    assert ann["volcano.sh/job-name"] == jm["name"]
    assert ann["volcano.sh/template-uid"] == f"{jm['name']}-{task}"
    assert pm["ownerReferences"] == [job_owner(job)]
    spec_task = next(t for t in job["spec"]["tasks"] if t["name"] == task)
    assert int(index) < spec_task["replicas"], "index beyond the task's replicas"


def test_coverage():
    """Every built-in the registry lists has a case, and case names are unique."""
    used = set()
    for c in SPEC_CASES:
        used |= set(c["job"]["spec"].get("plugins") or {})
        raw = (c["job"]["metadata"].get("annotations") or {}).get("volcano-job-webhook/plugins")
        used |= set(json.loads(raw)) if raw else set()
    assert set(BUILTINS) <= used, f"plugins without a case: {set(BUILTINS) - used}"
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names are unique"
