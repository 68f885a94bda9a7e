"""The docs keep up with the code: every built-in the registry lists has its documentation, and the
map of the code names every module of plugins/, so a new built-in or module without them fails here."""

from __future__ import annotations

import pytest

from tests.helpers.paths import ROOT
from volcano_job_webhook.plugins.registry import BUILTINS

BEHAVIOUR = (ROOT / "docs" / "volcano-behaviour.md").read_text()


@pytest.mark.parametrize("name", list(BUILTINS))
def test_every_builtin_has_its_section_in_volcano_behaviour(name: str) -> None:
    assert f"\n## {name}\n" in BEHAVIOUR, f"docs/volcano-behaviour.md has no section '## {name}'"
    assert f"| [{name}](#{name}) |" in BEHAVIOUR, "a row in its Contents"
    assert f"\n| `{name}` |" in BEHAVIOUR, "a row in 'What each plugin touches'"
    assert f"`plugins/builtin/{name}.py`" in BEHAVIOUR, "its section names its module"


def test_every_builtin_in_the_registry_has_its_module() -> None:
    """The registry's list and the modules of plugins/builtin/ agree (that architecture.md names every
    module is tests/unit/repo/test_architecture.py's)."""
    folder = ROOT / "plugins"
    modules = {path.relative_to(folder).as_posix() for path in folder.rglob("*.py")}
    assert {f"builtin/{name}.py" for name in BUILTINS} <= modules


