"""Where plugins come from: the built-ins (Volcano's eight, plus this project's torchrun, hostfile,
jax, xgboost, paddle and waitfor), and third-party ones through the entry-point group
``volcano_webhook.plugins`` (``name = "package.module:PluginClass"``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points

from .base import Plugin
from .keys import VOLCANO_PLUGINS

ENTRY_POINT_GROUP = "volcano_webhook.plugins"
# Volcano's registration order (factory.go), the one fixed order its source shows (docs/volcano-behaviour.md#plugin-order).
# This project's own built-ins (torchrun, hostfile, jax, xgboost, paddle, waitfor) are not in it: they run after, by name.
BUILTIN_ORDER = VOLCANO_PLUGINS
# The one list of built-ins, "<module of plugins/builtin/>:<class>", the module named as the plugin.
# Everything else that needs them (the chain, the fixtures' coverage, the docs checks) reads this
# list, so a new built-in is its module and its line here. Not entry points: the built-ins must be
# there whatever the installed metadata says.
_BUILTIN_CLASSES = (
    "ssh:SSHPlugin",
    "env:EnvPlugin",
    "svc:SvcPlugin",
    "tensorflow:TensorflowPlugin",
    "mpi:MPIPlugin",
    "pytorch:PytorchPlugin",
    "hcclrank:HcclRankPlugin",
    "ray:RayPlugin",
    "torchrun:TorchrunPlugin",
    "hostfile:HostfilePlugin",
    "jax:JaxPlugin",
    "xgboost:XGBoostPlugin",
    "paddle:PaddlePlugin",
    "waitfor:WaitforPlugin",
)


def _builtin(spec: str) -> type[Plugin]:
    module, _, attr = spec.partition(":")
    cls = getattr(import_module(f".builtin.{module}", __package__), attr)
    if not (isinstance(cls, type) and issubclass(cls, Plugin)) or cls.name != module:
        raise TypeError(f"built-in {spec}: not a subclass of plugins.Plugin named {module!r}")
    return cls


BUILTINS: Mapping[str, type[Plugin]] = {cls.name: cls for cls in map(_builtin, _BUILTIN_CLASSES)}

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


def load_entry_points(registry: Registry, group: str = ENTRY_POINT_GROUP) -> None:
    """Add every plugin advertised under ``group``; a broken one is logged and skipped, so one bad
    third-party package cannot take the webhook down."""
    for ep in entry_points(group=group):
        if ep.name in BUILTINS:
            log.warning("plugin entry point %s = %s not loaded: %s is a built-in", ep.name, ep.value, ep.name)
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
