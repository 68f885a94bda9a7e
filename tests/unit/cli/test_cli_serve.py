"""``volcano-webhook serve`` as a new user meets it: a port already taken is one line and exit 2, and
``--jobs-dir`` says which files it skipped, why, and how many jobs it loaded from where."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers.envtest import wait_until
from tests.helpers.jobs import jobs_yaml, loaded, minimal_job
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.server.jobs import DirectoryJobSource


def serve(tmp_path: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "volcano_job_webhook", "serve", "--host", "127.0.0.1",
                             "--certs-dir", str(tmp_path / "certs"), *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_port_already_taken_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = serve(tmp_path, "--port", str(port), "--jobs-dir", str(EXAMPLES / "jobs"))
        try:
            _, err = process.communicate(timeout=60)
        finally:
            process.kill()
    assert process.returncode == 2, err[-2000:]
    lines = err.splitlines()
    # Before it, the server's JSON log lines; the message itself is the last line, and the only other.
    assert all(line.startswith("{") for line in lines[:-1]), err
    assert lines[-1] == (f"volcano-webhook serve: cannot listen on 127.0.0.1:{port}: the address is already in use "
                         "(another process listens there); choose another port with --port")
    assert "Traceback" not in err


@pytest.mark.anyio
async def test_skipped_files_are_named_with_why_and_the_load_is_summed_up(tmp_path, caplog):
    caplog.set_level("INFO", logger="volcano_job_webhook.server.jobs.directory")
    first = minimal_job("a")
    first["spec"]["tasks"][0]["replicas"] = 1
    second = minimal_job("a")
    second["spec"]["tasks"][0]["replicas"] = 2
    (tmp_path / "a.yaml").write_text(jobs_yaml(first))
    (tmp_path / "b.yaml").write_text(jobs_yaml(second))  # job default/a again: a duplicate of a.yaml's
    (tmp_path / "c.yaml").write_text(jobs_yaml(second, minimal_job("c")))  # one duplicate, one job of its own
    (tmp_path / "d.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n")
    (tmp_path / "e.yaml").write_text("")
    os.symlink(tmp_path / "nowhere.yaml", tmp_path / "f.yaml")
    (tmp_path / "g.yaml").write_text("kind: Job\nmetadata: {name: [unclosed")
    source = DirectoryJobSource(tmp_path, interval=0)
    source.start()
    await loaded(source)
    assert sorted(name for *_, name in source._jobs) == ["a", "c"]
    assert (await source.get("default", "a"))["spec"]["tasks"][0]["replicas"] == 1, "the first file in name order keeps it"

    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sorted(warnings) == sorted([
        f"jobs file skipped: {tmp_path / 'b.yaml'}: Volcano Job default/a already in {tmp_path / 'a.yaml'} (a duplicate)",
        f"jobs file {tmp_path / 'c.yaml'}: Volcano Job default/a skipped: already in {tmp_path / 'a.yaml'} (a duplicate)",
        f"jobs file skipped: {tmp_path / 'd.yaml'}: holds no Volcano Job, JobSet or Indexed Job (found: ConfigMap)",
        f"jobs file skipped: {tmp_path / 'e.yaml'}: holds no document",
        f"jobs file skipped: {tmp_path / 'f.yaml'}: cannot read: No such file or directory",
        f"jobs file skipped: {tmp_path / 'g.yaml'}: not valid YAML or JSON: " + warnings_about(warnings, "g.yaml"),
    ])
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert infos == [f"loaded 2 jobs from {tmp_path} (5 files skipped)"]

    caplog.clear()
    (tmp_path / "a.yaml").unlink()  # b.yaml's job is now the first of its name: loaded, said without a warning
    await loaded(source)
    assert (await source.get("default", "a"))["spec"]["tasks"][0]["replicas"] == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"jobs file {tmp_path / 'c.yaml'}: Volcano Job default/a skipped: already in {tmp_path / 'b.yaml'} (a duplicate)"]
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"] == [f"loaded 2 jobs from {tmp_path} (4 files skipped)"]


def warnings_about(warnings: list[str], name: str) -> str:
    """The parser's own words for ``name`` (PyYAML's, which the test does not pin)."""
    found = [w for w in warnings if f"{name}: not valid YAML or JSON: " in w]
    assert len(found) == 1, warnings
    return found[0].split("not valid YAML or JSON: ", 1)[1]


def test_serve_logs_how_many_jobs_it_loaded_from_where(tmp_path):
    """Through serve's own JSON logs, on standard error."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "env-job.yaml").write_text((EXAMPLES / "jobs" / "env-job.yaml").read_text())
    (jobs / "again.yaml").write_text((EXAMPLES / "jobs" / "env-job.yaml").read_text())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = serve(tmp_path, "--port", str(port), "--jobs-dir", str(jobs))
    assert process.stderr is not None
    lines: list[str] = []
    # Read on a thread: the loop below waits for the summary without ever blocking on a server that does not say it.
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        wait_until(lambda: not reader.is_alive() or any('"msg":"loaded ' in line for line in list(lines)), 60,
                   "serve's summary of the jobs it loaded", interval=0.05)
    finally:
        process.terminate()
        process.wait(timeout=30)
        reader.join(timeout=30)
    seen = [json.loads(line) for line in lines if line.startswith("{")]
    messages = [(e["level"], e["msg"]) for e in seen if e["logger"] == "volcano_job_webhook.server.jobs.directory"]
    if not messages:
        pytest.fail(f"no job-file log lines: {seen}")
    assert messages == [
        ("warning", f"jobs file skipped: {jobs / 'env-job.yaml'}: Volcano Job default/env-demo already in {jobs / 'again.yaml'} (a duplicate)"),
        ("info", f"loaded 1 job from {jobs} (1 file skipped)"),
    ]
