"""What the real-framework tests share: a Pod's wired environment (a plugin argument is
:func:`tests.jobs.set_plugin_arg`)."""

from __future__ import annotations

import copy
from typing import Any

from volcano_job_webhook.plugins import Chain, read_workload
from volcano_job_webhook.plugins.podgen import make_pod


def injected_env(job_obj: dict[str, Any], task: str, index: int, prefix: str) -> dict[str, str]:
    """The variables starting with ``prefix`` that the chain gives the one container of Pod ``index``
    of ``task`` (``job_obj``, a Volcano Job, Indexed Job or JobSet, is left as it is)."""
    job = read_workload(copy.deepcopy(job_obj))
    pod = Chain().mutate(job, make_pod(job, task, index)).pod
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if e["name"].startswith(prefix)}




# What each Pod of a JAX job runs in the framework tests: join the cluster the plugin describes, say so.
JAX_PROGRAM = """
import os, jax
jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
print("JOINED", jax.process_index(), jax.process_count(), flush=True)
jax.distributed.shutdown()
"""
