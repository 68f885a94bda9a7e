"""The Jobs of bench/scale.py, and their side objects as the reconciler makes them.

A Job here is what a cluster of training jobs holds: two tasks (master ×1, worker ×2), a container
with a command, 12 environment variables, resources, two volume mounts and a port, about 3.4 KB as
JSON. Its plugins (env, svc, pytorch) are named in the annotation ``volcano-job-webhook/plugins``,
which is how users run ours beside Volcano's controller: plugins named in ``spec.plugins`` are that
controller's by default, and would leave the reconciler nothing to own. A job that runs owns three
objects (a ConfigMap ``<job>-svc``, a Service and a NetworkPolicy ``<job>``); a finished one
(``status.state.phase`` Completed) owns none.

Everything is a function of the job's index, so the driver and the API-server double's process
agree on every name and uid without passing objects between them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain, Job, default_registry
from volcano_job_webhook.plugins.keys import PLUGINS_ANNOTATION

Obj = dict[str, Any]
NAMESPACES = 50
PLUGINS = {"env": [], "svc": [], "pytorch": ["--master=master", "--worker=worker", "--port=23456"]}
IMAGES = ("registry.example.com/ml/trainer:2024.06.1", "registry.example.com/ml/trainer:2024.07.0",
          "registry.example.com/ml/trainer:2024.08.3")
_NAMESPACE = uuid.UUID("6f1c3a52-5b8e-4d0a-9a43-1f0c2b7d9e10")


def namespace_of(index: int) -> str:
    return f"team-{index % NAMESPACES:02d}"


def name_of(index: int) -> str:
    return f"train-{index:06d}"


def uid_of(namespace: str, name: str) -> str:
    # Stable across processes, so the driver knows the uid of a job the double made.
    return str(uuid.uuid5(_NAMESPACE, f"{namespace}/{name}"))


def finished(index: int, fraction: float) -> bool:
    """Whether job ``index`` is finished: spread evenly, ``fraction`` of every hundred."""
    return (index * 37) % 100 < round(fraction * 100)


def _container(name: str, job: str, index: int, role: str) -> Obj:
    env = {
        "RUN_ID": f"{job}-{uuid.uuid5(_NAMESPACE, job).hex[:12]}",
        "EXPERIMENT": f"exp-{index % 977:03d}",
        "MODEL": ("llama-7b", "resnet-152", "bert-large")[index % 3],
        "DATA_DIR": f"/data/datasets/shard-{index % 64:02d}",
        "CHECKPOINT_DIR": f"/data/checkpoints/{job}",
        "EPOCHS": str(10 + index % 90),
        "BATCH_SIZE": str(2 ** (5 + index % 4)),
        "LEARNING_RATE": f"{0.0001 * (1 + index % 9):.4f}",
        "SEED": str(index * 7919 % 100003),
        "NCCL_DEBUG": "WARN",
        "OMP_NUM_THREADS": "8",
        "LOG_LEVEL": "info",
    }
    return {
        "name": name,
        "image": IMAGES[index % len(IMAGES)],
        "command": ["python", "-m", "trainer.main"],
        "args": [f"--role={role}", "--config=/data/configs/train.yaml", f"--output=/data/checkpoints/{job}"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                      "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
    }


def _task(job: str, index: int, task: str, replicas: int) -> Obj:
    return {
        "name": task,
        "replicas": replicas,
        "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}] if task == "master" else [],
        "template": {
            "metadata": {"labels": {"app": "trainer", "role": task}},
            "spec": {
                "restartPolicy": "OnFailure",
                "containers": [_container("trainer", job, index, task)],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"datasets-{index % 8}"}},
                            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
            },
        },
    }


def make_job(index: int, fraction: float = 0.0, *, name: str | None = None) -> Obj:
    """Job ``index`` as the API server holds it (identity, spec, status); ``fraction`` of the jobs
    are finished (see :func:`finished`). ``name`` gives a job outside the numbered set."""
    namespace, name = namespace_of(index), name or name_of(index)
    done = finished(index, fraction)
    phase = "Completed" if done else "Running"
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid_of(namespace, name),
            "generation": 1,
            "creationTimestamp": "2024-09-01T08:00:00Z",
            "labels": {"app": "trainer", "team": namespace, "experiment": f"exp-{index % 977:03d}"},
            "annotations": {PLUGINS_ANNOTATION: json.dumps(PLUGINS, separators=(",", ":"))},
        },
        "spec": {
            "minAvailable": 3,
            "schedulerName": "volcano",
            "queue": "default",
            "maxRetry": 3,
            "tasks": [_task(name, index, "master", 1), _task(name, index, "worker", 2)],
        },
        "status": {
            "state": {"phase": phase, "lastTransitionTime": "2024-09-01T08:05:00Z"},
            "minAvailable": 3,
            ("succeeded" if done else "running"): 3,
            "version": 1,
            "retryCount": 0,
            "conditions": [{"status": phase, "lastTransitionTime": "2024-09-01T08:05:00Z"}],
        },
    }


def product_chain() -> Chain:
    """The reconciler's chain at the product's defaults (``reconcile`` builds it with ``on_cluster=True``:
    Volcano's eight plugins are its controller's when named in ``spec.plugins``)."""
    return Chain(default_registry(), WebhookSettings().chain_config(on_cluster=True))


def owned_objects(job: Obj, chain: Chain) -> list[Obj]:
    """What the reconciler makes for ``job``: nothing for a finished one."""
    if (job.get("status") or {}).get("state", {}).get("phase") in ("Completed", "Failed", "Terminated"):
        return []
    return chain.resources(Job.from_object(job))
