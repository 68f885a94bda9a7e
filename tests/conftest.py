"""Shared fixtures: the example jobs, a jobs directory to write into, an in-process webhook client."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.jobs import DirectoryJobSource

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """A copy of examples/jobs that a test may add broken jobs to."""
    target = tmp_path / "jobs"
    shutil.copytree(EXAMPLES / "jobs", target)
    return target


@pytest.fixture
async def client(jobs_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app over ``jobs_dir``, through httpx's ASGI transport, lifespan included."""
    source = DirectoryJobSource(jobs_dir, interval=0)
    app = create_app(source, Chain(), max_body_bytes=64 * 1024)
    async with app.lifespan():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://webhook.test") as c:
            c.app = app  # type: ignore[attr-defined]
            yield c
