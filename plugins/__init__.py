"""Volcano's job plugins as pure functions of a job and a Pod.

>>> chain = Chain()
>>> result = chain.mutate(Job.from_object(job_dict), pod_dict)   # result.pod, result.warnings
>>> objects = chain.resources(Job.from_object(job_dict))         # ConfigMaps, Services, ...
"""

from .base import Plugin, PodContext, Settings
from .chain import Chain, ChainConfig, Mutation, PreparedJob
from .errors import FlagError, PluginError
from .flags import Flag, port_flag
from .job import Job, Task
from .keys import MANAGED_BY, MANAGED_BY_LABEL, PLUGINS_ANNOTATION
from .registry import BUILTIN_ORDER, ENTRY_POINT_GROUP, Registry, default_registry

__all__ = [
    "BUILTIN_ORDER",
    "ENTRY_POINT_GROUP",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "PLUGINS_ANNOTATION",
    "Chain",
    "ChainConfig",
    "Flag",
    "FlagError",
    "Job",
    "Mutation",
    "Plugin",
    "PluginError",
    "PodContext",
    "PreparedJob",
    "Registry",
    "Settings",
    "Task",
    "default_registry",
    "port_flag",
]
