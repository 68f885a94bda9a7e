"""The docs keep up with the code: what they list, they list from the registry's built-ins, so a new
built-in without its documentation fails here."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from volcano_job_webhook.plugins.registry import BUILTINS

BEHAVIOUR = (ROOT / "docs" / "volcano-behaviour.md").read_text()


@pytest.mark.parametrize("name", list(BUILTINS))
def test_every_builtin_has_its_section_in_volcano_behaviour(name: str) -> None:
    assert f"\n## {name}\n" in BEHAVIOUR, f"docs/volcano-behaviour.md has no section '## {name}'"
    assert f"| [{name}](#{name}) |" in BEHAVIOUR, "a row in its Contents"
    assert f"\n| `{name}` |" in BEHAVIOUR, "a row in 'What each plugin touches'"
    assert f"`plugins/builtin/{name}.py`" in BEHAVIOUR, "its section names its module"
