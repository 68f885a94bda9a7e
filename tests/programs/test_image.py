"""The image as CI builds it and as the manifests run it: the ``Dockerfile`` built by buildah (a real
OCI builder; ``--isolation chroot``, ``--layers`` so a re-run with unchanged sources takes seconds),
then run as uid:gid 65532:65532 with the root file system read-only and only ``/tmp`` writable.

How it is run, and why not by a container engine: podman and containerd's ``ctr`` both start
containers with runc, and runc cannot set rlimits on machines like CI's ("error setting rlimit ...
operation not permitted"). So the test does the runtime's part itself: ``buildah mount`` gives the
image's root file system; in new mount and PID namespaces (``unshare --mount --pid --fork``) it is
bound read-only, with ``/proc``, a ``/dev`` of null, zero, random and urandom, and a host directory
at ``/tmp`` (an emptyDir is one too, so the test reads the certificates ``serve`` writes there); then
``chroot --userspec=65532:65532`` runs the image's entrypoint with the image's Env, WorkingDir and
the HOME of its passwd entry. The network is the host's, so the test reaches ``localhost:<port>``.
Not reproduced: seccomp, cgroup limits, and capabilities beyond those of a non-root uid (none).

Base image: ``$VOLCANO_WEBHOOK_BASE_IMAGE``, else ``python:3.11-slim``, else the stand-in
``localhost/python-standin:3.11`` that ``hack/standin-base.sh`` makes — whichever is in buildah's
storage. Needs root (buildah's storage, mount namespaces); skips, naming what is missing, without.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.envtest import free_port, wait_until
from tests.helpers.paths import EXAMPLES, ROOT
from tests.helpers.servers import assert_pytorch_worker_1_wired, mutate_over_https

TAG = "localhost/volcano-job-webhook:test"
BASES = ("python:3.11-slim", "localhost/python-standin:3.11")
UID = 65532
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "volcano-job-webhook" / "images"
# What the Dockerfile adds to its base (the virtualenv and the account), as docs/install.md states it.
ADDED_MB_IN_DOCS = re.compile(r"the Dockerfile adds (\d+) MB")

# Run as root in the new namespaces; $1 the image's root, $2 the host directory for /tmp, then the
# command. The image's root is bound onto itself and made read-only before anything runs in it.
RUNTIME = r"""
set -eu
root=$1 tmp=$2
shift 2
mount --make-rprivate /
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount --bind "$tmp" "$root/tmp"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755,nosuid,size=64k tmpfs "$root/dev"
for device in null zero random urandom; do
  touch "$root/dev/$device"
  mount --bind "/dev/$device" "$root/dev/$device"
done
exec chroot --userspec=65532:65532 "$root" "$@"
"""


@dataclass(frozen=True)
class Image:
    base: str
    id: str
    size_mb: float
    base_size_mb: float
    build_seconds: float
    env: dict[str, str]
    workdir: str
    entrypoint: list[str]


def buildah(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)


def size_mb(reference: str) -> float:
    """The image's size as buildah reports it (uncompressed layers, decimal units)."""
    text = buildah("images", "--format", "{{.Size}}", reference).stdout.split("\n")[0]
    number, unit = text.split()
    return float(number) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]


def present(reference: str) -> bool:
    return buildah("inspect", "--type", "image", reference).returncode == 0


def base_or_skip() -> str:
    missing = [tool for tool in ("buildah", "unshare", "chroot") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (.ci/run installs Debian's buildah)")
    if os.geteuid() != 0:
        pytest.skip("building with buildah and running the image in mount namespaces needs root")
    wanted = os.environ.get("VOLCANO_WEBHOOK_BASE_IMAGE")
    if wanted:
        if not present(wanted):
            pytest.skip(f"VOLCANO_WEBHOOK_BASE_IMAGE={wanted} is not in buildah's storage")
        return wanted
    for base in BASES:
        if present(base):
            return base
    pytest.skip(f"no base image in buildah's storage: neither {' nor '.join(BASES)} "
                "(hack/standin-base.sh makes the stand-in; .ci/run runs it)")


def forget_earlier_builds(kept: set[str]) -> None:
    """Remove the images this test's earlier builds made and this one no longer uses (each changed
    source tree leaves a few hundred MB of layers behind otherwise); other images are not touched."""
    CACHE.mkdir(parents=True, exist_ok=True)
    record = CACHE / "test-image.ids"
    earlier = set(record.read_text().split()) if record.exists() else set()
    stale = [old for old in earlier if not any(new.startswith(old) or old.startswith(new) for new in kept)]
    if stale:
        buildah("rmi", *stale, timeout=300)  # one still tagged elsewhere or in use stays: not ours to force
    record.write_text("\n".join(sorted(kept)) + "\n")


@pytest.fixture(scope="module")
def image() -> Image:
    return build_image()


def build_image() -> Image:
    """The Dockerfile built on the base found, tagged ``localhost/volcano-job-webhook:test``."""
    base = base_or_skip()
    started = time.monotonic()
    done = buildah("build", "--isolation", "chroot", "--layers", "--pull=never", "--build-arg", f"PYTHON_IMAGE={base}",
                   "-t", TAG, "-f", str(ROOT / "Dockerfile"), str(ROOT), timeout=1200)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    made = set(re.findall(r"^--> ([0-9a-f]{11,64})$", done.stdout, re.M)) | {done.stdout.split()[-1]}
    forget_earlier_builds(made)
    config = json.loads(buildah("inspect", "--type", "image", TAG).stdout)["OCIv1"]["config"]
    return Image(base=base, id=done.stdout.split()[-1], size_mb=size_mb(TAG), base_size_mb=size_mb(base),
                 build_seconds=seconds, env=dict(e.split("=", 1) for e in config["Env"]),
                 workdir=config.get("WorkingDir") or "/", entrypoint=config["Entrypoint"])


@pytest.fixture(scope="module")
def rootfs(image: Image) -> Iterator[Path]:
    """The image's root file system, from a working container removed afterwards."""
    container = "volcano-job-webhook-test"
    buildah("rm", container)  # left by a run that was killed, if any
    created = buildah("from", "--pull=never", "--name", container, image.id)
    assert created.returncode == 0, created.stderr
    try:
        yield Path(buildah("mount", container).stdout.strip())
    finally:
        buildah("rm", container)


def home_of(rootfs: Path, uid: int) -> str:
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[2] == str(uid):
            return fields[5]
    return "/"


def in_image(image: Image, rootfs: Path, tmp: Path, *args: str, command: list[str] | None = None) -> list[str]:
    """What runs the image's entrypoint (or ``command``) with ``args`` as the manifests run it."""
    tmp.chmod(0o1777)  # an emptyDir's mode: writable by the Pod's uid
    env = {**image.env, "HOME": home_of(rootfs, UID)}
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", RUNTIME, "runtime", str(rootfs), str(tmp),
            "env", "-i", "-C", image.workdir, *(f"{k}={v}" for k, v in env.items()), *(command or image.entrypoint), *args]


def test_help_runs_as_the_non_root_user(image: Image, rootfs: Path, tmp_path: Path) -> None:
    done = subprocess.run(in_image(image, rootfs, tmp_path, "--help"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout and "reconcile" in done.stdout
    who = subprocess.run(in_image(image, rootfs, tmp_path, "-u", command=["id"]), capture_output=True, text=True, timeout=60)
    assert who.stdout.strip() == str(UID), who.stderr


def test_the_root_file_system_is_read_only_and_tmp_is_not(image: Image, rootfs: Path, tmp_path: Path) -> None:
    """The runtime above really enforces what the manifests ask, so a process that runs in it writes nowhere else."""
    done = subprocess.run(in_image(image, rootfs, tmp_path, "-c", "touch /opt/venv/x; echo $?; touch /tmp/y && echo ok",
                                   command=["sh"]), capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "ok"], done.stderr
    assert "Read-only file system" in done.stderr
    assert (tmp_path / "y").stat().st_uid == UID


def pid_one(runtime: subprocess.Popen[str]) -> int:
    """The process ``unshare --fork`` started: PID 1 of the new namespace, as an entrypoint is."""
    children = wait_until(lambda: Path(f"/proc/{runtime.pid}/task/{runtime.pid}/children").read_text().split(), 10,
                          "unshare to start a process", interval=0.05)
    return int(children[0])


def test_serve_answers_mutate_over_https_and_stops_on_sigterm(image: Image, rootfs: Path, tmp_path: Path) -> None:
    """The manifests' serve arguments but a free port, certificates made in /tmp (no Secret here)
    and the shipped example jobs (no cluster); localhost only, since the network is the host's."""
    port = free_port()
    runtime = subprocess.Popen(in_image(image, rootfs, tmp_path, "serve", f"--port={port}", "--certs-dir=/tmp/certs",
                                        "--host=127.0.0.1"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ca = tmp_path / "certs" / "ca.crt"

        def ready() -> ssl.SSLContext | None:
            assert runtime.poll() is None, runtime.communicate()[0]
            if not ca.exists():
                return None
            try:
                context = ssl.create_default_context(cafile=str(ca))
                with urllib.request.urlopen(f"https://localhost:{port}/readyz", context=context, timeout=2) as answer:
                    assert json.load(answer)["status"] == "ready"
                    return context
            except (ssl.SSLError, urllib.error.URLError, ConnectionError):
                return None

        context = wait_until(ready, 60, "serve to write its certificates and answer /readyz", interval=0.2)
        review = (EXAMPLES / "admission" / "pytorch-pod.json").read_bytes()
        assert_pytorch_worker_1_wired(mutate_over_https(f"https://localhost:{port}", review, context))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["certs"], "nothing but the certificates in /tmp"
        assert ca.stat().st_uid == UID
        # The kubelet stops a container with SIGTERM to its PID 1, which the kernel does not
        # default-kill: serve must handle it, or every rollout waits out the grace period.
        assert runtime.poll() is None, "serve is still running: it wrote nothing it could not"
        os.kill(pid_one(runtime), signal.SIGTERM)
        assert runtime.wait(timeout=15) == 0, runtime.communicate()[0]
    finally:
        if runtime.poll() is None:
            runtime.kill()
            runtime.wait()


def test_reconcile_without_a_cluster_exits_at_once_with_one_line(image: Image, rootfs: Path, tmp_path: Path) -> None:
    """The manifests' reconcile arguments where there is no API server (no in-cluster variables,
    no kubeconfig): a clear line and a non-zero exit, not a traceback nor a process that hangs."""
    started = time.monotonic()
    done = subprocess.run(in_image(image, rootfs, tmp_path, "reconcile", f"--health-port={free_port()}", "--leader-elect",
                                   "--lease-name=volcano-job-webhook-reconciler", "--lease-namespace=volcano-job-webhook"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 20
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("volcano-webhook reconcile: no cluster to connect to: not in a Pod"), line
    assert "kubeconfig" in line


@pytest.mark.parametrize("command", [["reconcile", f"--health-port={free_port()}"], ["serve", "--job-source=kube", f"--port={free_port()}"]],
                         ids=["reconcile", "serve"])
def test_no_cluster_is_one_line_outside_the_image(tmp_path: Path, command: list[str]) -> None:
    """The same line where the package is installed, without an image (where buildah is missing too),
    for both processes that need a cluster."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") and not k.startswith("VOLCANO_WEBHOOK_")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "volcano_job_webhook", *command],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"volcano-webhook {command[0]}: no cluster to connect to: not in a Pod (Service host/port is not set)"
        " and no kubeconfig at ~/.kube/config (give --kubeconfig or set KUBECONFIG)"]


def test_image_size_is_what_the_install_guide_says(image: Image, capsys: pytest.CaptureFixture[str]) -> None:
    """Measured on every build and printed with the build time; what the Dockerfile adds to its base
    must stay within 15% of the figure docs/install.md gives operators."""
    added = image.size_mb - image.base_size_mb
    with capsys.disabled():
        print(f"\nimage on {image.base}: {image.size_mb:.0f} MB ({image.base_size_mb:.0f} MB base, "
              f"{added:.0f} MB added), built in {image.build_seconds:.0f} s")
    stated = ADDED_MB_IN_DOCS.search((ROOT / "docs" / "install.md").read_text())
    assert stated, "docs/install.md states what the Dockerfile adds: 'the Dockerfile adds N MB'"
    assert abs(added - int(stated.group(1))) <= 0.15 * int(stated.group(1)), (added, stated.group(0))
