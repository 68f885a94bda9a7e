"""The one-node cluster the tests in this folder share: real parts (tests/node.py), cluster DNS
(CoreDNS), a whole Volcano (tests/cluster.py's ``whole_volcano``: scheduler, controllers, admission),
the product's image and the jobs' image in the node's containerd. Brought up once for this folder
(about a minute) and torn down after its last test, since a machine holds one node; each test
installs and uninstalls the product itself.

Skips, naming what is missing, without root, the node's parts (``KUBEBUILDER_ASSETS``,
``KUBE_NODE_ASSETS``, Debian's containerd, runc, CNI plugins, iptables...), Volcano's three binaries
(``VOLCANO_CONTROLLER``, ``VOLCANO_SCHEDULER``, ``VOLCANO_ADMISSION``) and CRDs, CoreDNS (``COREDNS``),
helm, kubectl, or buildah and a base image (tests/test_image.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests import node as node_module
from tests.cluster import VolcanoCluster, volcano_missing, whole_volcano
from tests.envtest import ADMIN, Process, create, read, wait_until
from tests.helm import helm_or_skip
from tests.kustomize import kubectl_or_skip
from tests.node import Node
from tests.test_image import CACHE, TAG, Image, base_or_skip, build_image, buildah

COREDNS_ENV = "COREDNS"
# Debian's Python 3.11 (the base) with what the jobs run besides Python: Open MPI and OpenSSH for
# mpirun over ssh, netcat for the wait for the master. The frameworks come from the host. Tagged by
# its package list, so a changed list builds anew.
JOBS_PACKAGES = ("openmpi-bin", "openssh-server", "openssh-client", "netcat-openbsd")
JOBS_IMAGE = f"localhost/vjw-jobs:{hashlib.sha256(' '.join(JOBS_PACKAGES).encode()).hexdigest()[:12]}"


@dataclass
class Figures:
    """What a module measures, printed and written to JSON at the end."""

    values: dict[str, Any] = field(default_factory=dict)

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = round(value, 2) if isinstance(value, float) else value


def figures_fixture(name: str, title: str) -> Callable[..., Iterator[Figures]]:
    """A module's ``figures`` fixture: written to ``NAME.json`` and printed (with ``-s``) at its end."""

    @pytest.fixture(scope="module")
    def figures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Figures]:
        out = Figures()
        yield out
        if out.values:
            path = tmp_path_factory.mktemp("figures") / f"{name}.json"
            path.write_text(json.dumps(out.values, indent=1))
            print(f"\n{title} ({path}):\n" + "\n".join(f"  {k}: {v}" for k, v in out.values.items()))

    return figures


@dataclass
class Cluster:
    node: Node
    admin: client.ApiClient
    volcano_processes: dict[str, Process]
    timings: dict[str, float]

    def kubectl(self, *args: str, timeout: float = 120) -> str:
        return node_module.run(kubectl_or_skip(), *args, env=self.node.tool_env(), timeout=timeout).stdout

    def helm(self, *args: str, timeout: float = 120) -> str:
        return node_module.run(helm_or_skip(), *args, env=self.node.tool_env(), timeout=timeout).stdout

    def volcano(self, namespace: str) -> VolcanoCluster:
        """tests/cluster.py's view of a namespace here (create, pods, phase...)."""
        return VolcanoCluster("real", self.admin, self.admin, ADMIN, namespace, envtest=self.node.envtest,
                              controller_log=self.volcano_logs)

    def volcano_logs(self, tail: int = 30) -> str:
        return "\n".join(f"--- {name}:\n{p.log(tail=tail)}" for name, p in self.volcano_processes.items())

    def namespace(self, prefix: str) -> str:
        """A new namespace, once kube-controller-manager has made its ``default`` ServiceAccount."""
        made = create(self.admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"generateName": prefix}})
        name: str = made["metadata"]["name"]
        wait_until(lambda: read(self.admin, "v1", "ServiceAccount", "default", name), 30, f"ServiceAccount {name}/default")
        return name


def requirements_or_skip() -> None:
    """Skip before anything is built or started when a part is missing (a node a killed test run
    left behind is erased first: its chains would read as another node's)."""
    if os.geteuid() == 0:
        node_module.clean_stale()
    reasons = [node_module.missing(), volcano_missing()]
    if not (os.environ.get(COREDNS_ENV) and os.access(os.environ[COREDNS_ENV], os.X_OK)):
        reasons.append(f"{COREDNS_ENV} is not set to an executable coredns")
    reason = "; ".join(r for r in reasons if r)
    if reason:
        pytest.skip(reason)
    helm_or_skip()
    kubectl_or_skip()


def jobs_image(base: str) -> str:
    """:data:`JOBS_IMAGE` in buildah's storage: there already, else from its archive in the cache,
    else built on ``base`` with Debian's packages (a few minutes, once a machine)."""
    archive = CACHE / f"vjw-jobs-{JOBS_IMAGE.rpartition(':')[2]}.oci.tar"
    if buildah("inspect", "--type", "image", JOBS_IMAGE).returncode == 0:
        return JOBS_IMAGE
    if archive.exists():
        loaded = buildah("pull", "-q", f"oci-archive:{archive}", timeout=300)
        if loaded.returncode == 0 and buildah("tag", loaded.stdout.split()[-1], JOBS_IMAGE).returncode == 0:
            return JOBS_IMAGE
    container = buildah("from", "--pull=never", base).stdout.strip()
    try:
        done = buildah("run", "--isolation", "chroot", container, "--", "sh", "-c",
                       "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
                       f"{' '.join(JOBS_PACKAGES)} && rm -rf /var/lib/apt/lists/*", timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert buildah("commit", "-q", container, JOBS_IMAGE, timeout=300).returncode == 0
    finally:
        buildah("rm", container)
    CACHE.mkdir(parents=True, exist_ok=True)
    buildah("push", "-q", JOBS_IMAGE, f"oci-archive:{archive}.partial", timeout=300)
    Path(f"{archive}.partial").replace(archive)
    return JOBS_IMAGE


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The node with cluster DNS and a whole Volcano, the product's and the jobs' images imported."""
    requirements_or_skip()
    built: Image = build_image()
    workdir = tmp_path_factory.mktemp("node")
    timings: dict[str, float] = {"image_build_s": built.build_seconds}
    started = time.monotonic()
    images = {TAG: workdir / "product.oci.tar", jobs_image(base_or_skip()): workdir / "jobs.oci.tar"}
    for reference, archive in images.items():
        # Uncompressed: the archive only crosses this machine's disk.
        node_module.run("buildah", "push", "--disable-compression", reference, f"oci-archive:{archive}:{reference}", timeout=300)
    timings["images_s"] = time.monotonic() - started
    assets, node_assets = node_module.find_assets(), node_module.find_node_assets()
    assert assets is not None and node_assets is not None
    node = Node(assets, node_assets, workdir, coredns=Path(os.environ[COREDNS_ENV]))
    with node:
        timings["node_bring_up_s"] = node.timings["bring_up"]
        for reference, archive in images.items():
            node.import_image(archive, base_name=reference.rpartition(":")[0])
        admin = node.api_client()
        started = time.monotonic()
        with whole_volcano(admin, node.kubeconfig(), workdir / "volcano") as processes:
            timings["volcano_up_s"] = time.monotonic() - started
            yield Cluster(node, admin, processes, timings)
    assert not node.leftovers(), f"left on this machine: {node.leftovers()}"
