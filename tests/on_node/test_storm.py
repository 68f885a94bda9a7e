"""A small storm of Volcano's Pods through the webhook on hollow nodes, with a webhook Pod deleted in
the middle (issue #40's CI test; bench/storm.py runs the large one, docs/benchmarks.md "A storm on
hollow nodes").

On the one-node cluster of tests/on_node/conftest.py, with the product installed by its chart (two
webhook replicas, the chart's PodDisruptionBudget): :data:`HOLLOW` hollow nodes (tests/helpers/hollow.py,
kubemark at the lowest CPU priority) take the storm's Pods; :data:`JOBS` Volcano Jobs of 8 Pods each
are submitted at :data:`RATE` a second with the example jobs' plugin sets (tests/helpers/storm.py); 2 s in,
the oldest webhook Pod is deleted. Checked: no Pod refused by our webhook (the API server's
rejection count for it), every Pod of every job started on a hollow node (Running; the Pods
waitfor holds, in their init container, which a hollow node never ends), every Pod wired exactly
as the chain of ``volcano-webhook mutate --cluster`` says (the command itself on one job of each
plugin set), Volcano's svc objects and ours present, and the whole test (hollow nodes, install,
storm, clean-up) within :data:`LIMIT` seconds.

Skips without kubemark (``KUBEMARK``), saying so, and as the conftest says without the node's parts.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers.helm import CHART
from tests.helpers.hollow import HollowNodes, find_kubemark, kubemark_missing
from tests.helpers.storm import Fault, Storm, delete_webhook_pod, empty_namespace
from tests.on_node.conftest import Cluster, Figures, figures_fixture, install, uninstall

HOLLOW = 4
JOBS = 50
RATE = 10.0
LIMIT = 180.0

pytestmark = pytest.mark.skipif(kubemark_missing() is not None, reason=kubemark_missing() or "")

figures = figures_fixture("node-storm", "A storm on hollow nodes (CI)")


def webhook_errors(cluster: Cluster, most: int = 5) -> list[str]:
    """The reasons Volcano's controller was given for Pods our webhook refused, each once (the API
    server's rejection count says how many, not why)."""
    text = cluster.volcano_processes["vc-controller-manager"].log_path.read_text(errors="replace")
    found = re.findall(r'failed calling webhook \\?"[a-z.]*volcano-job-webhook\.io\\?": (.{0,200})', text)
    return list(dict.fromkeys(re.sub(r"\b[a-z0-9-]+-[a-z0-9]{5}\b|\d+\.\d+\.\d+\.\d+:\d+", "…", r) for r in found))[:most]


def test_storm_on_hollow_nodes_with_a_webhook_pod_deleted(cluster: Cluster, figures: Figures, tmp_path: Path) -> None:
    begun = time.monotonic()
    binary = find_kubemark()
    assert binary is not None
    hollow = HollowNodes(binary, cluster.node.kubeconfig(), tmp_path / "hollow", HOLLOW)
    try:
        hollow.start(cluster.admin)
        figures["hollow_nodes_ready_s"] = time.monotonic() - begun
        install(cluster, CHART)
        time.sleep(1.0)  # a new registration takes about a second to take effect
        namespace = cluster.namespace("storm-")
        storm = Storm(cluster.node.envtest, namespace, JOBS, RATE, product=True, cgroup_root=cluster.node.footprint.cgroup if cluster.node.footprint else "",
                      timeout=90.0, check_all=True, workdir=tmp_path,
                      faults=[Fault("a webhook Pod deleted", 2.0, lambda: delete_webhook_pod(cluster.admin))])
        try:
            result = storm.run()
        finally:
            figures["clean_up_s"] = empty_namespace(cluster.admin, namespace)
            uninstall(cluster)
    finally:
        hollow.stop(cluster.admin)
    f = result.figures
    for key, value in f.items():
        figures[key] = value
    figures["events"] = "; ".join(result.events)
    figures["test_s"] = time.monotonic() - begun
    assert not hollow.leftovers(), hollow.leftovers()
    assert not result.problems, "\n".join(result.problems) + "\n" + json.dumps(f, indent=1, default=str)
    assert any("deleted" in e for e in result.events), result.events
    assert f["refused_by_ours"] == 0, (f["refusals_by_webhook_and_type"], webhook_errors(cluster))
    assert f["pods_running"] == f["pods_on_hollow_nodes"] == f["pods_expected"] == JOBS * 8
    assert f["wiring_checked"] == JOBS * 8 and f["wiring_mismatched"] == 0
    assert f["side_objects_missing"] == 0
    assert figures.values["test_s"] < LIMIT, f"{figures.values['test_s']:.0f} s"
