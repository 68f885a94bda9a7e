"""The Helm chart (``charts/volcano-job-webhook``) as ``helm template`` renders it; helm is found as
tests/helpers/tools.py says (``$HELM``), and a test without it skips."""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from tests.helpers.kustomize import ROOT, documents
from tests.helpers.tools import Tool

CHART = ROOT / "charts" / "volcano-job-webhook"
RELEASE = "volcano-job-webhook"  # the default name: the objects get the names of docs/install.md
NAMESPACE = "volcano-job-webhook"
HELM_ENV = "HELM"

HELM = Tool("helm", HELM_ENV)
cached_helm, find_helm, helm_or_skip = HELM.cached, HELM.find, HELM.or_skip


def run(args: Sequence[str], *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``helm ARGS``; a non-zero exit fails the test with helm's output when ``check``."""
    done = subprocess.run([str(helm_or_skip()), *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


@functools.cache
def _template(values_json: str, release: str, namespace: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as values:
        values.write(values_json)
        values.flush()
        return run(["template", release, str(CHART), "--namespace", namespace, "--values", values.name]).stdout


def template_text(values: Mapping[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """``helm template RELEASE charts/volcano-job-webhook -n NAMESPACE`` with ``values`` (JSON-able,
    merged over values.yaml), as text: comments and ``# Source:`` lines included."""
    return _template(json.dumps(values or {}, sort_keys=True), release, namespace)


def template(values: Mapping[str, Any] | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects of :func:`template_text`; a fresh copy each call, so a test may edit what it gets."""
    return documents(template_text(values, release=release, namespace=namespace))
