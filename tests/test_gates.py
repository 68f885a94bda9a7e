"""Style and type gates: ruff (configured in pyproject.toml) and mypy (strict on plugins/, checked on
the rest) find nothing.

mypy cannot follow setuptools' editable-install import hook, so the package is laid out for it as
a tree of symlinks shaped like the installed package (``webhook/`` as ``volcano_job_webhook``,
``plugins/`` as ``volcano_job_webhook/plugins``), built from ``pyproject.toml``'s ``package-dir``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} is not installed (it comes with the test extra)")
        return found
    return str(path)


def test_ruff_finds_nothing() -> None:
    done = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def package_tree(dest: Path) -> Path:
    """Symlinks laid out as the installed package, from ``package-dir``."""
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        target = dest.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for entry in (ROOT / folder).iterdir():
            link = target / entry.name
            if entry.name != "__pycache__" and not link.exists():
                link.symlink_to(entry)
    return dest


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    tree = package_tree(tmp_path / "src")
    cache = ROOT / ".mypy_cache"
    env = {**os.environ, "MYPYPATH": str(tree)}
    done = subprocess.run(
        [_tool("mypy"), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache), "-p", "volcano_job_webhook"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    report = done.stdout.replace(f"{tree}/volcano_job_webhook/plugins/", "plugins/").replace(f"{tree}/volcano_job_webhook/", "webhook/")
    assert done.returncode == 0, report[-8000:] + done.stderr[-2000:]
