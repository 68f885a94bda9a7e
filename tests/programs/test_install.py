"""Installed as users install it: the image's own build steps, run on its build context, then the
installed package used from another directory, as the Docker image uses it.

No Docker engine is needed: the Dockerfile's build-stage ``RUN`` is executed as written, with its
absolute paths (``/wheels``, ``/opt/venv``) moved under a temporary directory and pip's cache left
on so dependencies are not downloaded again.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509

from tests.helpers.envtest import free_port, wait_until
from tests.helpers.manifests_util import dockerfile_instructions, dockerignore_excludes
from tests.helpers.paths import ROOT
from tests.helpers.servers import assert_pytorch_worker_1_wired, mutate_over_https


def build_stage_run() -> str:
    """The ``RUN`` commands of the Dockerfile's first (build) stage, joined with ``&&``."""
    instructions = dockerfile_instructions()
    starts = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    build = instructions[starts[0]:starts[1]]
    return " && ".join(rest for word, rest in build if word == "RUN")


def build_context(dest: Path) -> Path:
    """What the build stage's ``COPY`` lines put in its ``WORKDIR``, minus what ``.dockerignore`` keeps out."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for word, rest in dockerfile_instructions():
        if word != "COPY" or "--from" in rest:
            continue
        for source in rest.split()[:-1]:
            path = ROOT / source
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for f in files:
                rel = f.relative_to(ROOT).as_posix()
                if not dockerignore_excludes(rel, patterns):
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dest / rel)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the package exactly as the image's build stage installs it."""
    root = tmp_path_factory.mktemp("image")
    context = build_context(root / "src")
    python = shutil.which("python3.11") or sys._base_executable  # the image's interpreter, not our venv's
    script = (build_stage_run()
              .replace("/wheels", str(root / "wheels")).replace("/opt/venv", str(root / "venv"))
              .replace("--no-cache-dir", ""))
    script = script.replace("python -m", f"{python} -m", 1)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(["bash", "-c", script], cwd=context, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "venv"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with nothing of the repository in it."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd


def run(venv: Path, cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_one_import_name_and_no_top_level_plugins_or_webhook(installed: Path, elsewhere: Path) -> None:
    code = ("import importlib.util, volcano_job_webhook.plugins as p;"
            "print(p.__file__);"
            "print(importlib.util.find_spec('plugins'), importlib.util.find_spec('webhook'))")
    done = run(installed, elsewhere, "python", "-c", code)
    assert done.returncode == 0, done.stderr
    location, missing = done.stdout.splitlines()
    assert "site-packages/volcano_job_webhook/plugins" in location
    assert missing == "None None"


def test_offline_cli_runs_the_shipped_examples_from_anywhere(installed: Path, elsewhere: Path) -> None:
    find = run(installed, elsewhere, "python", "-c",
               "from importlib.resources import files; print(files('volcano_job_webhook.examples') / 'jobs')")
    jobs = Path(find.stdout.strip())
    done = run(installed, elsewhere, "volcano-webhook", "mutate", "--job", str(jobs / "mpi-job.yaml"), "--task", "mpimaster")
    assert done.returncode == 0, done.stderr
    env = {e["name"]: e.get("value") for e in json.loads(done.stdout)["spec"]["containers"][0]["env"]}
    assert env["MPI_HOST"] == "mpi-demo-mpiworker-0.mpi-demo,mpi-demo-mpiworker-1.mpi-demo"


def test_serve_with_a_missing_jobs_directory_fails_at_once(installed: Path, elsewhere: Path) -> None:
    """Exits (a server that started would outlive run's timeout and fail the test) with one line,
    before it writes anything."""
    done = run(installed, elsewhere, "volcano-webhook", "serve", "--jobs-dir", str(elsewhere / "nope"), "--port", "1")
    assert done.returncode == 2
    assert f"jobs directory {elsewhere / 'nope'} does not exist" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (elsewhere / "certs").exists(), "nothing is written before the settings are known to work"


@pytest.fixture
def served(installed: Path, elsewhere: Path) -> Iterator[tuple[str, ssl.SSLContext]]:
    """``volcano-webhook serve`` on its embedded defaults, from a directory that is not the repository."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    process = subprocess.Popen([str(installed / "bin" / "volcano-webhook"), "serve", "--port", str(port), "--host", "127.0.0.1"],
                               cwd=elsewhere, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ca = elsewhere / "certs" / "ca.crt"
        url = f"https://localhost:{port}"

        def ready() -> ssl.SSLContext | None:
            assert process.poll() is None, process.communicate()[0]
            if not ca.exists():
                return None
            context = ssl.create_default_context(cafile=str(ca))
            try:
                with urllib.request.urlopen(f"{url}/readyz", context=context, timeout=2) as answer:
                    assert json.load(answer)["status"] == "ready"
                    return context
            except (urllib.error.URLError, ConnectionError):
                return None

        context = wait_until(ready, 60, "serve to write its certificates and answer /readyz", interval=0.1)
        yield url, context
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_on_its_defaults_wires_the_shipped_example_pod(served: tuple[str, ssl.SSLContext], installed: Path, elsewhere: Path) -> None:
    url, context = served
    find = run(installed, elsewhere, "python", "-c",
               "from importlib.resources import files; print(files('volcano_job_webhook.examples') / 'admission' / 'pytorch-pod.json')")
    review = Path(find.stdout.strip()).read_bytes()
    assert_pytorch_worker_1_wired(mutate_over_https(url, review, context))


def test_serve_exports_the_served_certificates_time_left(served: tuple[str, ssl.SSLContext], elsewhere: Path) -> None:
    url, context = served
    expiry = x509.load_pem_x509_certificate((elsewhere / "certs" / "tls.crt").read_bytes()).not_valid_after_utc
    before = datetime.now(UTC)
    with urllib.request.urlopen(f"{url}/metrics", context=context, timeout=10) as answer:
        text = answer.read().decode()
    after = datetime.now(UTC)
    (line,) = [line for line in text.splitlines() if line.startswith("volcano_webhook_certificate_expiry_seconds ")]
    value = float(line.split()[1])
    assert (expiry - after).total_seconds() <= value <= (expiry - before).total_seconds()
