"""Volcano's job plugins as pure functions of a job and a Pod. ``__all__`` is the public API, for running
the chain and for writing a plugin (docs/plugins.md#third-party-plugins): import from here, not from
the modules behind it, which may move.

>>> chain = Chain()
>>> result = chain.mutate(Job.from_object(job_dict), pod_dict)   # result.pod, result.warnings
>>> objects = chain.resources(Job.from_object(job_dict))         # ConfigMaps, Services, ...
"""

from .base import Existing, Mount, Plugin, PodContext, Settings
from .chain import Chain, ChainConfig, Mutation, PreparedJob
from .errors import FlagError, PluginError
from .flags import Flag, port_flag
from .helpers import (
    domain_name,
    host_names,
    peer_options,
    plugin_error,
    plugin_warning,
    require_hostnames,
    require_mount_free,
    require_name,
    require_port_free,
    template_containers,
)
from .job import Job, Task
from .keys import MANAGED_BY, MANAGED_BY_LABEL, PLUGINS_ANNOTATION
from .pod import Obj, containers, ensure_env, ensure_envs, ensure_mount, ensure_port, ensure_volume, spec
from .registry import BUILTIN_ORDER, BUILTINS, ENTRY_POINT_GROUP, Registry, default_registry
from .workloads import IndexedJob, JobSet, read_workload

__all__ = [
    "BUILTINS",
    "BUILTIN_ORDER",
    "ENTRY_POINT_GROUP",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "PLUGINS_ANNOTATION",
    "Chain",
    "ChainConfig",
    "Existing",
    "Flag",
    "FlagError",
    "IndexedJob",
    "Job",
    "JobSet",
    "Mount",
    "Mutation",
    "Obj",
    "Plugin",
    "PluginError",
    "PodContext",
    "PreparedJob",
    "Registry",
    "Settings",
    "Task",
    "containers",
    "default_registry",
    "domain_name",
    "ensure_env",
    "ensure_envs",
    "ensure_mount",
    "ensure_port",
    "ensure_volume",
    "host_names",
    "peer_options",
    "plugin_error",
    "plugin_warning",
    "port_flag",
    "read_workload",
    "require_hostnames",
    "require_mount_free",
    "require_name",
    "require_port_free",
    "spec",
    "template_containers",
]
