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
import tempfile
import tomllib
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

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


_mypy: tuple[subprocess.Popen[str], Path] | None = None


def start_mypy() -> None:
    """Start mypy in the background (tests/conftest.py does at collection when this test is selected:
    a cold run is 40 s of one core, which beside the suite costs CI nothing)."""
    global _mypy
    mypy = str(BIN / "mypy") if (BIN / "mypy").exists() else shutil.which("mypy")
    if _mypy is None and mypy:
        tree = package_tree(Path(tempfile.mkdtemp(prefix="mypy-")) / "src")
        _mypy = (subprocess.Popen(
            [mypy, "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"),
             "-p", "volcano_job_webhook"],
            cwd=tree.parent, env={**os.environ, "MYPYPATH": str(tree)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), tree)


def test_mypy_finds_nothing() -> None:
    start_mypy()
    if _mypy is None:
        _tool("mypy")  # skips, naming it
    assert _mypy is not None
    process, tree = _mypy
    stdout, stderr = process.communicate(timeout=600)
    shutil.rmtree(tree.parent, ignore_errors=True)
    report = stdout.replace(f"{tree}/volcano_job_webhook/plugins/", "plugins/").replace(f"{tree}/volcano_job_webhook/", "webhook/")
    assert process.returncode == 0, report[-8000:] + stderr[-2000:]
