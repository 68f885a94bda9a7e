"""Names shared across the package: Volcano's API, its labels and annotations, and our own.

The one home for these strings; the webhook, the reconciler and the plugins import them from here.
"""

from __future__ import annotations

# Volcano's Job API.
JOB_GROUP = "batch.volcano.sh"
JOB_VERSION = "v1alpha1"
JOB_PLURAL = "jobs"
JOB_KIND = "Job"
JOB_API_VERSION = f"{JOB_GROUP}/{JOB_VERSION}"

# What Volcano's controller records in a Job's status: each plugin it ran as "plugin-<name>" in
# status.controlledResources, and the phases a job never leaves (Aborted can be resumed).
CONTROLLED_PREFIX = "plugin-"
FINISHED_PHASES = frozenset({"Completed", "Failed", "Terminated"})
# The plugins Volcano's own job controller has (its plugins/factory.go).
VOLCANO_PLUGINS = ("ssh", "env", "svc", "tensorflow", "mpi", "pytorch", "hcclrank", "ray")

# Labels and annotations Volcano's controller puts on a job's Pods.
JOB_NAME_KEY = "volcano.sh/job-name"
JOB_NAMESPACE_KEY = "volcano.sh/job-namespace"
TASK_SPEC_KEY = "volcano.sh/task-spec"
TASK_INDEX_KEY = "volcano.sh/task-index"
QUEUE_NAME_KEY = "volcano.sh/queue-name"
GROUP_NAME_KEY = "scheduling.k8s.io/group-name"
DEFAULT_TASK = "default"

# Ours: what marks an object as made by this project, and the annotation that adds plugins to a job.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "volcano-job-webhook"
PLUGINS_ANNOTATION = "volcano-job-webhook/plugins"

# A Job's identity in caches and work queues: (namespace, name).
JobKey = tuple[str, str]
