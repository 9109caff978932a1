"""The Ray executor on a two-node cluster (Ray's own multi-node test cluster on this machine): actors spread
over the nodes, and a node removed mid-round has its tasks re-run on the survivor with the same seeds."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from fedsim.executor import RayExecutor  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/executor: fault_clients, executor_runs
import fault_clients  # noqa: E402
from executor_runs import ROUNDS, run, serial_reference  # noqa: E402

cloudpickle.register_pickle_by_value(fault_clients)


@pytest.fixture()
def two_nodes():  # type: ignore[no-untyped-def]
    """A head node and a second node with one CPU each, so that two one-CPU actors land one per node."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():  # the suite's local Ray (tests/conftest.py); the next test that needs it starts it again
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    _unadvertise(cluster)
    try:
        second = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, second
    finally:
        ray.shutdown()
        cluster.shutdown()


def _unadvertise(cluster: Cluster) -> None:
    """Cluster() writes its address to /tmp/ray/ray_current_cluster, where any ``ray.init()`` on the machine without
    an address (another test run's, a user's) would find and join it: take it back at once (only if it is ours)."""
    from ray._common.utils import get_ray_address_file  # Ray's own name for that file (private)

    advertised = Path(get_ray_address_file(None))
    if advertised.exists() and advertised.read_text().strip() == cluster.address:
        advertised.unlink()


def _remove_when_marked(cluster: Cluster, node, marker: Path, removed: list[float]) -> None:  # type: ignore[no-untyped-def]
    """Remove ``node`` as soon as a client on it writes ``marker`` (it is then in the middle of round 2)."""
    deadline = time.monotonic() + 240
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if marker.exists():
        cluster.remove_node(node)
        removed.append(time.monotonic())


@pytest.mark.slow
def test_node_lost_mid_round_reruns_its_tasks_on_the_survivor(two_nodes, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    cluster, second = two_nodes
    marker, nodes_log, removed = tmp_path / "marked", tmp_path / "nodes.log", []
    remover = threading.Thread(target=_remove_when_marked, args=(cluster, second, marker, removed), daemon=True)
    remover.start()
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        result = run(
            RayExecutor(workers=2),
            fault_clients.NodeLossClient,
            victim_node=second.node_id,
            marker=str(marker),
            nodes_log=str(nodes_log),
        )
    remover.join(5)
    assert removed, "no client of round 2 ran on the second node"
    rows = [line.split() for line in nodes_log.read_text().splitlines()]
    assert {node for round_num, _, node in rows if round_num == "1"} == {cluster.head_node.node_id, second.node_id}, (
        "round 1 should use both nodes"
    )
    victim = int(marker.read_text())
    assert [node for round_num, cid, node in rows if round_num == "2" and int(cid) == victim][
        -1
    ] == cluster.head_node.node_id, "the lost node's client is re-run on the survivor"
    assert {node for round_num, _, node in rows if int(round_num) > 2} == {cluster.head_node.node_id}
    assert len(result.history) == ROUNDS
    assert re.search(rf"round 2 client {victim}: Ray worker r\d was lost with its node", caplog.text)
    assert torch.equal(result.params, serial_reference())
