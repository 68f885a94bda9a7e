"""Size budgets: how large a value built from a job's host lists would be, exactly, from replica counts
and name lengths alone, so that a plugin can leave it out or refuse the job before building it:
``replicas: 1000000000`` is a legal job on a fail-closed webhook (docs/volcano-behaviour.md#limits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the job views size their names with digits_below
    from .job import Job, Task

# Measured against kube-apiserver v1.36 and etcd 3.6. A Pod's compact JSON is weighed against
# STORE_LIMIT: etcd stores protobuf, never larger. GENERATED_LIMIT is ours, far past any cluster's
# Pods, to bound what each Pod writes and waits for.
ENV_STRING_LIMIT = 32 * 4096
DATA_LIMIT = 1024 * 1024
STORE_LIMIT = 1536 * 1024
GENERATED_LIMIT = 32 * 1024 * 1024

ENV_LIMIT_TEXT = f"{ENV_STRING_LIMIT} bytes for NAME=value, the most Linux passes in one environment string (MAX_ARG_STRLEN)"
ARG_LIMIT_TEXT = f"{ENV_STRING_LIMIT - 1} bytes, the most Linux passes in one command-line argument (MAX_ARG_STRLEN)"
DATA_LIMIT_TEXT = f"{DATA_LIMIT} bytes, the most a ConfigMap's or Secret's data may hold"
STORE_LIMIT_TEXT = f"{STORE_LIMIT} bytes, the largest object etcd stores (--max-request-bytes)"
GENERATED_LIMIT_TEXT = f"{GENERATED_LIMIT} bytes, the most svc writes to each Pod (any job of up to 262,144 Pods fits)"

# Room a stored map entry takes beyond its key and value (protobuf tags and lengths, at most 11 bytes),
# and an object's metadata (name, namespace, labels, owner reference): generous upper bounds.
ENTRY_OVERHEAD = 12
METADATA_ALLOWANCE = 4096


def digits(n: int) -> int:
    """``len(str(n))`` for ``n >= 0``."""
    return len(str(n))


def digits_below(count: int) -> int:
    """Total decimal digits of 0, 1, ..., count-1: one closed form per digit-count band."""
    total, low, width = 0, 0, 1
    while low < count:
        high = min(count, 10**width)
        total += (high - low) * width
        low, width = high, width + 1
    return total


@dataclass(frozen=True)
class Hosts:
    """One task's host names by size only: how many, their hostnames' total length, and the length
    of what each is qualified with (``<hostname>.<suffix>``, the suffix ``Job.host_suffix``)."""

    count: int
    label_chars: int
    suffix: int

    @property
    def name_chars(self) -> int:
        """Total length of the domain names ``<hostname>.<suffix>``."""
        return self.label_chars + self.count * (1 + self.suffix)

    def joined(self, sep: int = 1, each: int = 0) -> int:
        """Length of the domain names, each followed by ``each`` more characters, joined by a
        separator of ``sep`` characters (``",".join(names)`` is ``joined()``)."""
        if not self.count:
            return 0
        return self.name_chars + self.count * each + (self.count - 1) * sep


def task_hosts(job: Job, task: Task, *, every_replica: bool = False, cluster_domain: str | None = None) -> Hosts:
    """The sizes of ``job.host_names(task, cluster_domain)``: one name per replica, or a single one
    when the template fixes ``hostname`` (svc, ssh, mpi, hostfile); ``every_replica`` repeats that
    fixed name once per replica, as tensorflow's cluster does (docs/volcano-behaviour.md#volcano-quirks item 6)."""
    suffix = len(job.host_suffix(task, cluster_domain))
    if task.hostname:
        count = task.replicas if every_replica else min(task.replicas, 1)
        return Hosts(count, count * len(task.hostname), suffix)
    return Hosts(task.replicas, job.host_label_chars(task), suffix)


def env_value_limit(name: str) -> int:
    """The longest value the variable ``name`` can have and still reach the container."""
    return ENV_STRING_LIMIT - len(name) - 2


def stored_map(keys: int, values: int, entries: int) -> int:
    """An upper bound of the stored size of an object whose data has ``entries`` entries with
    ``keys`` and ``values`` characters in all."""
    return keys + values + entries * ENTRY_OVERHEAD + METADATA_ALLOWANCE
