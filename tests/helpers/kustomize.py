"""The install manifests (``manifests/``) rendered by kubectl's own kustomize, so that the tests check
what ``kubectl apply -k`` installs; kubectl is found as tests/helpers/tools.py says (``$KUBECTL``, then
envtest's ``$KUBEBUILDER_ASSETS/kubectl``), and a test without it skips."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.tools import Tool

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
OVERLAYS = MANIFESTS / "overlays"
SETTINGS = MANIFESTS / "settings"  # <mode>/: the settings ConfigMap's generator, a Component per certificates mode
# Each rendered from the chart by tests/helpers/render_manifests.py, with the same values there.
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
find_kubectl, kubectl_or_skip = KUBECTL.find, KUBECTL.or_skip


def _render(kubectl: Path, directory: Path) -> str:
    done = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return done.stdout


# The repository's own kustomizations do not change during a run; a test's own (under tmp_path) may.
_render_manifests = functools.cache(_render)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it: several times faster


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a multi-document YAML text."""
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]


def build(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize directory``, in kustomize's order; a fresh copy each call, so a test may
    edit what it gets."""
    kubectl, directory = kubectl_or_skip(), directory.resolve()
    return documents((_render_manifests if directory.is_relative_to(MANIFESTS) else _render)(kubectl, directory))


def build_variant(name: str) -> list[dict[str, Any]]:
    return build(MANIFESTS if name == "default" else VARIANTS[name])
