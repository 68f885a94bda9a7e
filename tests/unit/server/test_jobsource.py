"""The directory job source: files read, re-read on change, last good content kept. How long loading
and lookups take is bench/jobsource.py's to measure."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from tests.helpers.jobs import alias_bomb_yaml, jobs_yaml, loaded, many_jobs_yaml, minimal_job
from volcano_job_webhook.server.jobs import DirectoryJobSource

pytestmark = pytest.mark.anyio



def write(path, text):
    path.write_text(text)
    # Make the change visible even within one mtime tick.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


async def test_reads_reloads_and_keeps_last_good(tmp_path):
    write(tmp_path / "a.yaml", jobs_yaml(minimal_job("a"), minimal_job("b", "team")))
    (tmp_path / "notes.txt").write_text("ignored")
    source = DirectoryJobSource(tmp_path, interval=0)
    assert not source.ready
    source.start()
    await loaded(source)
    assert source.ready and len(source) == 2
    assert (await source.get("default", "a"))["metadata"]["name"] == "a"
    assert (await source.get("team", "b")) is not None
    assert await source.get("default", "b") is None

    # A miss waits for the look at the directory it started: a job written a moment ago is found.
    write(tmp_path / "c.json", '{"kind": "Job", "metadata": {"name": "c"}, "spec": {}}')
    assert await source.get("default", "c") is not None

    write(tmp_path / "a.yaml", "kind: Job\nmetadata: {name: [unclosed")
    await loaded(source)
    assert await source.get("default", "a") is not None, "a half-saved file keeps its last good jobs"

    (tmp_path / "a.yaml").unlink()
    await loaded(source)
    assert await source.get("default", "a") is None
    assert len(source) == 1


async def test_bad_files_are_skipped_with_one_warning_each(tmp_path, caplog):
    write(tmp_path / "good.yaml", jobs_yaml(minimal_job("good")))
    write(tmp_path / "big.yaml", jobs_yaml(minimal_job("big")) + "#" * 5000)
    write(tmp_path / "bomb.yaml", alias_bomb_yaml())
    write(tmp_path / "deep.json", '{"kind": "Job", "metadata": {"name": "deep"}, "spec": ' + "[" * 200 + "]" * 200 + "}")
    os.mkfifo(tmp_path / "fifo.yaml")  # would block a plain open() for ever
    source = DirectoryJobSource(tmp_path, interval=0, max_file_bytes=4096)
    source.start()
    await asyncio.wait_for(loaded(source), 60)  # a fifo opened for reading would block it for ever
    assert sorted(name for *_, name in source._jobs) == ["good"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sorted(warnings) == sorted([
        f"jobs file skipped: {tmp_path / 'big.yaml'}: larger than the limit of 4096 bytes",
        f"jobs file skipped: {tmp_path / 'bomb.yaml'}: refused: YAML aliases would add more than 100000 nodes (an alias bomb?)",
        f"jobs file skipped: {tmp_path / 'deep.json'}: refused: nested more than 100 levels deep",
        f"jobs file skipped: {tmp_path / 'fifo.yaml'}: not a regular file",
    ])
    caplog.clear()
    write(tmp_path / "other.yaml", jobs_yaml(minimal_job("other")))
    await loaded(source)
    assert await source.get("default", "other") is not None
    assert not [r for r in caplog.records if r.levelname == "WARNING"], "said once per version of a file"


async def test_start_returns_at_once_and_the_server_answers_while_files_load(tmp_path):
    from volcano_job_webhook.plugins import Chain
    from volcano_job_webhook.server.app import create_app

    write(tmp_path / "bulk.yaml", many_jobs_yaml(2000))  # 240 KB: about half a second of YAML parsing
    source = DirectoryJobSource(tmp_path, interval=0)
    app = create_app(source, Chain())
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
        assert not source.ready
        health = await c.get("/healthz")
        assert health.status_code == 200 and not source.ready, "answered while the first load runs"
        assert (await c.get("/readyz")).status_code == 503
        await loaded(source)
        assert (await c.get("/readyz")).json()["jobs"] == 2000


async def test_lookups_answer_from_the_old_table_while_a_file_is_re_read(tmp_path):
    write(tmp_path / "a.yaml", jobs_yaml(minimal_job("a")))
    source = DirectoryJobSource(tmp_path, interval=0)
    source.start()
    await loaded(source)
    write(tmp_path / "bulk.yaml", many_jobs_yaml(2000))
    assert await source.get("default", "a") is not None  # starts the re-read
    look = source._look
    # Answered while the re-read still runs, so without waiting for it (how fast: bench/jobsource.py).
    assert look is not None and not look.done(), "the re-read runs in the worker meanwhile"
    await loaded(source)
    assert await source.get("default", "bulk-1999") is not None and await source.get("default", "a") is not None


async def test_a_file_grown_over_the_limit_or_broken_keeps_its_last_good_jobs_and_is_named(tmp_path, caplog):
    write(tmp_path / "a.yaml", jobs_yaml(minimal_job("a")))
    source = DirectoryJobSource(tmp_path, interval=0, max_file_bytes=4096)
    source.start()
    await loaded(source)
    write(tmp_path / "a.yaml", jobs_yaml(minimal_job("a")) + "#" * 5000)
    await loaded(source)
    assert await source.get("default", "a") is not None
    write(tmp_path / "a.yaml", "kind: Job\nmetadata: {name: [unclosed")
    await loaded(source)
    assert await source.get("default", "a") is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings[0] == f"jobs file keeping its last good jobs: {tmp_path / 'a.yaml'}: larger than the limit of 4096 bytes"
    assert warnings[1].startswith(f"jobs file keeping its last good jobs: {tmp_path / 'a.yaml'}: not valid YAML or JSON")
    source.stop()


async def test_a_small_job_file_changed_is_seen_by_the_next_lookup(tmp_path):
    """Read in the background, yet an edited job file of ordinary size is what the next lookup
    answers, as when files were read on the event loop; only a large one is answered from the old
    table while it is parsed (test above)."""
    write(tmp_path / "a.yaml", jobs_yaml(minimal_job("a")))
    source = DirectoryJobSource(tmp_path, interval=0)
    source.start()
    await loaded(source)
    write(tmp_path / "a.yaml", jobs_yaml(minimal_job("a", replicas=3)))
    assert (await source.get("default", "a"))["spec"]["tasks"][0]["replicas"] == 3
