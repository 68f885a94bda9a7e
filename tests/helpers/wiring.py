"""What the real-framework tests share: a Pod's wired environment (a plugin argument is
:func:`tests.helpers.jobs.set_plugin_arg`)."""

from __future__ import annotations

import copy
import random
import socket
from pathlib import Path
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


def unused_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on, on any address: below the kernel's ephemeral
    range, above Ray's default worker ports (10002-19999)."""
    # Not free_port()'s ephemeral ones: any outgoing connection on the machine can take one of those
    # before the framework's server binds it, and a worker whose server cannot start leaves the
    # others of its job waiting for it.
    try:
        top = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        top = 32768
    found: list[int] = []
    for _ in range(1000):
        port = random.randrange(20000, max(top, 21000))
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        if port not in found:
            found.append(port)
        if len(found) == count:
            return found
    raise AssertionError(f"found only {len(found)} of {count} unused ports in 1000 tries")




# What each Pod of a JAX job runs in the framework tests: join the cluster the plugin describes, say so.
JAX_PROGRAM = """
import os, jax
jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
print("JOINED", jax.process_index(), jax.process_count(), flush=True)
jax.distributed.shutdown()
"""
