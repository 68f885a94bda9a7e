"""The test helpers' processes (tests/helpers/envtest.py's ``Process``)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.envtest import Process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_started_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    """The kernel kills a child when the thread that started it ends (PR_SET_PDEATHSIG): a storm's
    fault thread restarting the API server took it down at the storm's end (bench/storm.py)."""
    started: list[Process] = []
    thread = threading.Thread(target=lambda: started.append(Process.start("sleep", ["sleep", "30"], tmp_path / "log")))
    thread.start()
    thread.join()
    time.sleep(0.5)  # the signal, were it sent, has been delivered
    try:
        assert started[0].alive
    finally:
        started[0].popen.kill()
        started[0].popen.wait()
