"""Command-line tools the tests run (kubectl, helm), found the same way each: ``$VAR`` (when set, it
alone decides; set it empty to turn the tests that need the tool off), further places the tool
names (envtest's ``$KUBEBUILDER_ASSETS`` for kubectl), ``PATH``, and
``${XDG_CACHE_HOME:-~/.cache}/volcano-job-webhook/bin/``, where ``.ci/run`` puts them. Without one,
:meth:`Tool.or_skip` skips the test naming what it looked for."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Tool:
    name: str
    env: str
    # Places looked in before PATH, from the environment, and how to say them in a skip reason.
    before_path: Callable[[Mapping[str, str]], list[Path]] = field(default=lambda environ: [])
    before_path_text: str = ""

    def cached(self, environ: Mapping[str, str] = os.environ) -> Path:
        """Where ``.ci/run`` installs the tool when this machine has none."""
        cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(cache) / "volcano-job-webhook" / "bin" / self.name

    def find(self, environ: Mapping[str, str] = os.environ) -> Path | None:
        if self.env in environ:
            explicit = environ[self.env]
            return Path(explicit) if explicit and os.access(explicit, os.X_OK) else None
        candidates = self.before_path(environ)
        on_path = shutil.which(self.name, path=environ.get("PATH"))
        candidates += [Path(on_path)] if on_path else []
        candidates.append(self.cached(environ))
        return next((c for c in candidates if os.access(c, os.X_OK)), None)

    def missing(self) -> str:
        """The skip reason: what was looked for."""
        if self.env in os.environ:
            if not os.environ[self.env]:
                return f"{self.name}: {self.env} is set empty, which turns the tests that need it off"
            return f"{self.name} not found: {self.env}={os.environ[self.env]} is not an executable"
        return (f"{self.name} not found (${self.env}, {self.before_path_text}PATH, {self.cached()}); "
                f".ci/run installs it there, or set {self.env}")

    def or_skip(self) -> Path:
        found = self.find()
        if found is None:
            pytest.skip(self.missing())
        return found
