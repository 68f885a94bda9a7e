"""The plugin chain: which plugins a job runs, with what arguments and in what order, and what they make
of a Pod (docs/volcano-behaviour.md#plugin-configuration, docs/volcano-behaviour.md#plugin-order)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .base import Existing, Mount, Plugin, PodContext, Settings
from .budget import STORE_LIMIT, STORE_LIMIT_TEXT
from .errors import FlagError, PluginError, did_you_mean
from .flags import go_prefix, shown, volcano_flags
from .job import Job, Task
from .keys import ENV_PLACEMENT_ANNOTATION, ENV_PLACEMENTS, PLUGINS_ANNOTATION
from .pod import Obj, env_names, move_env_first
from .registry import BUILTIN_ORDER, Registry, default_registry


@dataclass(frozen=True)
class ChainConfig:
    """Server-side choices: plugin order, the plugins allowed, plugins every job gets, settings."""

    order: tuple[str, ...] = BUILTIN_ORDER
    allowed: frozenset[str] | None = None
    defaults: Mapping[str, Sequence[str]] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)
    # The plugins Volcano's own job controller runs when a job names them in spec.plugins (its
    # built-ins, on a cluster where it runs): their Pod wiring and side objects are Volcano's, and
    # they are never our reason to refuse a Pod (docs/install.md#who-runs-what). Empty: we run all.
    volcano_plugins: frozenset[str] = frozenset()


def _sized_copy(value: Obj) -> tuple[Obj, int]:
    """A deep copy of a JSON document (several times faster than ``copy.deepcopy`` on the hot path)
    and its size as compact JSON (0 when it is not plain JSON)."""
    try:
        raw = orjson.dumps(value)
        return orjson.loads(raw), len(raw)
    except TypeError:  # not plain JSON (a caller's own objects): copy it the slow way
        return copy.deepcopy(value), 0


def json_size(value: Obj) -> int:
    """Size of ``value`` as compact JSON, an upper bound of what etcd stores for it (0 when it is
    not plain JSON)."""
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return 0


@dataclass
class Mutation:
    """What the chain made of one Pod: the new Pod, the plugins that ran, and warnings."""

    pod: Obj
    plugins: list[str]
    warnings: list[str]


def _annotation_plugins(job: Job) -> dict[str, list[str]]:
    raw = job.annotations.get(PLUGINS_ANNOTATION)
    if raw is None:
        return {}
    field_name = f"metadata.annotations[{PLUGINS_ANNOTATION}]"
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise PluginError(job.key, "", field_name, f"is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise PluginError(job.key, "", field_name, 'must be a JSON object such as {"jax": ["--port=1234"]}')
    return value


def _env_first(job: Job, settings: Settings) -> bool:
    """Whether our plugins' variables go before each container's own: the job's annotation, else
    the server's ``env_placement``."""
    placement = job.annotations.get(ENV_PLACEMENT_ANNOTATION, settings.env_placement)
    if placement not in ENV_PLACEMENTS:
        raise PluginError(job.key, "", f"metadata.annotations[{ENV_PLACEMENT_ANNOTATION}]",
                          f"must be first or last, got {shown(placement)}")
    return placement == "first"


@dataclass(frozen=True)
class PreparedJob:
    """A job with its plugins built and checked, in chain order, with who runs each: what wiring each
    of its Pods needs.

    Plugins hold no per-Pod state, so one PreparedJob serves all of a job's Pods (the webhook keeps
    one per Job snapshot)."""

    job: Job
    plugins: tuple[Plugin, ...]
    warnings: tuple[str, ...]
    settings: Settings
    # Run by Volcano's own controller: it wires their part of each Pod before the Pod reaches us,
    # and makes their side objects.
    volcano: frozenset[str] = frozenset()
    # Of those, the ones we would refuse (bad arguments past Go's parse, a failed check): never
    # applied by us, whatever the caller asks.
    failed: frozenset[str] = frozenset()
    # Our plugins' variables before the container's own (the job's annotation, else the setting).
    env_first: bool = False
    injected_init: frozenset[str] = field(init=False)
    names: tuple[str, ...] = field(init=False)
    ours: tuple[Plugin, ...] = field(init=False)
    applied: tuple[Plugin, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "injected_init", frozenset().union(*(p.injected_init_containers() for p in self.plugins)))
        object.__setattr__(self, "names", tuple(p.name for p in self.plugins))
        object.__setattr__(self, "applied", tuple(p for p in self.plugins if p.name not in self.failed))
        object.__setattr__(self, "ours", tuple(p for p in self.applied if p.name not in self.volcano))

    def mutate(self, pod: Obj, *, volcano_wired: bool = False) -> Mutation:
        """Run the plugins on a copy of ``pod``; raises :class:`PluginError` when it cannot be wired.

        ``volcano_wired``: the Pod comes from Volcano's controller, which has wired it with the
        plugins it runs (:attr:`volcano`); only ours run. Otherwise every plugin runs, as the Pod
        would be once both have (the offline commands)."""
        return self._run(pod, self.ours if volcano_wired else self.applied)

    def volcano_part(self, pod: Obj) -> Mutation:
        """``pod`` as Volcano's controller creates it: wired by the plugins it runs, and no other
        (what our webhook receives; ``volcano-webhook review``)."""
        return self._run(pod, tuple(p for p in self.applied if p.name in self.volcano))

    def _run(self, pod: Obj, plugins: tuple[Plugin, ...]) -> Mutation:
        job = self.job
        name = job.task_of(pod)
        task = job.task(name)
        if task is None:
            tasks = [t.name for t in job.tasks]
            raise PluginError(job.key, "", job.task_field,
                              f"the Pod's task {name!r} is not in {job.tasks_field} ({', '.join(tasks)}){did_you_mean(name, tasks, repr)}")
        ctx = self._context(pod, task)
        # Placed first: the variables of the plugins we run, never those of Volcano's controller, which
        # writes its own after the container's (volcano_part, and a combined run, leave them there).
        kept = env_names(ctx.pod) if self.env_first and any(p.name not in self.volcano for p in plugins) else None
        for plugin in plugins:
            if kept is None or plugin.name not in self.volcano:
                plugin.mutate(ctx)
                continue
            before = env_names(ctx.pod)
            plugin.mutate(ctx)
            for key, names in env_names(ctx.pod).items():
                kept.setdefault(key, set()).update(names - before.get(key, set()))
        if kept is not None:
            move_env_first(ctx.pod, kept)
        # Only with the setting: without it the Pods are as Volcano's plugins make them (short names).
        if self.settings.cluster_domain and ctx.hosts_named_by - self.volcano:
            _resolve_cluster_names(ctx)
        wired = json_size(ctx.pod)
        if wired > STORE_LIMIT and wired > ctx.input_bytes:
            raise self._too_large(pod, task, wired, plugins)
        return Mutation(ctx.pod, [p.name for p in plugins], list(dict.fromkeys(ctx.warnings)))

    def _context(self, pod: Obj, task: Task) -> PodContext:
        """``pod``'s context, on a copy of it, with the job's warnings."""
        copied, size = _sized_copy(pod)
        injected = self.injected_init
        if injected:
            # An init container the task's template defines itself is the user's, not injected:
            # every plugin wires it, as in Volcano, where it exists before any plugin runs.
            own = (task.template.get("spec") or {}).get("initContainers") or []
            injected = injected - {c.get("name") for c in own if isinstance(c, dict)}
        return PodContext(self.job, copied, task, self.settings, list(self.warnings), injected, size)

    def _too_large(self, pod: Obj, task: Task, wired: int, plugins: Sequence[Plugin]) -> PluginError:
        """The error for a Pod the chain made too large to store, naming the plugin that crossed the
        limit. Every value a plugin adds is bounded already (budget), so replaying the chain to
        find it costs no more than the first run."""
        ctx = self._context(pod, task)
        culprit, added, before = "", 0, ctx.input_bytes
        for plugin in plugins:
            plugin.mutate(ctx)
            after = json_size(ctx.pod)
            if after > STORE_LIMIT and after > before and not culprit:
                culprit, added = plugin.name, after - before
            before = after
        name = (pod.get("metadata") or {}).get("name") or "?"
        return PluginError(
            self.job.key,
            culprit,
            "Pod",
            f"Pod {name!r} of task {task.name!r} would be {wired} bytes once wired ({ctx.input_bytes} as it came, "
            f"{added} added by this plugin), over {STORE_LIMIT_TEXT}",
        )


def _resolve_cluster_names(ctx: PodContext) -> None:
    """A Pod on the host's network given host names by a plugin we run: with ``dnsPolicy``
    ``ClusterFirst`` (the API server's default) or none, the kubelet gives it the node's resolver,
    which knows no cluster name; ``ClusterFirstWithHostNet`` gives it the cluster's DNS. Any other
    policy is the template's choice and stays (``Default`` with a warning)."""
    pod_spec = ctx.pod.get("spec")
    if not isinstance(pod_spec, dict) or pod_spec.get("hostNetwork") is not True:
        return
    policy = pod_spec.get("dnsPolicy")
    if policy in (None, "", "ClusterFirst"):
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    elif policy == "Default":
        ctx.warnings.append(
            f"job {ctx.job.key}: Pod {ctx.pod_name!r} is on the host's network with dnsPolicy Default: the node's "
            "resolver answers, and the host names the plugins wrote resolve only if it knows the cluster's names "
            "(ClusterFirstWithHostNet would resolve them)"
        )


def _volcano_flag_error(job: Job, cls: type[Plugin], error: FlagError) -> PluginError:
    """A flag error of a plugin Volcano's controller runs, read with Volcano's flags; a flag only our
    implementation has is named as such."""
    reason = error.reason
    ours = {f"--{name}" for flag in cls.flags if flag.ours for name in (flag.name, *flag.aliases)}
    if error.flag in ours:
        reason += (f"; {error.flag} is a flag of this project's {cls.name} only, and Volcano's controller, which "
                   f"runs {cls.name} for this job (spec.plugins names it), does not define it: it stops reading "
                   f"the arguments there (docs/install.md#who-runs-what)")
    return PluginError(job.key, cls.name, error.flag or "arguments", reason)


def _check_mounts(job: Job, plugins: Sequence[Plugin], lenient: frozenset[str] = frozenset()) -> list[str]:
    """Two plugins that mount different volumes at one path make every Pod invalid ("must be unique").
    The error goes to the plugin whose argument chose the path (ssh's ``--ssh-key-file-path``, ...);
    between two plugins Volcano's controller runs (``lenient``) it is only a warning, and between one
    of those and one of ours it goes to ours. Returns the warnings."""
    warnings: list[str] = []
    claimed: dict[str, tuple[Plugin, Mount]] = {}
    for plugin in plugins:
        for mount in plugin.mounts():
            first, taken = claimed.setdefault(mount.path, (plugin, mount))
            if taken.volume == mount.volume:
                continue
            blamed, other, mine, theirs = plugin, first, mount, taken
            if (first.name not in lenient and plugin.name in lenient) or (
                    (first.name in lenient) == (plugin.name in lenient)
                    and not mount.field.startswith("-") and taken.field.startswith("-")):
                blamed, other, mine, theirs = first, plugin, taken, mount
            error = PluginError(
                job.key,
                blamed.name,
                mine.field,
                f"mounts volume {mine.volume!r} at {mine.path!r}, where plugin {other.name} mounts volume "
                f"{theirs.volume!r}; the API server requires a container's mount paths to be unique",
            )
            if blamed.name not in lenient:
                raise error
            warnings.append(f"{error} (run by Volcano's controller, which does not check this)")
    return warnings


class Chain:
    """Runs a job's plugins. Pure: no I/O, and inputs are never modified."""

    def __init__(self, registry: Registry | None = None, config: ChainConfig | None = None) -> None:
        self.registry = registry or default_registry()
        self.config = config or ChainConfig()

    def volcano_runs(self, job: Job) -> frozenset[str]:
        """The plugins of ``job`` that Volcano's own job controller runs: those named in
        ``spec.plugins`` that it is configured to run (``ChainConfig.volcano_plugins``) or that its
        ``status.controlledResources`` shows it ran. Their Pod wiring and side objects are Volcano's
        (docs/install.md#who-runs-what)."""
        runs = self.config.volcano_plugins
        return frozenset(name for name in job.plugins if name in runs or name in job.controlled)

    def _plugin_args(self, job: Job, volcano: frozenset[str]) -> tuple[dict[str, list[str]], list[str]]:
        """The plugin map, and the plugins the annotation names again with other arguments than
        the ``spec.plugins`` Volcano's controller runs them with."""
        annotated = _annotation_plugins(job)
        merged: dict[str, Any] = {**self.config.defaults, **job.plugins, **annotated}
        overridden = [name for name in annotated if name in volcano and annotated[name] != job.plugins[name]]
        for name in volcano:
            merged[name] = job.plugins[name]
        for name in list(merged):
            cls = self.registry.get(name)
            for dependency in cls.requires if cls else ():
                merged.setdefault(dependency, [])
        for name, args in merged.items():
            if args is None:
                merged[name] = []
            elif isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
                if name in volcano:  # Volcano's CRD allows only string lists; nothing for us to run
                    merged[name] = []
                    continue
                raise PluginError(job.key, name, "arguments", f"must be a list of strings, got {shown(args)}")
        return merged, overridden

    def _rank(self, name: str) -> tuple[int, str]:
        order = self.config.order
        return (order.index(name), "") if name in order else (len(order), name)

    def prepare(self, job: Job, *, strict: bool = False) -> PreparedJob:
        """The job's plugins built and checked once, in chain order, with who runs each: ready to wire
        any number of its Pods.

        ``strict`` judges every plugin (``/validate`` of a new Job). Otherwise a plugin Volcano's
        controller runs is never our reason to refuse: it is built as Volcano's controller builds
        it (Go's ``flag`` keeps the flags before a bad one), and what we would refuse of it becomes
        a warning (docs/install.md#who-runs-what). Raises :class:`PluginError` for the plugins we run."""
        volcano = self.volcano_runs(job)
        merged, overridden = self._plugin_args(job, volcano)
        env_first = _env_first(job, self.config.settings)
        warnings: list[str] = []
        for name in overridden:
            problem = PluginError(
                job.key, name, f"metadata.annotations[{PLUGINS_ANNOTATION}]",
                f"names plugin {name} again with other arguments; Volcano's controller runs it with those of "
                "spec.plugins, which are the ones that count: name it in one place",
            )
            if strict:
                raise problem
            warnings.append(str(problem))
        built: list[Plugin] = []
        failed: set[str] = set()
        for name, args in sorted(merged.items(), key=lambda item: self._rank(item[0])):
            cls = self.registry.get(name)
            lenient = name in volcano and not strict
            # What Volcano's controller runs, it runs with its own flags and short host names.
            settings = self.config.settings.as_volcano() if name in volcano else self.config.settings
            if cls is None:
                if name in volcano:
                    warnings.append(f"job {job.key}: plugin {name} is run by Volcano's controller; this webhook does not know it")
                    continue
                # The plugin's name is the argument at fault, and PluginError names it already.
                known = self.registry.names()
                raise PluginError(job.key, name, "", f"unknown plugin{did_you_mean(name, known)} (known: {', '.join(known)})")
            if self.config.allowed is not None and name not in self.config.allowed and name not in volcano:
                raise PluginError(job.key, name, "", "not allowed by this server")
            refused = job.refused.get(name)
            if refused:
                raise PluginError(job.key, name, "plugin", refused)
            # Without an error, what Go's flag keeps is every argument.
            kept, error = go_prefix(volcano_flags(cls.flags), list(args)) if name in volcano else (list(args), None)
            if error is not None and not lenient:
                raise _volcano_flag_error(job, cls, error)
            if error is not None:
                warnings.append(
                    f"{_volcano_flag_error(job, cls, error)}; Volcano's controller "
                    f"only logs this and runs the plugin with the {len(kept)} argument(s) before it"
                )
            try:  # a plugin's own constructor may refuse more than its flags: then it is not built
                plugin = cls(job, kept, settings, peers=merged)
                built.append(plugin)
                warnings.extend(plugin.check())
            except PluginError as exc:
                if not lenient:
                    raise
                warnings.append(f"{exc} (run by Volcano's controller, which does not check this)")
                failed.add(name)
        warnings.extend(_check_mounts(job, built, volcano if not strict else frozenset()))
        return PreparedJob(job, tuple(built), tuple(dict.fromkeys(warnings)), self.config.settings, volcano, frozenset(failed), env_first)

    def check(self, job: Job) -> list[str]:
        """Validate the job's plugin configuration without a Pod (``/validate``), every plugin
        strictly, those Volcano's controller runs included; returns warnings."""
        return list(self.prepare(job, strict=True).warnings)

    def mutate(self, job: Job, pod: Obj) -> Mutation:
        """Run every plugin on a copy of ``pod``. Raises :class:`PluginError` when the job or the Pod
        cannot be wired. Wiring many Pods of one job: :meth:`prepare` once, then
        :meth:`PreparedJob.mutate`."""
        return self.prepare(job).mutate(pod)

    def resources(self, job: Job, existing: Existing | None = None) -> list[Obj]:
        """The side objects the plugins we run want, in chain order; those of the plugins Volcano's
        controller runs are Volcano's to make. ``existing`` (the job's live managed objects by kind
        and name) lets plugins keep state such as SSH keys."""
        prepared = self.prepare(job)
        return [obj for plugin in prepared.plugins if plugin.name not in prepared.volcano for obj in plugin.resources(existing)]
