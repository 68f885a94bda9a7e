"""Where plugins come from: the built-ins (Volcano's eight, plus this project's torchrun, hostfile,
jax, xgboost, paddle and waitfor), and third-party ones through the entry-point group
``volcano_webhook.plugins`` (``name = "package.module:PluginClass"``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from functools import cache
from importlib.metadata import entry_points

from .base import Plugin
from .builtin.env import EnvPlugin
from .builtin.hcclrank import HcclRankPlugin
from .builtin.hostfile import HostfilePlugin
from .builtin.jax import JaxPlugin
from .builtin.mpi import MPIPlugin
from .builtin.paddle import PaddlePlugin
from .builtin.pytorch import PytorchPlugin
from .builtin.ray import RayPlugin
from .builtin.ssh import SSHPlugin
from .builtin.svc import SvcPlugin
from .builtin.tensorflow import TensorflowPlugin
from .builtin.torchrun import TorchrunPlugin
from .builtin.waitfor import WaitforPlugin
from .builtin.xgboost import XGBoostPlugin
from .keys import VOLCANO_PLUGINS

ENTRY_POINT_GROUP = "volcano_webhook.plugins"
# Volcano's registration order (factory.go), the one fixed order its source shows (docs/volcano-behaviour.md#plugin-order).
# This project's own built-ins (torchrun, hostfile, jax, xgboost, paddle, waitfor) are not in it: they run after, by name.
BUILTIN_ORDER = VOLCANO_PLUGINS
BUILTINS: Mapping[str, type[Plugin]] = {
    cls.name: cls
    for cls in (
        SSHPlugin, EnvPlugin, SvcPlugin, TensorflowPlugin, MPIPlugin, PytorchPlugin, HcclRankPlugin, RayPlugin,
        TorchrunPlugin, HostfilePlugin, JaxPlugin, XGBoostPlugin, PaddlePlugin, WaitforPlugin,
    )
}

log = logging.getLogger(__name__)


class Registry:
    """Plugin classes by name. Names are case-sensitive, as in Volcano."""

    def __init__(self, plugins: Iterable[type[Plugin]] = ()) -> None:
        self._plugins: dict[str, type[Plugin]] = {}
        for cls in plugins:
            self.register(cls)

    def register(self, cls: type[Plugin]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Plugin)) or not cls.name:
            raise TypeError(f"{cls!r} is not a named subclass of plugins.Plugin")
        self._plugins[cls.name] = cls

    def get(self, name: str) -> type[Plugin] | None:
        return self._plugins.get(name)

    def names(self) -> list[str]:
        return sorted(self._plugins)

    def __contains__(self, name: object) -> bool:
        return name in self._plugins


def load_entry_points(registry: Registry, group: str = ENTRY_POINT_GROUP) -> None:
    """Add every plugin advertised under ``group``; a broken one is logged and skipped, so one bad
    third-party package cannot take the webhook down."""
    for ep in entry_points(group=group):
        if ep.name in BUILTINS:
            continue
        try:
            cls = ep.load()
            registry.register(cls)
        except Exception as exc:  # a third party's import error must not stop the server
            log.error("plugin entry point %s = %s not loaded: %s", ep.name, ep.value, exc)
            continue
        if cls.name != ep.name:
            log.warning("plugin entry point %s loads a plugin named %s", ep.name, cls.name)


@cache
def default_registry() -> Registry:
    """The built-ins plus everything installed under the entry-point group (built once)."""
    registry = Registry(BUILTINS.values())
    load_entry_points(registry)
    return registry
