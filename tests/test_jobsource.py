"""The directory job source: files read, re-read on change, last good content kept."""

from __future__ import annotations

import os

import pytest

from volcano_job_webhook.server.jobs import DirectoryJobSource

pytestmark = pytest.mark.anyio

JOB = """apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: {name}{ns}}}
spec: {{tasks: [{{name: w, replicas: 1}}]}}
"""


def write(path, text):
    path.write_text(text)
    # Make the change visible even within one mtime tick.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


async def test_reads_reloads_and_keeps_last_good(tmp_path):
    write(tmp_path / "a.yaml", JOB.format(name="a", ns="") + "---\n" + JOB.format(name="b", ns=", namespace: team"))
    (tmp_path / "notes.txt").write_text("ignored")
    source = DirectoryJobSource(tmp_path, interval=0)
    assert not source.ready
    source.start()
    await source.loaded()
    assert source.ready and len(source) == 2
    assert (await source.get("default", "a"))["metadata"]["name"] == "a"
    assert (await source.get("team", "b")) is not None
    assert await source.get("default", "b") is None

    # A miss waits for the look at the directory it started: a job written a moment ago is found.
    write(tmp_path / "c.json", '{"kind": "Job", "metadata": {"name": "c"}, "spec": {}}')
    assert await source.get("default", "c") is not None

    write(tmp_path / "a.yaml", "kind: Job\nmetadata: {name: [unclosed")
    await source.loaded()
    assert await source.get("default", "a") is not None, "a half-saved file keeps its last good jobs"

    (tmp_path / "a.yaml").unlink()
    await source.loaded()
    assert await source.get("default", "a") is None
    assert len(source) == 1
