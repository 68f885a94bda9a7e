"""Bounds on what the webhook and the CLI take in, so that no input makes them recurse, build or read
without end (connection limits: :mod:`.server.connections`)."""

from __future__ import annotations

from typing import Any

from volcano_job_webhook.plugins import Job, PluginError

# Kubernetes stores no object over 1.5 MiB (etcd's request limit); a file may hold several.
MAX_INPUT_BYTES = 4 * 1024 * 1024
# A real Pod or Volcano Job nests under 20 levels; copying and diffing recurse, so stay far from Python's limit.
MAX_DEPTH = 100
# Nodes YAML aliases may add to one document once expanded (a "billion laughs" file).
MAX_ALIAS_NODES = 100_000
# The most Pods of one job the offline commands build: Kubernetes' limit for a whole cluster.
MAX_JOB_REPLICAS = 150_000


def nested_deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``value`` nests lists or objects more than ``limit`` levels deep (itself level 1);
    iterative, as it keeps recursion away from such values."""
    if type(value) is not dict and type(value) is not list:
        return False
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        children = node.values() if type(node) is dict else node
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                push((child, depth + 1))
    return False


def check_replicas(job: Job, limit: int = MAX_JOB_REPLICAS) -> None:
    """Raise :class:`PluginError` when the job's tasks have more than ``limit`` replicas in all."""
    total = sum(task.replicas for task in job.tasks)
    if total > limit:
        raise PluginError(job.key, "", "spec.tasks",
                          f"{total} replicas in all, over the {limit} the offline commands build (the most Pods a Kubernetes cluster runs)")
