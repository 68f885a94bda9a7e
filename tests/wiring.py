"""What the real-framework tests share: a Pod's wired environment, a plugin argument."""

from __future__ import annotations

import copy
import json
from typing import Any

from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.keys import PLUGINS_ANNOTATION
from volcano_job_webhook.plugins.podgen import make_pod


def injected_env(job_obj: dict[str, Any], task: str, index: int, prefix: str) -> dict[str, str]:
    """The variables starting with ``prefix`` that the chain gives the one container of Pod ``index``
    of ``task`` (``job_obj`` is left as it is)."""
    job = Job.from_object(copy.deepcopy(job_obj))
    pod = Chain().mutate(job, make_pod(job, task, index)).pod
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if e["name"].startswith(prefix)}


def set_plugin_arg(job_obj: dict[str, Any], plugin: str, flag: str, value: object) -> None:
    """Give ``plugin`` ``--flag=value`` in the job's plugins annotation, in place of any ``--flag`` it had."""
    annotations = job_obj["metadata"]["annotations"]
    plugins = json.loads(annotations[PLUGINS_ANNOTATION])
    plugins[plugin] = [a for a in plugins[plugin] if not a.startswith(f"--{flag}")] + [f"--{flag}={value}"]
    annotations[PLUGINS_ANNOTATION] = json.dumps(plugins)

