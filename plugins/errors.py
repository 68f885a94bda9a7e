"""Errors of the plugin chain: each names the job, the plugin and the argument or field at fault, so
that a denial can be acted on without reading our source."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class PluginError(ValueError):
    """A job's plugin configuration, or a Pod, cannot be wired: ``job`` is ``namespace/name``, ``plugin``
    the plugin (``""`` for the chain's own problems), ``field`` the argument or object field at fault."""

    def __init__(self, job: str, plugin: str, field: str, reason: str) -> None:
        self.job = job
        self.plugin = plugin
        self.field = field
        self.reason = reason
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [f"job {self.job}"]
        if self.plugin:
            parts.append(f"plugin {self.plugin}")
        if self.field:
            parts.append(self.field)
        return ": ".join(parts) + f": {self.reason}"


class FlagError(ValueError):
    """A plugin argument list that does not parse, raised before the job and plugin are known (the chain
    turns it into a :class:`PluginError`)."""

    def __init__(self, flag: str, reason: str) -> None:
        self.flag = flag
        self.reason = reason
        super().__init__(f"{flag}: {reason}" if flag else reason)


def did_you_mean(given: str, choices: Iterable[str], show: Callable[[str], str] = str) -> str:
    """``"; did you mean X?"`` for the choice closest to ``given`` (difflib, ignoring case: names are
    case-sensitive, so ``Svc`` is a typo of ``svc``), shown with ``show``; ``""`` when none is close."""
    by_folded: dict[str, str] = {}
    for choice in choices:
        by_folded.setdefault(choice.lower(), choice)
    close = difflib.get_close_matches(given.lower(), list(by_folded), n=1)
    return f"; did you mean {show(by_folded[close[0]])}?" if close else ""
