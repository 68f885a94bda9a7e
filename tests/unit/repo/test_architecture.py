"""docs/architecture.md stays true to the code: every module of webhook/ and plugins/ is named in its
folder's section, and every import goes down the layers its table states.

Imports are read with ``ast``, not by importing, so an import inside a function or under
``TYPE_CHECKING`` counts as much as one at the top of a module: each is a dependency all the same.

Not import-linter: its graph (grimp) walks the package's one folder, and ``volcano_job_webhook.plugins``
lives in another (pyproject.toml's package-dir), so it answers "Module 'volcano_job_webhook.plugins'
does not exist" (import-linter 2.17, tried on this tree)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

DOC = ROOT / "docs" / "architecture.md"
PACKAGE = "volcano_job_webhook"
# pyproject.toml's package-dir: the repository's folders and the import names they make.
FOLDERS = {"webhook": PACKAGE, "plugins": f"{PACKAGE}.plugins"}


def module_files() -> dict[str, Path]:
    """Every module of the package, by import name (a package by its own name, for its __init__)."""
    found: dict[str, Path] = {}
    for folder, prefix in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((prefix, *parts))] = path
    return found


MODULES = module_files()


def unit(module: str) -> str:
    """The unit a module belongs to in the layer table: the first name under the package (a
    subpackage, or a module of webhook/ on its own), ``__init__`` for the package itself."""
    rest = module.removeprefix(PACKAGE).lstrip(".")
    return rest.split(".")[0] if rest else "__init__"


def imports_of(module: str, path: Path) -> set[str]:
    """The modules of ours that ``module`` imports: ``from X import y`` is ``X.y`` when that is a
    module, else ``X``; relative imports are resolved against the module's package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def layer_table(text: str) -> tuple[dict[str, int], set[tuple[str, str]]]:
    """The units of each layer and the sideways imports allowed, as the doc's table states them."""
    section = text[text.index("## Which module imports which"):]
    section = section[: section.index("\n## ")]
    layers: dict[str, int] = {}
    sideways: set[tuple[str, str]] = set()
    for row in re.findall(r"^\| (\d+) \|([^|]*)\|([^|]*)\|$", section, re.MULTILINE):
        for name in re.findall(r"`([\w.]+)`", row[1]):
            assert name not in layers, f"docs/architecture.md puts {name} in two layers"
            layers[name] = int(row[0])
        sideways.update(re.findall(r"`(\w+)` → `(\w+)`", row[2]))
    return layers, sideways


def violations(edges: dict[str, set[str]], layers: dict[str, int], sideways: set[tuple[str, str]]) -> list[str]:
    """Each import that does not go down the layers, as one readable line."""
    found = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = unit(source), unit(target)
            if a == b:
                continue
            if a not in layers or b not in layers:
                found.append(f"{source} -> {target}: {a if a not in layers else b} is in no layer of the table")
            elif layers[b] >= layers[a] and (a, b) not in sideways:
                found.append(f"{source} -> {target}: {a} (layer {layers[a]}) may not import {b} (layer {layers[b]})")
    return found


EDGES = {module: imports_of(module, path) for module, path in MODULES.items()}
LAYERS, SIDEWAYS = layer_table(DOC.read_text())


def test_the_table_places_every_unit():
    units = {unit(module) for module in MODULES}
    assert units - set(LAYERS) == set(), "a unit of the code missing from docs/architecture.md's layer table"
    assert set(LAYERS) - units == set(), "docs/architecture.md's layer table names a unit the code does not have"


def test_imports_go_down_the_layers():
    found = violations(EDGES, LAYERS, SIDEWAYS)
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_the_plugin_core_imports_no_builtin():
    """The registry's list says what is built in; the core names no built-in in an import."""
    builtin = f"{PACKAGE}.plugins.builtin"
    core = {m: targets for m, targets in EDGES.items() if unit(m) == "plugins" and not (m + ".").startswith(builtin + ".")}
    found = sorted(f"{m} -> {t}" for m, targets in core.items() for t in targets if (t + ".").startswith(builtin + "."))
    assert not found, found


@pytest.mark.parametrize(("source", "target"), [
    (f"{PACKAGE}.kube.rest", f"{PACKAGE}.server.app"),       # up a layer
    (f"{PACKAGE}.server.app", f"{PACKAGE}.reconciler.workload"),  # sideways, not allowed
    (f"{PACKAGE}.plugins.chain", f"{PACKAGE}.config"),        # the pure core reaching into the processes
    (f"{PACKAGE}.limits", f"{PACKAGE}.documents"),            # sideways the wrong way round
])
def test_the_check_catches_an_import_against_the_layers(source, target):
    assert violations({source: {target}}, LAYERS, SIDEWAYS), f"{source} -> {target} passed"


def test_the_import_reader_resolves_relative_and_from_imports():
    server_jobs_kube = imports_of(f"{PACKAGE}.server.jobs.kube", MODULES[f"{PACKAGE}.server.jobs.kube"])
    assert f"{PACKAGE}.server.jobs" in server_jobs_kube, "from . import NamespaceNotWatched"
    assert f"{PACKAGE}.kube.informer" in server_jobs_kube
    assert f"{PACKAGE}.logs" in imports_of(f"{PACKAGE}.server.run", MODULES[f"{PACKAGE}.server.run"]), "from volcano_job_webhook import logs"


def test_architecture_names_every_module_in_its_folders_section():
    """Each module is named, by its path under the folder, in the section headed by that folder
    (the deepest one: webhook/server/https.py in '## webhook/server/', webhook/config.py in '## webhook/')."""
    text = DOC.read_text()
    sections: dict[str, str] = {}
    for match in re.finditer(r"^## (\S+/) ", text, re.MULTILINE):
        body = text[match.end():]
        end = re.search(r"^## ", body, re.MULTILINE)
        sections[match.group(1)] = body[: end.start() if end else len(body)]
    missing = []
    for path in MODULES.values():
        relative = path.relative_to(ROOT).as_posix()
        folder = max((f for f in sections if relative.startswith(f)), key=len, default=None)
        if folder is None or f"`{relative.removeprefix(folder)}`" not in sections[folder]:
            missing.append(relative)
    assert not missing, f"docs/architecture.md does not name {missing} in its folder's section"
