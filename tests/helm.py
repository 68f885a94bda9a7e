"""The Helm chart (``charts/volcano-job-webhook``) as ``helm template`` renders it.

helm is looked for, in order: ``$HELM`` (when set, it alone decides; set it empty to render
nothing), ``helm`` on ``PATH``, and ``${XDG_CACHE_HOME:-~/.cache}/volcano-job-webhook/bin/helm``, where
``.ci/run`` puts the one of the registry's kubectl layer. Without it, :func:`helm_or_skip` skips the
test naming what it looked for; a chart helm refuses fails it.
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tests.kustomize import ROOT
from tests.tools import Tool

CHART = ROOT / "charts" / "volcano-job-webhook"
RELEASE = "volcano-job-webhook"  # the default name: the objects get the names of docs/install.md
NAMESPACE = "volcano-job-webhook"
HELM_ENV = "HELM"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


HELM = Tool("helm", HELM_ENV)
cached_helm, find_helm, missing_helm, helm_or_skip = HELM.cached, HELM.find, HELM.missing, HELM.or_skip


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
    text = template_text(values, release=release, namespace=namespace)
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
