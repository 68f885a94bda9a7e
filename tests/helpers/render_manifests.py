"""Render the static manifests (``manifests/``) from the Helm chart, the one source of both.

    .venv/bin/python -m tests.helpers.render_manifests          # rewrite manifests/ from the chart
    .venv/bin/python -m tests.helpers.render_manifests --check  # exit 1, with a diff, if they differ

Each variant of :data:`VARIANTS` is ``helm template`` with its values, written to
``manifests/overlays/<variant>/install.yaml`` without Helm's own labels and what kustomize's
configMapGenerator supplies instead: the settings ConfigMap (its keys go to
``manifests/settings/<certificates mode>/``, whose hash suffix rolls the Deployments) and the Pods'
``checksum/config``. tests/apiserver/test_chart.py fails while the files differ from a fresh rendering.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.helm import NAMESPACE, RELEASE, template_text
from tests.helpers.kustomize import MANIFESTS, OVERLAYS, ROOT

SETTINGS = MANIFESTS / "settings"
VARIANTS: dict[str, dict[str, Any]] = {
    "self-managed": {"layout": "sidecar", "certificates": {"mode": "self-managed"}},
    "split": {"layout": "split", "certificates": {"mode": "self-managed"}},
    "cert-manager": {"layout": "sidecar", "certificates": {"mode": "cert-manager"}},
    "cert-manager-split": {"layout": "split", "certificates": {"mode": "cert-manager"}},
}
# Every variant: the Namespace, with its Pod Security labels, is part of `kubectl apply -k`.
COMMON_VALUES: dict[str, Any] = {"namespace": {"create": True}}

SOURCE = re.compile(r"^# Source: [\w.-]+/templates/(?P<file>[\w./-]+)$", re.MULTILINE)
HELM_LINES = re.compile(r"^ *(helm\.sh/chart: .*|app\.kubernetes\.io/managed-by: Helm)\n", re.MULTILINE)
CHECKSUM = re.compile(r"^(?P<indent> *)annotations:\n(?P=indent)  checksum/config: [0-9a-f]{64}\n(?!(?P=indent)  \S)", re.MULTILINE)
CHECKSUM_LINE = re.compile(r"^ *checksum/config: [0-9a-f]{64}\n", re.MULTILINE)


def header(variant: str) -> str:
    values = {**VARIANTS[variant], **COMMON_VALUES}
    return (f"# Rendered from charts/volcano-job-webhook by tests/helpers/render_manifests.py with {yaml.safe_dump(values, default_flow_style=True).strip()};\n"
            "# do not edit: change the chart and run `.venv/bin/python -m tests.helpers.render_manifests`\n"
            f"# (tests/apiserver/test_chart.py fails while they differ). The settings ConfigMap is {settings_dir(variant).relative_to(ROOT)}.\n")


def documents(text: str) -> list[tuple[str, str]]:
    """(template file, document text) of helm's output, in its order."""
    out = []
    for chunk in re.split(r"^---\n", text, flags=re.MULTILINE):
        chunk = chunk.strip("\n")
        if not chunk:
            continue
        source = SOURCE.search(chunk)
        if source is None:
            raise ValueError(f"a document of helm's output without its # Source: line:\n{chunk[:200]}")
        out.append((source.group("file"), chunk + "\n"))
    return out


def settings_dir(variant: str) -> Path:
    """The settings Component of a variant: one per way of making certificates (config.yaml differs)."""
    return SETTINGS / VARIANTS[variant]["certificates"]["mode"]


def render() -> dict[Path, str]:
    """Every file this script writes, and its content."""
    files: dict[Path, str] = {}
    for variant, values in VARIANTS.items():
        kept = []
        for source, doc in documents(template_text({**values, **COMMON_VALUES}, release=RELEASE, namespace=NAMESPACE)):
            if source == "configmap.yaml":
                for key, content in yaml.safe_load(doc)["data"].items():
                    path = settings_dir(variant) / key
                    if files.setdefault(path, content) != content:
                        raise ValueError(f"{path.relative_to(ROOT)} of variant {variant} differs from another variant's")
                continue
            doc = HELM_LINES.sub("", doc)
            doc = CHECKSUM_LINE.sub("", CHECKSUM.sub("", doc))
            kept.append(doc)
        files[OVERLAYS / variant / "install.yaml"] = header(variant) + "---\n" + "---\n".join(kept)
    return files


def differences(files: dict[Path, str]) -> str:
    """A unified diff of the repository's files against ``files`` ('' when they agree)."""
    out = []
    for path, want in files.items():
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != want:
            rel = str(path.relative_to(ROOT))
            out += difflib.unified_diff(have.splitlines(keepends=True), want.splitlines(keepends=True), f"a/{rel}", f"b/{rel}")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.render_manifests", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when manifests/ differ")
    args = parser.parse_args(argv)
    files = render()
    if args.check:
        diff = differences(files)
        sys.stdout.write(diff)
        return 1 if diff else 0
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
