"""The install manifests (``manifests/``) as ``kubectl apply -k`` sees them: rendered by kubectl's
built-in kustomize, so what the tests check is what a user installs.

kubectl is looked for, in order: ``$KUBECTL`` (when set, it alone decides; set it empty to render
nothing), ``$KUBEBUILDER_ASSETS/kubectl`` (envtest's layout ships one), ``kubectl`` on ``PATH``, and
``${XDG_CACHE_HOME:-~/.cache}/volcano-job-webhook/bin/kubectl``, where ``.ci/run`` puts one. Without
it, :func:`build` skips the test naming what it looked for; a kustomization kubectl refuses fails it.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.tools import Tool

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
OVERLAYS = MANIFESTS / "overlays"
SETTINGS = MANIFESTS / "settings"  # <mode>/: the settings ConfigMap's generator, a Component per certificates mode
# Each rendered from the chart by tests/render_manifests.py, with the same values there.
VARIANTS: dict[str, Path] = {
    "cert-manager": OVERLAYS / "cert-manager",
    "cert-manager-split": OVERLAYS / "cert-manager-split",
    "self-managed": OVERLAYS / "self-managed",
    "split": OVERLAYS / "split",
}
SPLIT_VARIANTS = frozenset({"split", "cert-manager-split"})  # the webhook and the reconciler apart
DEFAULT_VARIANT = "self-managed"  # what manifests/kustomization.yaml installs

KUBECTL_ENV = "KUBECTL"
ASSETS_ENV = "KUBEBUILDER_ASSETS"


KUBECTL = Tool("kubectl", KUBECTL_ENV, lambda environ: [Path(environ[ASSETS_ENV]) / "kubectl"] if environ.get(ASSETS_ENV) else [],
               f"${ASSETS_ENV}/kubectl, ")
cached_kubectl, find_kubectl, missing_kubectl, kubectl_or_skip = KUBECTL.cached, KUBECTL.find, KUBECTL.missing, KUBECTL.or_skip


def _render(kubectl: Path, directory: Path) -> str:
    done = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return done.stdout


# The repository's own kustomizations do not change during a run; a test's own (under tmp_path) may.
_render_manifests = functools.cache(_render)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def build(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize directory``, in kustomize's order; a fresh copy each call, so a test may
    edit what it gets."""
    kubectl, directory = kubectl_or_skip(), directory.resolve()
    text = (_render_manifests if directory.is_relative_to(MANIFESTS) else _render)(kubectl, directory)
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]


def build_variant(name: str) -> list[dict[str, Any]]:
    return build(MANIFESTS if name == "default" else VARIANTS[name])
