"""The test helpers' processes (tests/helpers/envtest.py's ``Process``)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.envtest import Process, free_port


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


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux's ephemeral port range")
def test_a_free_port_is_one_no_outgoing_connection_can_take() -> None:
    """A port the kernel handed out as free is one it also hands to outgoing connections: a hollow
    kubelet's listener on one failed with "bind: address already in use" while fifty others were
    connecting to the API server (bench/storm.py). free_port() picks below the ephemeral range, a
    different port each call, free on every address."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 < port < low for port in ports)
    with socket.socket() as s:
        s.bind(("0.0.0.0", ports[-1]))
