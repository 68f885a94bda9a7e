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


