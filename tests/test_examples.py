"""The example jobs as a user takes them: files ``kubectl apply -f`` can apply again and again, so
nothing in them that the API server assigns (a uid is immutable: a second apply of a file that names
one is refused). That they survive apply, apply again, server-side apply, delete and apply on a real
API server is tests/test_envtest_examples.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES

EXAMPLE_FILES = sorted((EXAMPLES / "jobs").glob("*.yaml")) + sorted((EXAMPLES / "workloads").glob("*.yaml"))
ASSIGNED = {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink"}


def load(path: Path) -> dict:
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(obj, dict), path
    return obj


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_example_names_nothing_the_api_server_assigns(path: Path) -> None:
    obj = load(path)
    assert not ASSIGNED & obj["metadata"].keys(), f"{path.name}: metadata.{sorted(ASSIGNED & obj['metadata'].keys())}"
    assert "status" not in obj
