"""Third-party plugins through entry points, and where the server's settings come from."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import EntryPoint

import pytest

from tests.helpers.jobs import task, volcano_job
from tests.helpers.paths import ROOT
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.plugins import Chain, ChainConfig, Flag, Job, Plugin, PodContext, containers, ensure_envs, registry
from volcano_job_webhook.plugins.keys import VOLCANO_PLUGINS


class GreetPlugin(Plugin):
    name = "greet"
    flags = (Flag("greeting", "string", "hello"),)
    requires = ("env",)

    def mutate(self, ctx: PodContext) -> None:
        for container in containers(ctx.pod):
            ensure_envs(container, [("GREETING", self.options["greeting"], None)])


def fake_entry_points(group: str) -> list[EntryPoint]:
    assert group == "volcano_webhook.plugins"
    return [
        EntryPoint("greet", f"{__name__}:GreetPlugin", group),
        EntryPoint("broken", "no_such_module:Nothing", group),
        EntryPoint("env", "volcano_job_webhook.plugins.builtin.env:EnvPlugin", group),
    ]


def test_third_party_plugins_load_from_entry_points_and_run_after_the_builtins(monkeypatch, caplog):
    monkeypatch.setattr(registry, "entry_points", lambda group: fake_entry_points(group))
    reg = registry.Registry(registry.BUILTINS.values())
    registry.load_entry_points(reg)
    assert "greet" in reg.names() and "broken" not in reg.names()
    assert "plugin entry point broken = no_such_module:Nothing not loaded" in caplog.text
    assert "plugin entry point env = volcano_job_webhook.plugins.builtin.env:EnvPlugin not loaded: env is a built-in" in caplog.text
    job = Job.from_object(volcano_job("j", namespace=None, plugins={"greet": ["--greeting=hi"]}, tasks=[task("w", container="c", image="x")]))
    chain = Chain(reg)
    assert [p.name for p in chain.prepare(job, strict=True).plugins] == ["env", "greet"]  # requires added; built-ins first
    pod = {"metadata": {"name": "j-w-0", "annotations": {"volcano.sh/task-spec": "w"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    env = chain.mutate(job, pod).pod["spec"]["containers"][0]["env"]
    assert env[-1] == {"name": "GREETING", "value": "hi"}


def test_the_registry_is_the_one_list_of_builtins() -> None:
    """Each built-in is plugins/builtin/<name>.py, Volcano's eight are among them, and none is an entry
    point as well (a second list, which the registry would skip)."""
    for name, cls in registry.BUILTINS.items():
        assert cls.__module__ == f"volcano_job_webhook.plugins.builtin.{name}"
    assert set(VOLCANO_PLUGINS) <= set(registry.BUILTINS)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    advertised = project.get("entry-points", {}).get(registry.ENTRY_POINT_GROUP, {})
    assert not set(advertised) & set(registry.BUILTINS), advertised


def test_a_plugin_knows_its_peers_from_its_constructor() -> None:
    """The chain gives every plugin the plugins it runs beside (server defaults included); built on
    its own, a plugin knows the job's spec.plugins."""
    from volcano_job_webhook.plugins.builtin.torchrun import TorchrunPlugin

    job = Job.from_object(volcano_job("j", namespace=None, plugins={"pytorch": ["--port=1111"]}, tasks=[task("master", container="c", image="x")]))
    alone = TorchrunPlugin(job, [])
    assert alone.peers == {"pytorch": ["--port=1111"]} and alone.port == 1111
    assert TorchrunPlugin(job, [], peers={"torchrun": []}).port == 29500
    chain = Chain(config=ChainConfig(defaults={"torchrun": [], "pytorch": ["--port=2222"]}))
    built = {p.name: p for p in chain.prepare(job, strict=True).plugins}
    assert built["torchrun"].peers == {"torchrun": [], "pytorch": ["--port=1111"], "svc": []}
    assert built["torchrun"].port == 1111
    assert all(p.peers is built["pytorch"].peers for p in built.values())


def test_settings_flags_over_environment_over_yaml(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("port: 9443\nlog_level: debug\ndefault_plugins: {env: []}\nallowed_plugins: [env, svc]\n")
    monkeypatch.setenv("VOLCANO_WEBHOOK_LOG_LEVEL", "warning")
    settings = load_settings(str(config), port=None)
    assert (settings.port, settings.log_level, settings.default_plugins) == (9443, "warning", {"env": []})
    assert load_settings(str(config), port=7443).port == 7443
    chain_config = settings.chain_config()
    assert chain_config.allowed == frozenset({"env", "svc"}) and chain_config.defaults == {"env": []}


def test_bad_settings_are_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("port: 70000\n")
    with pytest.raises(ValueError, match=r"\nport\n +Input should be less than or equal to 65535"):
        load_settings(str(config))
    config.write_text("prot: 1\n")
    with pytest.raises(ValueError, match=r"\nprot\n +Extra inputs are not permitted"):
        load_settings(str(config))


def test_the_docs_third_party_example_runs_as_written():
    """docs/plugins.md's third-party plugin, executed from the page itself, imports only the public
    API and wires a Pod in a chain."""
    page = (ROOT / "docs" / "plugins.md").read_text()
    section = page[page.index("## Third-party plugins"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    assert re.findall(r"^(?:from|import) (\S+)", code, re.MULTILINE) == ["volcano_job_webhook.plugins"]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/plugins.md", "exec"), namespace)
    cls = namespace["MyPlugin"]
    reg = registry.Registry([*registry.BUILTINS.values(), cls])
    job = Job.from_object(volcano_job("j", namespace=None, plugins={"myplugin": ["--greeting=hi"]}, tasks=[task("w", container="c", image="x")]))
    pod = {"metadata": {"name": "j-w-0", "annotations": {"volcano.sh/task-spec": "w"}},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    result = Chain(reg).mutate(job, pod)
    assert {"name": "GREETING", "value": "hi"} in result.pod["spec"]["containers"][0]["env"]
    assert result.plugins == ["svc", "myplugin"], "svc comes in through requires, built-ins first"
    quiet = Job.from_object({**job.raw, "spec": {**job.raw["spec"], "plugins": {"myplugin": ["--greeting="]}}})
    assert "job default/j: plugin myplugin: --greeting is empty" in Chain(reg).check(quiet)
