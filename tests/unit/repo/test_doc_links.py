"""Links between the docs keep working when a section moves: every relative link of README.md and
docs/*.md reaches a file and, where it names one, a heading; and every citation of a docs page by
anchor in the code, the tests and the fixtures (``docs/volcano-behaviour.md#limits``) reaches one."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS = sorted(path.name for path in (ROOT / "docs").glob("*.md"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            name = slug(heading.group(1))
            found.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
    return frozenset(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_its_file_and_heading(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_every_citation_of_a_docs_anchor_reaches_a_heading() -> None:
    files = subprocess.run(["git", "ls-files", "*.py", "*.yaml", "*.toml", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"(?<![\w/.])(?:docs/)?(" + "|".join(re.escape(name) for name in DOCS) + r")#([\w-]+)")
    broken = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        for doc, anchor in pattern.findall(path.read_text(errors="replace")):
            if anchor not in anchors(ROOT / "docs" / doc):
                broken.append(f"{name}: {doc}#{anchor}")
    assert not broken, broken
