"""The labels and annotations of Volcano, of Kubernetes' Job and JobSet controllers, and ours: one home
for each string (the kinds themselves are :mod:`.kinds`')."""

from __future__ import annotations

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
# A job's choice of where our plugins' variables go, over the setting (Settings.env_placement).
ENV_PLACEMENT_ANNOTATION = "volcano-job-webhook/env-placement"
ENV_PLACEMENTS = ("last", "first")

# Kubernetes Indexed Jobs and JobSets, wired when they opt in (docs/workloads.md): the opt-in label on
# their Pod template (the webhook's objectSelector), and what their controllers put on each Pod.
OPT_IN_LABEL = "volcano-job-webhook/enabled"
TASK_ANNOTATION = "volcano-job-webhook/task"
BATCH_JOB_NAME_KEY = "batch.kubernetes.io/job-name"
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_KEY = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
