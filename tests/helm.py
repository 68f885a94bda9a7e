"""The Helm chart (``charts/volcano-job-webhook``) as ``helm template`` renders it.

helm is looked for, in order: ``$HELM`` (when set, it alone decides; set it empty to render
nothing), ``helm`` on ``PATH``, and ``${XDG_CACHE_HOME:-~/.cache}/volcano-job-webhook/bin/helm``, where
``.ci/run`` puts the one of the registry's kubectl layer. Without it, :func:`helm_or_skip` skips the
test naming what it looked for; a chart helm refuses fails it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kustomize import ROOT

CHART = ROOT / "charts" / "volcano-job-webhook"
RELEASE = "volcano-job-webhook"  # the default name: the objects get the names of docs/install.md
NAMESPACE = "volcano-job-webhook"
HELM_ENV = "HELM"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def cached_helm(environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``.ci/run`` installs helm when this machine has none."""
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "volcano-job-webhook" / "bin" / "helm"


def find_helm(environ: Mapping[str, str] = os.environ) -> Path | None:
    if HELM_ENV in environ:
        explicit = environ[HELM_ENV]
        return Path(explicit) if explicit and os.access(explicit, os.X_OK) else None
    on_path = shutil.which("helm", path=environ.get("PATH"))
    candidates = [Path(on_path)] if on_path else []
    candidates.append(cached_helm(environ))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def missing_helm() -> str:
    """The skip reason: what was looked for."""
    if HELM_ENV in os.environ:
        if not os.environ[HELM_ENV]:
            return f"helm: {HELM_ENV} is set empty, which turns the chart rendering off"
        return f"helm not found: {HELM_ENV}={os.environ[HELM_ENV]} is not an executable"
    return f"helm not found (${HELM_ENV}, PATH, {cached_helm()}); .ci/run installs it there, or set HELM"


def helm_or_skip() -> Path:
    helm = find_helm()
    if helm is None:
        pytest.skip(missing_helm())
    return helm


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
